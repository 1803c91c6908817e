"""One prompt of a completion or chat request: its token ids checked against the context, its sampling checked,
its job on the batching scheduler (`serve/batching.py`), and the events the job sends back to the event loop.

A `Generation` is built on a worker thread (tokenizing and compiling a grammar take time in the request's size), and
a text far longer than the context is refused after tokenizing only its head (`tokenize.encode_head`): a megabyte
prompt costs what a prompt of the context's length costs.
"""

from __future__ import annotations

import asyncio
import re
import time

from attnkit.errors import AttnkitError, InputError
from attnkit.generate.pipeline import Pipeline, TextTracker
from attnkit.generate.sampling import SamplingError, check_min_new_tokens, check_sampling
from attnkit.serve.batching import GenerationJob
from attnkit.serve.errors import APIError
from attnkit.serve.logprobs import ChoiceScores, Scored
from attnkit.serve.schemas import Sampling
from attnkit.serve.settings import ServeSettings
from attnkit.serve.structured import Structured
from attnkit.tokenize import HEAD_CHARS_PER_TOKEN, Tokenizer, encode_head

TOKEN_ID = re.compile(r"[0-9]+")  # a logit_bias key
TOO_LONG = "context_length_exceeded"  # OpenAI's error code for a request the context cannot hold, which clients read


