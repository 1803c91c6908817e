"""Beam search: keep the `beam_size` most likely partial outputs of each input (a translation's source, a prompt).

    step t: every live beam b proposes every token v:  score(b, v) = score(b) + log p(v | beam b)
            of the K * V candidates keep the best (1 + E) K (E end tokens, at least 2K);  those ending in an end
            token (among the first K) are finished hypotheses, the best K others are the live beams of step t + 1

Every beam is one row of the decoder's batch (B * K rows); when beams are chosen, the KV cache's rows follow
them (`KVCache.reorder`). One loop (`search`) serves both kinds of model; what differs is how a step's logits are
computed (`Step`):
    beam_search     an encoder-decoder: the encoder runs once, and the cross-attention's keys and values are
                    computed on the first step and reordered with the rest; every target starts with BOS
    beam_generate   a decoder-only model: the left-padded prompts are prefilled once, B rows, and the cache's rows
                    repeated K times; the scores count the new tokens only (the prompt's log-probabilities are
                    left out, as transformers' beam search leaves them out)

Beam sampling (`search`'s `sample`: transformers' num_beams > 1 with do_sample=True) warps each beam's
log-probabilities by temperature, top-k, top-p and min-p, and draws the (1 + E) K candidates from the softmax of
their scores (`_draw_candidates`) where beam search keeps the best.

A finished hypothesis of n new tokens (EOS included) scores  sum log p / n ** length_penalty  (Wu et al. 2016
use a similar normalisation): 0 compares raw log-probabilities and favours short outputs, 1 compares per-token
averages. A source is done when it has K finished hypotheses and either `early_stopping` is set or its best live
beam, normalised at the current length, no longer beats the worst of them (the rule of Hugging Face's
`BeamSearchScorer`); otherwise the search ends at `max_length`, where the first K candidates of that last step
are all finished hypotheses, those ending in EOS and the others alike (as in transformers' beam search).
`num_return_sequences` n <= K returns a source's n best finished hypotheses, best first (transformers' setting).
A decoder-only model's hypothesis is divided by its new tokens, as transformers' BeamSearchScorer divides by the
generated length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from attnkit.errors import InputError
from attnkit.generate.decoder import EagerDecoding, check_context, check_prompts, left_pad
from attnkit.generate.sampling import Repeats, SamplingConfig, held_back_ids, hold_back, warp
from attnkit.generate.seq2seq import check_max_length, decode_step, encode_sources, greedy_translate
from attnkit.layers.embedding import inputs_checked
from attnkit.run_settings import check_beams_fit_context, check_search
from attnkit.tasks.common import broken_outputs
from attnkit.tasks.translate import default_max_length

# Step(rows, tokens): keep the batch rows `rows` (B*K,) of the cache, feed each its token (B*K,); the next logits
# (B*K, V)
Step = Callable[[Tensor, Tensor], Tensor]


@dataclass
class Hypotheses:
    """The best `size` finished hypotheses of one input (a source, a prompt), as (score, tokens) pairs."""

    size: int
    length_penalty: float
    items: list[tuple[float, list[int]]] = field(default_factory=list)

    def add(self, sum_logprobs: float, tokens: list[int], *, ended: bool) -> None:
        """tokens: the new tokens (a target without BOS), without the stop token; `ended`: whether a stop token
        ended it (which its length counts)."""
        self.items.append((sum_logprobs / self.normaliser(len(tokens) + int(ended)), tokens))
        self.items.sort(key=lambda item: item[0], reverse=True)
        del self.items[self.size:]

    def normaliser(self, length: int) -> float:
        return float(length) ** self.length_penalty

    def is_done(self, best_live_sum: float, length: int, early_stopping: bool) -> bool:
        if len(self.items) < self.size:
            return False
        return early_stopping or best_live_sum / self.normaliser(length) <= self.items[-1][0]

    def best(self, n: int = 1) -> list[list[int]]:
        """The n best hypotheses' tokens, best first."""
        return [tokens for _, tokens in self.items[:n]]


