"""The answer to a completion or chat request of one or more prompts (`serve/generation.py`): whole, as one JSON
body, or streamed, as server-sent events ending with [DONE]; either ends the generation when the client goes away or
the server's timeout passes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from attnkit.errors import AttnkitError
from attnkit.serve.batching import Closed, GenerationJob
from attnkit.serve.errors import APIError
from attnkit.serve.generation import Generation
from attnkit.serve.logprobs import Scored, chat_logprobs, completion_logprobs


def failure(job: GenerationJob) -> APIError:
    """The error a failed job answers: 400 with the library's refusal (AttnkitError), 503 when the server shut down
    before its end (`Scheduler.close`), else 500 (the log says why)."""
    if isinstance(job.failure, AttnkitError):
        return APIError(400, f"generation refused this request: {job.failure}")
    if isinstance(job.failure, Closed):
        return APIError(503, str(job.failure))
    return APIError(500, "generation failed; the server's log says why")


class ClientGone(Exception):
    """The client closed its connection before the answer was complete."""


async def events_of(generations: list[Generation], request: Request, poll: float = 0.25
                    ) -> AsyncIterator[tuple[Generation, tuple]]:
    """The generations' events as they come, (generation, event), the prompts' interleaved as vLLM streams a request of
    several prompts, until each has sent its "finish". ClientGone once the client has gone away; a generation past its
    deadline gets a "finish" with every choice cancelled (both checked when no event came for `poll` seconds, whatever
    the scheduler does). Close it (`contextlib.aclosing`) to let go of the reads still waiting."""
    reading = {asyncio.ensure_future(g.events.get()): g for g in generations}
    try:
        while reading:
            done, _ = await asyncio.wait(reading, timeout=poll, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                if await request.is_disconnected():
                    raise ClientGone
                for read, generation in list(reading.items()):
                    if time.monotonic() > generation.job.deadline:
                        read.cancel()
                        del reading[read]
                        generation.job.cancel()
                        n = generation.job.n
                        yield generation, ("finish", [""] * n, ["cancelled"] * n, True, None)
            for read in sorted(done, key=lambda read: reading[read].index):  # a prompt's events in order
                generation = reading.pop(read)
                event = read.result()
                yield generation, event
                if event[0] != "finish":
                    reading[asyncio.ensure_future(generation.events.get())] = generation
    finally:
        for read in reading:
            read.cancel()


class Answer:
    """The response to a request of one or more prompts: whole (JSON) or streamed (server-sent events)."""

    def __init__(self, kind: str, model_id: str, generations: list[Generation], *, include_usage: bool,
                 tokenizer, timeout: float, continuous_usage: bool = False) -> None:
        """include_usage: a streamed answer ends with a chunk of the usage; continuous_usage: every chunk carries the
        usage so far of its one choice (vLLM's continuous_usage_stats: that choice's prompt and tokens, a chunk per
        choice); timeout: the server's, in seconds (for its 504)."""
        self.kind, self.model_id, self.generations = kind, model_id, generations
        self.include_usage, self.tokenizer, self.timeout = include_usage, tokenizer, timeout
        self.continuous_usage = continuous_usage
        self.counted: dict[tuple[int, int], int] = {}  # (prompt, choice) -> its tokens as of its last event read
        self.id = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _choice_index(self, generation: Generation, choice: int) -> int:
        return generation.index * generation.job.n + choice

    def usage(self) -> dict:
        """The request's usage: each prompt's tokens once (as OpenAI counts), every choice's tokens."""
        prompt = sum(g.prompt_tokens for g in self.generations)
        completion = sum(g.completion_tokens for g in self.generations)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def so_far(self, generation: Generation, choice: int) -> dict | None:
        """With continuous_usage_stats, the usage of one choice as vLLM counts it in each chunk: its prompt's tokens
        and its own tokens up to the events read (the chunks written; the scheduler may run ahead of the event loop);
        else None."""
        if not self.continuous_usage:
            return None
        completion = self.counted.get((generation.index, choice), 0)
        prompt = generation.prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _chunks(self, deltas: list[tuple[Generation, int, dict]]) -> list[str]:
        """Chunks of the choices' `deltas` ((generation, choice, delta)): one, or with continuous_usage_stats one per
        choice, each with its own usage so far."""
        if not self.continuous_usage:
            return [self._chunk([delta for _, _, delta in deltas])]
        return [self._chunk([delta], self.so_far(generation, choice)) for generation, choice, delta in deltas]

    def cancel(self) -> None:
        for generation in self.generations:
            generation.job.cancel()

    async def whole(self, request: Request) -> dict:
        """Wait for every prompt's end (cancelled when the client goes away); the OpenAI response body, its choices
        (their log-probabilities and tool calls) written on a worker thread."""
        ends = {}
        try:
            async with aclosing(events_of(self.generations, request)) as events:
                async for generation, event in events:
                    if event[0] != "finish":
                        continue
                    _, texts, reasons, timed_out, scored = event
                    error = self._error(generation, reasons, timed_out)
                    if error is not None:
                        raise error
                    ends[generation.index] = (generation, texts, reasons, scored)
        finally:
            self.cancel()  # anything still running (a client gone, an error) ends at the next step
        choices = await run_in_threadpool(lambda: [
            self._choice(generation, c, text, reason, scored and scored[c])
            for generation, texts, reasons, scored in (ends[g.index] for g in self.generations)
            for c, (text, reason) in enumerate(zip(texts, reasons, strict=True))])
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model_id,
                "choices": choices, "usage": self.usage()}

    def _error(self, generation: Generation, reasons: list[str], timed_out: bool) -> APIError | None:
        """The error a prompt's end answers: its job's failure, or 504 when the timeout cancelled it; else None."""
        if "error" in reasons:
            return failure(generation.job)
        if timed_out and "cancelled" in reasons:
            return APIError(504, f"the request took longer than the server's timeout ({self.timeout:g} s)")
        return None

    def _choice(self, generation: Generation, choice: int, text: str, reason: str, scored: list[Scored] | None
                ) -> dict:
        index = self._choice_index(generation, choice)
        if self.kind == "chat.completion":
            message, reason = self._message(generation, text, reason)
            return {"index": index, "message": message, "finish_reason": reason,
                    "logprobs": self._logprobs(generation, scored)}
        return {"index": index, "text": generation.echo + text, "finish_reason": reason,
                "logprobs": self._logprobs(generation, scored, echoed=True)}

    @staticmethod
    def _message(generation: Generation, text: str, reason: str) -> tuple[dict, str]:
        """A chat choice's message and finish reason: a tool call read out of its text (`serve/structured.py`)."""
        if generation.structured is None:
            return {"role": "assistant", "content": text}, reason
        return generation.structured.reply(text, reason)

    def _withheld(self, generation: Generation, texts: list[str], reasons: list[str]) -> tuple[str | None, list[str]]:
        """For a stream whose replies come whole at their end (tool calls): the chunk with each choice's message (a
        chunk per choice with continuous_usage_stats, `_chunks`; None for other streams), and the finish reasons it
        gives."""
        if generation.structured is None or not generation.structured.withheld:
            return None, reasons
        deltas, finished = [], []
        for choice, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
            message, reason = self._message(generation, text, reason)
            calls = [{"index": i, **call} for i, call in enumerate(message.get("tool_calls") or [])]
            delta = {"tool_calls": calls} if calls else {"content": message["content"]}
            deltas.append((generation, choice, {"index": self._choice_index(generation, choice), "delta": delta,
                                                "finish_reason": None, "logprobs": None}))
            finished.append(reason)
        return "".join(self._chunks(deltas)), finished

    def _logprobs(self, generation: Generation, scored: list[Scored] | None, *, echoed: bool = False) -> dict | None:
        """A choice's `logprobs` object for the tokens `scored` (None when none were asked for); completions' with the
        echoed prompt's tokens first when `echoed`."""
        if generation.scores is None:
            return None
        if self.kind == "chat.completion":
            return chat_logprobs(self.tokenizer, scored)
        entries = [*generation.prompt_scores, *scored] if echoed else scored
        offsets = [0] * len(generation.prompt_scores) if echoed else []
        offsets += [len(generation.echo)] * len(scored)
        return completion_logprobs(self.tokenizer, entries, offsets)

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        kind = "chat.completion.chunk" if self.kind == "chat.completion" else "text_completion"
        payload = {"id": self.id, "object": kind, "created": self.created, "model": self.model_id,
                   "choices": choices}
        if self.include_usage:  # null but in the last chunk (as OpenAI's stream has it), or a choice's usage so far
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n"

    def _delta(self, generation: Generation, choice: int, text: str | None, reason: str | None, *,
               first: bool = False, scored: list[Scored] | None = None) -> dict:
        index = self._choice_index(generation, choice)
        if self.kind == "chat.completion":
            logprobs = None if first else self._logprobs(generation, scored or [])
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            return {"index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
        logprobs = self._logprobs(generation, [] if first else scored or [], echoed=first)
        return {"index": index, "text": text or "", "finish_reason": reason, "logprobs": logprobs}

    def _opening(self) -> list[str]:
        """The chunks a stream opens with: a chat's role, or each echoed prompt with its tokens' log-probabilities
        (written on a worker thread: for 64 prompts of 90 tokens, 20 alternatives each, they held the event loop for
        half a second); none for other completions."""
        chat = self.kind == "chat.completion"
        if not chat and not any(g.echo for g in self.generations):
            return []
        return self._chunks([(g, c, self._delta(g, c, None if chat else g.echo, None, first=True))
                             for g in self.generations for c in range(g.job.n)])

    async def stream(self, request: Request) -> AsyncIterator[str]:
        """Server-sent events: a chunk per settled piece of text, a last chunk per choice with its finish reason,
        the usage when asked for, then [DONE]. A client that goes away cancels the generation. The status the stream
        ends with (an error's inside it, 499 for a client gone) is left in `request.state.status` for the log."""
        status = 200
        try:
            for chunk in await run_in_threadpool(self._opening):  # each echoed prompt's scores: tenths of a second
                yield chunk
            async with aclosing(events_of(self.generations, request)) as events:
                async for generation, event in events:
                    if event[0] == "text":
                        _, choice, piece, scored, self.counted[generation.index, choice] = event
                        yield self._chunk([self._delta(generation, choice, piece, None, scored=scored)],
                                          self.so_far(generation, choice))
                        continue
                    _, texts, reasons, timed_out, scored = event
                    for choice, tokens in enumerate(generation.choice_tokens):  # their whole counts: it has ended
                        self.counted[generation.index, choice] = tokens
                    whole, reasons = self._withheld(generation, texts, reasons)
                    if whole is not None and "error" not in reasons:
                        yield whole
                    error = self._error(generation, reasons, timed_out)
                    if error is not None:
                        status = error.status
                        yield f"data: {json.dumps(error.body())}\n\n"
                    for chunk in self._chunks([(generation, c, self._delta(generation, c, None, reason,
                                                                            scored=scored and scored[c]))
                                               for c, reason in enumerate(reasons)]):
                        yield chunk
            if self.include_usage:
                yield self._chunk([], self.usage())
            yield "data: [DONE]\n\n"
        except ClientGone:
            status = 499  # nginx's code for a client that closed its connection
        finally:
            request.state.status = status
            self.cancel()