class Generation:
    """One prompt of a request: its job on the scheduler and the events it sends back to the event loop."""

    def __init__(self, pipeline: Pipeline, prompt: str | list[int], body: Sampling, index: int, *,
                 loop: asyncio.AbstractEventLoop, stops: tuple[str, ...], max_tokens: int | None,
                 limit_field: str = "max_tokens", settings: ServeSettings, chat: bool,
                 end_ids: frozenset[int] = frozenset(), logprobs: int | None = None, echo: bool = False,
                 structured: Structured | None = None) -> None:
        """loop: the event loop the events go to; limit_field: the field max_tokens came from (a chat's
        max_completion_tokens), named where it is refused; end_ids: tokens that end a choice as EOS does (a chat
        template's end of turn, `ChatTemplate.turn_end_ids`; not with ignore_eos); logprobs: the alternatives
        reported per token (None: no log-probabilities); echo: the prompt's text comes before each choice's;
        structured: the grammar each choice is held to, and how its reply is read. Raises APIError 400 naming the
        field of a prompt or value refused."""
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.index = index
        context = pipeline.config.max_seq_len
        ids = _prompt_ids(pipeline, prompt, index, context, param="messages" if chat else "prompt")
        if len(ids) >= context:
            raise APIError(400, f"the prompt has {len(ids)} tokens; this model's context holds {context}, so the "
                           "prompt must be shorter to leave room for new tokens",
                           param="messages" if chat else "prompt", code=TOO_LONG)
        room = min(settings.max_tokens, context - len(ids))
        if max_tokens is None:
            max_tokens = room
        if max_tokens > room:
            raise APIError(400, f"{limit_field}={max_tokens} is more than this request may generate: at most {room} "
                           f"(the server's limit is {settings.max_tokens}; the prompt has {len(ids)} tokens of the "
                           f"context's {context})", param=limit_field,
                           code=TOO_LONG if room < settings.max_tokens else None)
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
        if "" in stop:
            raise APIError(400, "a stop string is empty; give non-empty stop strings", param="stop")
        try:
            sampling, seed = check_sampling(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                                            logit_bias=_logit_bias(body.logit_bias),
                                            vocab_size=pipeline.config.vocab_size, seed=body.seed,
                                            presence_penalty=body.presence_penalty or 0.0,
                                            frequency_penalty=body.frequency_penalty or 0.0,
                                            repetition_penalty=body.repetition_penalty, min_p=body.min_p)
        except SamplingError as error:
            raise APIError(400, str(error), param=error.field) from None
        stop_ids = _stop_ids(pipeline, body, end_ids)
        try:
            check_min_new_tokens(body.min_tokens, max_tokens, names=("min_tokens", limit_field))
        except InputError as error:
            raise APIError(400, str(error), param="min_tokens") from None
        self.prompt_ids = ids
        self.prompt_tokens = len(ids)
        self.choice_tokens = [0] * body.n  # the tokens each choice has made (`completion_tokens`: all of them)
        self.echo = "" if not echo else prompt if isinstance(prompt, str) else pipeline.tokenizer.decode(ids)
        self.prompt_scores: list[Scored] = []  # the echoed prompt's tokens, scored (echo with logprobs)
        self.scores = [ChoiceScores(pipeline.tokenizer) for _ in range(body.n)] if logprobs is not None else None
        self.streamed = [0] * body.n  # characters of each choice's text sent so far
        self.structured = structured
        streamed = body.stream and not (structured and structured.withheld)  # a tool call comes whole at the end
        self.tracker = TextTracker(pipeline.tokenizer, body.n, [*stop, *stops], self._text if streamed else None)
        self.job = GenerationJob(
            prompt=ids, max_new_tokens=max_tokens, sampling=sampling, on_token=self._token, on_finish=self._finish,
            n=body.n, seed=seed, stop_ids=stop_ids, min_tokens=body.min_tokens,
            deadline=time.monotonic() + settings.timeout, top_logprobs=logprobs,
            on_logprobs=self._scored if logprobs is not None else None,
            grammar=structured.mask(pipeline.tokenizer, body.n) if structured else None,
            owner=body)  # the request: its prompts take turns with other requests' (`serve/waiting.py`)

    @property
    def completion_tokens(self) -> int:
        """The tokens every choice has made together (the usage's completion_tokens)."""
        return sum(self.choice_tokens)

    # on the scheduler's thread
    def _scored(self, choice: int, token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        self.scores[choice].add(token, logprob, top)

    def _token(self, choice: int, token: int) -> bool:
        self.choice_tokens[choice] += 1
        return self.tracker.push(choice, token)

    def _text(self, choice: int, piece: str) -> None:
        self.streamed[choice] += len(piece)
        scored = self.scores[choice].settled(self.streamed[choice]) if self.scores is not None else None
        self._send(("text", choice, piece, scored, self.choice_tokens[choice]))  # its tokens up to this piece

    def _finish(self, reasons: list[str]) -> None:
        texts = self.tracker.finish()
        timed_out = time.monotonic() > self.job.deadline
        scored = None if self.scores is None else [
            scores.settled(len(text), final=True) for scores, text in zip(self.scores, texts, strict=True)]
        self._send(("finish", texts, reasons, timed_out, scored))

    def _send(self, event: tuple) -> None:
        """Pass `event` to the event loop; dropped once the loop has closed (the server has stopped: nobody reads)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)




def refuse_long_text(tokenizer: Tokenizer, text: str, context: int, *, what: str, param: str) -> None:
    """400 for a text whose head alone holds more tokens than the `context`, found without tokenizing the rest
    (`tokenize.encode_head`); `what` names the text in the message, `param` the field. A shorter text is left to be
    tokenized whole once, by the caller."""
    if len(text) > HEAD_CHARS_PER_TOKEN * context and not encode_head(tokenizer, text, context)[1]:
        raise APIError(400, f"{what} {len(text):,} characters, more tokens than this model's context holds "
                       f"({context}; the first {HEAD_CHARS_PER_TOKEN * context:,} characters alone fill it): send "
                       f"shorter {param}", param=param, code=TOO_LONG)


def _prompt_ids(pipeline: Pipeline, prompt: str | list[int], index: int, context: int, *, param: str) -> list[int]:
    """A prompt's token ids: a text's as `Pipeline.generate` encodes it (refused first by `refuse_long_text` where
    its head alone fills the context), or the ids given (a chat's, `param` "messages", as its template tokenized
    them); 400 for an id beyond the vocabulary."""
    if isinstance(prompt, str):
        try:
            refuse_long_text(pipeline.tokenizer, prompt, context, what="the prompt holds", param=param)
            return pipeline.prompt_ids(prompt, index=index)
        except AttnkitError as error:
            raise APIError(400, str(error), param=param) from None
    vocab = pipeline.config.vocab_size
    beyond = [token for token in prompt if token >= vocab]
    if beyond:
        where = f"prompt {index}" if param == "prompt" else param
        raise APIError(400, f"{where}: token id {beyond[0]} is beyond the vocabulary of {vocab} tokens; give ids "
                       f"from 0 to {vocab - 1}", param=param)
    return list(prompt)


def _stop_ids(pipeline: Pipeline, body: Sampling, end_ids: frozenset[int]) -> frozenset[int]:
    """The tokens that end a choice: the model's end tokens and `end_ids` (unless `ignore_eos`: EOS and the others
    its config names, `Pipeline.end_ids`; a chat template's end of turn) and `stop_token_ids`; 400 for one beyond the
    vocabulary."""
    vocab = pipeline.config.vocab_size
    stop_ids = set(body.stop_token_ids or ())
    beyond = sorted(token for token in stop_ids if token >= vocab)
    if beyond:
        raise APIError(400, f"stop_token_ids: token id {beyond[0]} is beyond the vocabulary of {vocab} tokens; give "
                       f"ids from 0 to {vocab - 1}", param="stop_token_ids")
    if not body.ignore_eos:
        stop_ids |= pipeline.end_ids | end_ids
    return frozenset(stop_ids)


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's `logit_bias` ({"token id": bias}) with integer keys; 400 for a key that is no token id."""
    if not bias:
        return None
    bad = [key for key in bias if not TOKEN_ID.fullmatch(key)]
    if bad:
        raise APIError(400, f"logit_bias: the key {bad[0]!r} is no token id; give token ids as decimal strings, e.g. "
                       '{"15": -100}', param="logit_bias")
    return {int(key): value for key, value in bias.items()}