@torch.inference_mode()
def translate_ids(
    model: nn.Module,
    sources: Sequence[Sequence[int]],
    *,
    bos_id: int,
    eos_id: int,
    max_length: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    pad_id: int = 0,
    num_return_sequences: int = 1,
    writable: int | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
) -> list[list[int]]:
    """Each source's target tokens (without BOS and EOS): greedy for `beam_size=1`, else `beam_search`
    (`num_return_sequences` per source, source by source). `writable`: the target tokenizer's size, where the
    model's vocabulary is padded past it (the ids from it on are never chosen); `repetition_penalty`,
    `no_repeat_ngram_size`: over each target so far, BOS included, as transformers' generate applies them."""
    repeats = dict(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
    if beam_size == 1:
        check_search(beam_size, length_penalty, num_return_sequences=num_return_sequences)
        return greedy_translate(model, sources, bos_id=bos_id, eos_id=eos_id, max_length=max_length, pad_id=pad_id,
                                writable=writable, **repeats)
    return beam_search(model, sources, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, max_length=max_length,
                       length_penalty=length_penalty, early_stopping=early_stopping, pad_id=pad_id,
                       num_return_sequences=num_return_sequences, writable=writable, **repeats)


def translate_batched(
    model: nn.Module, sources: Sequence[Sequence[int] | None], *, bos_id: int, eos_id: int, pad_id: int,
    context_len: int, beam_size: int = 1, length_penalty: float = 1.0, early_stopping: bool = True,
    max_length: int | None = None, batch_size: int = 32, progress: bool = False, num_return_sequences: int = 1,
    writable: int | None = None, repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
) -> list[list[int]]:
    """Each source's target tokens (`translate_ids`; `num_return_sequences` per source, source by source), the
    sources sorted by length and decoded `batch_size` at a time; a batch's `max_length`, unless given, is twice its
    longest source plus 10, within `context_len` (the model's max_seq_len: `default_max_length`). A source of None
    (a blank text) gets no tokens; `writable`, `repetition_penalty`, `no_repeat_ngram_size`: as `translate_ids`
    takes them. The one decoding of translations:
    `Pipeline.translate` and the BLEU of training's evaluation both call it, so equal sources and batch sizes give
    equal translations."""
    n = num_return_sequences
    outputs: list[list[list[int]]] = [[[] for _ in range(n)] for _ in sources]  # each source's n results
    order = sorted((i for i, s in enumerate(sources) if s is not None), key=lambda i: len(sources[i]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc="translate", unit="batch", disable=not progress):
        chunk = [sources[i] for i in batch]
        length = max_length or default_max_length(max(map(len, chunk)), context_len)
        results = translate_ids(model, chunk, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, max_length=length,
                                length_penalty=length_penalty, early_stopping=early_stopping, pad_id=pad_id,
                                num_return_sequences=n, writable=writable, repetition_penalty=repetition_penalty,
                                no_repeat_ngram_size=no_repeat_ngram_size)
        for place, index in enumerate(batch):
            outputs[index] = results[place * n:(place + 1) * n]
    return [result for results in outputs for result in results]


@torch.inference_mode()
def beam_search(
    model: nn.Module,
    sources: Sequence[Sequence[int]],
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int,
    max_length: int,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    pad_id: int = 0,
    num_return_sequences: int = 1,
    writable: int | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
) -> list[list[int]]:
    """The best hypothesis of each source (target tokens without BOS and EOS), or its `num_return_sequences` best,
    best first, source by source; see the module docstring. `writable`: the target tokenizer's size, where the
    model's vocabulary is padded past it (the ids from it on are never proposed). `repetition_penalty` and
    `no_repeat_ngram_size` act on each beam's log-probabilities over its target, BOS included (`Repeats`), as
    transformers' beam search applies them to an encoder-decoder's decoder input. Raises InputError where a source
    ends with fewer finished hypotheses than `num_return_sequences` (which would shift the later sources' results);
    SamplingError for a bad repetition_penalty or no_repeat_ngram_size."""
    check_max_length(max_length)
    SamplingConfig(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)  # checks them
    check_search(beam_size, length_penalty, early_stopping=early_stopping, num_return_sequences=num_return_sequences)
    rows = len(sources) * beam_size
    source = encode_sources(model, sources, pad_id=pad_id).repeat(beam_size)
    cache = model.allocate_cache(rows, max_length)
    first = torch.full((rows,), bos_id, dtype=torch.long, device=source.memory.device)  # (B*K,)

    def step(kept: Tensor, tokens: Tensor) -> Tensor:
        cache.reorder(kept)
        return decode_step(model, tokens, source, cache)

    logits = decode_step(model, first, source, cache)  # (B*K, V)
    repeats = Repeats.of([[bos_id]] * len(sources), k=beam_size, penalty=repetition_penalty, n=no_repeat_ngram_size,
                         vocab_size=logits.shape[-1], device=logits.device)
    return search(model, logits, step, batch=len(sources), beam_size=beam_size, stop_ids=[eos_id],
                  max_length=max_length, length_penalty=length_penalty, early_stopping=early_stopping,
                  num_return_sequences=num_return_sequences, writable=writable, process=repeats)


@torch.inference_mode()
def beam_generate(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    context_len: int,
    num_beams: int,
    length_penalty: float = 1.0,
    early_stopping: bool = False,
    num_return_sequences: int = 1,
    pad_id: int = 0,
    stop_ids: Collection[int] = (),
    writable: int | None = None,
    min_new_tokens: int = 0,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    decoding: EagerDecoding | None = None,
    sample: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Beam search over each prompt's continuation with a decoder-only model (`DecoderLM`): each prompt's
    `num_return_sequences` best continuations (new tokens, without the stop token that ended one), best first,
    prompt by prompt, as transformers' `generate(num_beams=K, do_sample=False)` finds them. A hypothesis ends at a
    token of `stop_ids` (transformers' list of eos_token_id) or at `max_new_tokens`; the stop tokens are never
    proposed among the first `min_new_tokens`. `early_stopping` False by default, as transformers' GenerationConfig.
    `repetition_penalty` and `no_repeat_ngram_size` act on each beam's prompt and tokens (`Repeats`).

    The search keeps each hypothesis' whole text in the cache, so the longest prompt and `max_new_tokens` must fit
    the model's context (`context_len`): the window does not slide past it. `decoding`: an EagerDecoding of `model`
    built once by the caller (a Pipeline keeps one); None: one built here. `sample`: beam sampling (its temperature,
    top_k, top_p and min_p; transformers' do_sample=True), drawn from `generator` (`search`). Raises InputError for
    bad prompts (`check_prompts`), bad search settings (`check_search`), prompts and new tokens beyond the context, or
    a decoding that is not an EagerDecoding of `model` (a compiled step's fixed buffers cannot follow the beams'
    rows);
    SamplingError for a bad repetition_penalty or no_repeat_ngram_size.
    """
    check_prompts(prompts, max_new_tokens=max_new_tokens, context_len=context_len, min_new_tokens=min_new_tokens)
    SamplingConfig(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)  # checks them
    check_search(num_beams, length_penalty, early_stopping=early_stopping,
                 num_return_sequences=num_return_sequences, beam="num_beams", what="prompt")
    width = max(map(len, prompts))
    check_beams_fit_context(width, max_new_tokens, context_len)
    if max_new_tokens == 0:
        return [[] for _ in prompts for _ in range(num_return_sequences)]
    if decoding is None:
        decoding = EagerDecoding(model)
    elif type(decoding) is not EagerDecoding or decoding.model is not model:  # a compiled step's buffers are fixed
        raise InputError("beam search decodes eagerly: give decoding=EagerDecoding(model) of the model it searches "
                         "with, or none")
    check_context(decoding, context_len)  # the steps' positions go unread, as decode_n_tokens' do
    window = left_pad(prompts, pad_id=pad_id, device=next(model.parameters()).device)  # (B, T)
    cache = decoding.allocate(len(prompts), width + max_new_tokens - 1, context_len)
    logits = decoding.prefill(window, cache)  # (B, V): every beam of a prompt starts from its one prefill
    repeated = torch.arange(len(prompts), device=logits.device).repeat_interleave(num_beams)  # (B*K,)
    cache.reorder(repeated)
    window = window.rows(repeated)

    def step(kept: Tensor, tokens: Tensor) -> Tensor:
        nonlocal window
        cache.reorder(kept)
        window = window.rows(kept).append(tokens)
        with inputs_checked():  # a token of this model's vocabulary, at a position the context holds
            return decoding.step(window, cache)

    repeats = Repeats.of(prompts, k=num_beams, penalty=repetition_penalty, n=no_repeat_ngram_size,
                         vocab_size=logits.shape[-1], device=logits.device)
    return search(model, logits[repeated], step, batch=len(prompts), beam_size=num_beams, stop_ids=stop_ids,
                  max_length=max_new_tokens, length_penalty=length_penalty, early_stopping=early_stopping,
                  num_return_sequences=num_return_sequences, writable=writable, min_length=min_new_tokens,
                  what="prompt", process=repeats, sample=sample, generator=generator)


def search(
    model: nn.Module,
    logits: Tensor,
    step: Step,
    *,
    batch: int,
    beam_size: int,
    stop_ids: Collection[int],
    max_length: int,
    length_penalty: float,
    early_stopping: bool,
    num_return_sequences: int,
    writable: int | None = None,
    min_length: int = 0,
    what: str = "source",
    process: Repeats | None = None,
    sample: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """The search loop (module docstring) from the first step's `logits` (B*K, V), beam k of input b in row
    b * K + k; `step` computes each later step's. A hypothesis ends at a token of `stop_ids` (none: only at
    `max_length`); the stop tokens are never proposed among the first `min_length` tokens (transformers'
    min_new_tokens); `process` changes each step's log-probabilities given the beams' texts, and follows the beams
    as they are chosen. `sample`: beam sampling (transformers' num_beams > 1 with do_sample=True): the
    log-probabilities warped by its temperature, top-k, top-p and min-p (`sampling.warp`, keeping one more token
    than the stop tokens), and each step's candidates drawn from the softmax of their summed scores without
    replacement (from `generator`), then ranked by score, where beam search takes the best. Returns each input's
    `num_return_sequences` best outputs (without the stop token), best first. Raises InputError where an input ends
    with fewer finished hypotheses than `num_return_sequences` (which would shift the later inputs' results), or
    where beam sampling's filters leave fewer candidates than a step draws.
    `what`: what an input is, in the messages ("source", "prompt"). Its callers have checked the settings
    (`beam_generate`'s `check_prompts` checks `min_length`)."""
    k, device = beam_size, logits.device
    vocab = logits.shape[-1]
    # (U,), (U + E,): a padded vocabulary's ids past the tokenizer's; also the stop tokens, while outputs are short
    unwritable, early = held_back_ids(vocab, stop_ids=stop_ids, writable=writable, device=device)
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)  # (E,)
    keep = max(2, 1 + len(stops)) * k  # enough candidates that K remain live when the first K all end
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live beam to start with; the others join once it has proposed tokens
    written = torch.zeros((batch * k, 0), dtype=torch.long, device=device)  # (B*K, t): each beam's tokens so far
    finished = [Hypotheses(k, length_penalty) for _ in range(batch)]
    done = [False] * batch
    for length in range(1, max_length + 1):
        logprobs = logits.float().log_softmax(dim=-1)  # (B*K, V)
        # held back after the softmax, as transformers' beam search processes scores
        logprobs = hold_back(logprobs, early if length <= min_length else unwritable)
        if process is not None:
            logprobs = process(logprobs)
        if sample is not None:
            logprobs = warp(logprobs, sample, keep=1 + len(stops))
        candidates = (scores.view(-1, 1) + logprobs).view(batch, k * vocab)  # (B, K*V)
        if sample is None:
            top_scores, top_index = candidates.topk(min(keep, k * vocab), dim=-1)  # (B, keep), best first
        else:
            top_scores, top_index = _draw_candidates(candidates, min(keep, k * vocab), generator, what=what)
        top_beam, top_token = top_index // vocab, top_index % vocab
        at_limit = length == max_length
        next_beam, next_token, next_score = _choose_live(
            written, top_scores, top_beam, top_token, finished, done, k=k, stops=stops, model=model, at_limit=at_limit,
            what=what,
        )
        if at_limit:
            break
        for b in range(batch):
            if not done[b]:
                done[b] = finished[b].is_done(float(next_score[b, 0]), length, early_stopping)
        if all(done):
            break
        rows = (torch.arange(batch, device=device)[:, None] * k + next_beam).view(-1)  # (B*K,)
        written = torch.cat((written[rows], next_token.view(-1, 1)), dim=1)  # (B*K, t + 1)
        if process is not None:
            process.advance(rows, next_token.view(-1))
        scores = next_score
        logits = step(rows, next_token.view(-1))
    short = {b: len(hyps.items) for b, hyps in enumerate(finished) if len(hyps.items) < num_return_sequences}
    if short:  # fewer results than asked would move the later inputs' onto the wrong text
        raise InputError(f"{what}(s) {sorted(short)} ended with {sorted(set(short.values()))} finished hypotheses, "
                         f"fewer than num_return_sequences={num_return_sequences}: the search met fewer candidates "
                         f"of a finite score (a beam wider than the tokens it may write at max_length={max_length}, "
                         "or logits at -inf); ask for fewer sequences, or a longer max_length")
    return [tokens for hyps in finished for tokens in hyps.best(num_return_sequences)]


def _draw_candidates(candidates: Tensor, count: int, generator: torch.Generator | None, *,
                     what: str) -> tuple[Tensor, Tensor]:
    """Beam sampling's candidates: `count` drawn without replacement from softmax(candidates) (B, K*V), as
    transformers draws them, then sorted by score, best first -> scores and indices (B, count). Raises InputError
    where a row has fewer than `count` candidates of a finite score (filters narrower than the beams)."""
    probs = candidates.softmax(dim=-1)  # (B, K*V)
    short = (probs > 0).sum(dim=-1) < count  # (B,)
    if bool(short.any()):
        raise InputError(f"beam sampling draws {count} candidates a step, but top_k, top_p or min_p leave fewer for "
                         f"{what}(s) {short.nonzero()[:, 0].tolist()}: widen them (a larger top_k or top_p, a "
                         "smaller min_p) or give fewer beams")
    index = torch.multinomial(probs, count, generator=generator)  # (B, count)
    scores, order = candidates.gather(1, index).sort(dim=-1, descending=True)
    return scores, index.gather(1, order)


def _choose_live(
    written: Tensor,
    top_scores: Tensor,
    top_beam: Tensor,
    top_token: Tensor,
    finished: list[Hypotheses],
    done: list[bool],
    *,
    k: int,
    stops: Tensor,
    model: nn.Module,
    at_limit: bool = False,
    what: str = "source",
) -> tuple[Tensor, Tensor, Tensor]:
    """File the candidates ending in a stop token among each input's first K as finished; keep the best K others as
    live beams. `at_limit` (the step that reaches max_length): file each input's first K candidates, stopped or not,
    as finished.

    written: (B*K, t) each beam's tokens so far; top_*: (B, N) candidates, best first, N >= 2K. Returns the live
    beams' parent beam, token and score, each (B, K). Raises BrokenOutputs (`broken_outputs`) for a nan score:
    `model`'s logits were nan (topk ranks nan first).
    """
    is_stop = torch.isin(top_token, stops)  # (B, N)
    rows = zip(top_scores.tolist(), top_beam.tolist(), top_token.tolist(), is_stop.tolist(), strict=True)
    for b, (scores, parents, tokens, stopped) in enumerate(rows):
        if done[b]:
            continue
        if math.isnan(scores[0]):
            raise broken_outputs(f"the model's logits for {what} {b} are nan, no probability distribution: the "
                                 "model's weights or its input are broken", model)
        for rank in range(k):
            if (stopped[rank] or at_limit) and scores[rank] > float("-inf"):
                tokens_of = written[b * k + parents[rank]].tolist() + ([] if stopped[rank] else [tokens[rank]])
                finished[b].add(scores[rank], tokens_of, ended=stopped[rank])
    # stable sort puts the candidates that go on first, in their order
    order = is_stop.to(torch.int8).argsort(dim=-1, stable=True)[:, :k]  # (B, K)
    return top_beam.gather(1, order), top_token.gather(1, order), top_scores.gather(1, order)
