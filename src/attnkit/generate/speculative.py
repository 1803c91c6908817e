"""Speculative decoding (assisted generation): a small draft model proposes K tokens, the target model scores them all
in one forward pass over its KV cache, and the drafts the target agrees with are kept, plus one token of its own
(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding"; Chen et al. 2023).

    a round   draft    last -> d1 -> d2 -> ... -> dK          K small steps over the draft's cache (q1 ... qK)
              target   [last, d1, ..., dK]                    one forward over the target's cache  (p1 ... pK+1)
              keep     d1 ... dn, then t from p(n+1)          n: the drafts accepted, 0 to K
              rewind   both caches to the text so far; the next round feeds t

Greedy: d_i is kept while it is the target's own choice (its argmax), and t is the target's choice after the last
kept one: the text is the target's greedy text, token for token. Sampling: d_i ~ q_i is kept with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection, t ~ max(0, p_i - q_i) normalised; after K acceptances,
t ~ p(K+1). Every token is then distributed exactly as the target alone draws it (Leviathan et al., appendix A.1).
The logit bias, temperature, top-k, top-p and min-p shape p and q alike before the test, as transformers does.

A batch advances every row by the same count: one more than the fewest drafts an unfinished row kept. A row that
kept more takes its next token from its kept drafts, which the target accepted: every prefix of a speculative text
is a draw of the target's too, so each row's text stays exact and the caches stay one rectangle (prompts left-padded
as in `generate/decoder.py`). Rows drafted in vain lower the acceptance the statistics report, not the text; but
a row's draws follow the others' acceptances (how many uniforms and drafts it uses in a round depends on the fewest
drafts any row kept), so a seeded row's text depends on the rows beside it. `Pipeline.generate` therefore decodes
seeded sampled rows one at a time: that is what keeps its promise that a seeded prompt's text is the same alone or
batched; greedy and unseeded rows lose nothing by sharing a batch, and do.

The caches keep every position, sliding-window layers included (a rolling ring has overwritten the keys a rewind
needs; the mask hides what the window hides: `KVCache.rewind`), so the prompt and the new tokens fit both models'
contexts: the window of a long text does not slide as plain decoding's does.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.generate.decoder import TokenHook, Window, check_prompts, left_pad, logits_of_new, prefill
from attnkit.generate.sampling import (
    GREEDY,
    Groups,
    SamplingConfig,
    check_drawn,
    draw,
    held_back_ids,
    hold_back,
    process_logits,
    select_next_in_groups,
)
from attnkit.layers.kv_cache import KVCache, kv_bytes_per_position
from attnkit.machine import free_bytes, gib
from attnkit.run_settings import DRAFT_TOKENS, check_draft_fits_context, check_draft_tokens


@dataclass
class Speculation:
    """What a speculative generation did: `rounds` target forward passes, `drafts` the rows' drafts the target
    scored (one per unfinished row and round with K > 0: vLLM's num_drafts, so that 1 + accepted / drafts is its mean
    acceptance length), `drafted` tokens proposed by the draft (K per unfinished row and round), `accepted` of them
    the target accepted, `advanced` the tokens a row gained, summed over the rounds: a round's kept drafts plus one,
    as many in every row (`speculative_generate`), or the most any live row gained where each row keeps its own (the
    server, `serve/speculative.py`)."""

    draft_tokens: int
    rounds: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    advanced: int = 0

    @property
    def acceptance_rate(self) -> float:
        """The share of drafted tokens the target accepted (0 before any was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def describe(self) -> str:
        """One line for the log: acceptance, and new tokens per target forward pass."""
        per_pass = self.advanced / self.rounds if self.rounds else 0.0
        return (f"speculative decoding, {self.draft_tokens} draft tokens a round: {self.accepted} of {self.drafted} "
                f"drafted tokens accepted ({self.acceptance_rate:.1%}), {self.advanced} tokens a row in {self.rounds} "
                f"target passes ({per_pass:.2f} a pass)")


def accept_greedy(chosen: Tensor, drafted: Tensor) -> tuple[Tensor, Tensor]:
    """chosen (B, K + 1): the target's own choice at each drafted position and after the last; drafted (B, K).
    Returns the drafts kept (B,), 0 to K (while each equals the target's choice), and the token after them (B,)."""
    agree = (drafted == chosen[:, :-1]).long()  # (B, K)
    kept = agree.cumprod(dim=1).sum(dim=1)  # (B,)
    return kept, chosen.gather(1, kept[:, None])[:, 0]


def accept_sampled(p: Tensor, q: Tensor, drafted: Tensor, groups: Groups) -> tuple[Tensor, Tensor]:
    """Leviathan et al.'s rejection sampling. p (B, K + 1, V): the target's probabilities at each drafted position
    and after the last; q (B, K, V): the draft's, from which drafted (B, K) were drawn; each group of rows draws from
    its generator. Returns the drafts kept (B,), 0 to K, and the token after them (B,): from max(0, p - q)
    normalised where a draft was rejected, from p after all K (NO_TOKEN for a row of nan)."""
    batch, k, vocab = q.shape
    p_drafted = p[:, :-1].gather(-1, drafted[..., None])[..., 0]  # (B, K)
    q_drafted = q.gather(-1, drafted[..., None])[..., 0]  # (B, K): > 0, each was drawn from q
    uniform = torch.empty_like(q_drafted)  # (B, K)
    for part, (_, generator) in zip(uniform.split([rows for rows, _ in groups]), groups, strict=True):
        part.uniform_(generator=generator)
    kept = (uniform * q_drafted < p_drafted).long().cumprod(dim=1).sum(dim=1)  # u < p / q, without dividing by 0
    residual = (p - torch.cat((q, q.new_zeros(batch, 1, vocab)), dim=1)).clamp(min=0)  # (B, K + 1, V); p after all K
    rows = torch.arange(batch, device=p.device)
    after, target = residual[rows, kept], p[rows, kept]  # (B, V)
    total = after.sum(dim=-1, keepdim=True)  # (B, 1): 0 where p == q there (a rejection rounding made): draw from p
    after = torch.where(total > 0, after / total.clamp(min=torch.finfo(after.dtype).tiny), target)
    return kept, draw(after, groups)


def token_after_kept(keep: Tensor, kept: Tensor, after: Tensor, drafted: Tensor) -> Tensor:
    """Each row's token after the first keep[row] of its drafts, where a round keeps fewer drafts than the target
    accepted (kept[row]): the token after them (`after`) where the row kept no more, else its (keep + 1)-th draft,
    which the target accepted (`after` past the K-th). keep, kept, after (B,); drafted (B, K) -> (B,)."""
    next_draft = torch.cat((drafted, after[:, None]), dim=1).gather(1, keep[:, None])[:, 0]  # (B, K + 1) -> (B,)
    return torch.where(kept == keep, after, next_draft)


def advance_together(n: int, kept: Tensor, after: Tensor, drafted: Tensor) -> Tensor:
    """The round's tokens where every row advances by n + 1, n the fewest drafts an unfinished row kept (the module
    docstring): each row's first n drafts, then the token after them (`token_after_kept`). kept, after (B,); drafted
    (B, K) -> (B, n + 1)."""
    last = token_after_kept(torch.full_like(kept, n), kept, after, drafted)  # (B,)
    return torch.cat((drafted[:, :n], last[:, None]), dim=1)


class Shaper:
    """The logits processing that the target alone applies at its i-th new token (`decode_n_tokens`): the ids held
    back (a padded vocabulary's; the stop tokens while a row is short of `min_new_tokens`), then `process_logits`;
    each model's logits cut to the shared vocabulary `vocab` first."""

    def __init__(self, sampling: SamplingConfig, *, vocab: int, stop_ids: Collection[int], writable: int | None,
                 min_new_tokens: int, device: torch.device) -> None:
        self.sampling, self.vocab, self.min_new_tokens = sampling, vocab, min_new_tokens
        self.always, self.early = held_back_ids(vocab, stop_ids=stop_ids, writable=writable, device=device)

    def held(self, logits: Tensor, index: int) -> Tensor:
        """logits (B, V') of new token `index` -> (B, vocab), its held-back ids at -inf."""
        return hold_back(logits[:, :self.vocab], self.early if index < self.min_new_tokens else self.always)

    def probs(self, logits: Tensor, index: int) -> Tensor:
        """The distribution sampling draws new token `index` from: (B, V') -> (B, vocab)."""
        return process_logits(self.held(logits, index), self.sampling).softmax(dim=-1)

    def choose(self, logits: Tensor, index: int, groups: Groups) -> Tensor:
        """What the model alone would choose as new token `index` (greedy: its argmax): (B, V') -> ids (B,)."""
        return select_next_in_groups(self.held(logits, index), self.sampling, groups)


@torch.no_grad()
def speculative_generate(
    target: nn.Module,
    draft: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    context_len: int,
    draft_tokens: int = DRAFT_TOKENS,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | Sequence[torch.Generator | None] | None = None,
    pad_id: int = 0,
    stop_ids: Collection[int] = (),
    on_token: TokenHook | None = None,
    writable: int | None = None,
    min_new_tokens: int = 0,
) -> tuple[list[list[int]], Speculation]:
    """Continue each prompt by up to `max_new_tokens` tokens as `generate_tokens` does with `target` alone (greedy:
    the same tokens; sampled: the same distribution), with `draft` proposing `draft_tokens` tokens a round (see the
    module docstring). Both are DecoderLMs of one vocabulary (`writable`: the tokenizer's size, where a model's is
    padded past it); `context_len`: the smaller of their max_seq_len. Stops as `decode_n_tokens` does. Returns each
    row's new tokens and the Speculation. Rows seeded by a list of generators each draw from their own, but a row's
    draws still follow the batch's acceptances (the module docstring): to get a seeded row's text whatever the rows
    beside it, call this once per row, as `Pipeline.generate` does.
    Raises InputError for a bad `draft_tokens` (`check_draft_tokens`), what `check_prompts` refuses, a text that
    outgrows `context_len` (`check_draft_fits_context`), models whose vocabularies are smaller than the one they
    share, or caches and scores that cannot fit in the memory free (`check_speculation_fits`)."""
    check_draft_tokens(draft_tokens)
    check_prompts(prompts, max_new_tokens=max_new_tokens, context_len=context_len, min_new_tokens=min_new_tokens)
    check_draft_fits_context(max(len(p) for p in prompts), max_new_tokens, context_len)
    vocab = writable or target.lm_head.out_features
    sizes = {"target": target.lm_head.out_features, "draft": draft.lm_head.out_features}
    if min(sizes.values()) < vocab:
        raise InputError(f"the target's and the draft's vocabularies ({sizes['target']} and {sizes['draft']} ids) "
                         f"must both hold the {vocab} tokens they share: give a draft trained with the target's "
                         "tokenizer")
    stats = Speculation(draft_tokens)
    batch = len(prompts)
    new_tokens: list[list[int]] = [[] for _ in range(batch)]
    if max_new_tokens == 0:
        return new_tokens, stats
    device = next(target.parameters()).device
    groups = [(1, g) for g in generator] if isinstance(generator, Sequence) else [(batch, generator)]
    shaper = Shaper(sampling, vocab=vocab, stop_ids=stop_ids, writable=writable, min_new_tokens=min_new_tokens,
                    device=device)
    window = left_pad(prompts, pad_id=pad_id, device=device)
    needed = window.ids.shape[1] + max_new_tokens - 1  # the last token is chosen, never fed
    check_speculation_fits((target, draft), batch, needed, draft_tokens=draft_tokens, vocab=vocab, device=device)
    target_cache, draft_cache = (model.allocate_cache(batch, needed, rolling=False) for model in (target, draft))
    stop, finished = set(stop_ids), [False] * batch
    done = 0  # the new tokens of each row so far (see the module docstring)
    while not all(finished) and done < max_new_tokens:
        k = min(draft_tokens, max_new_tokens - done - 1)  # the round's last token is the target's own
        drafted, q = _draft(draft, window, draft_cache, k, done, shaper, groups)
        scored = logits_of_new(target, window.extend(drafted), target_cache, k + 1)  # (B, k + 1, V)
        if sampling.greedy:
            chosen = torch.stack([shaper.choose(scored[:, i], done + i, groups) for i in range(k + 1)], dim=1)
            kept, after = accept_greedy(chosen, drafted)
        else:
            p = torch.stack([shaper.probs(scored[:, i], done + i) for i in range(k + 1)], dim=1)  # (B, k + 1, V)
            kept, after = accept_sampled(p, q, drafted, groups)
        kept_by_row = kept.tolist()
        n = min(n for n, end in zip(kept_by_row, finished, strict=True) if not end)  # the drafts every row keeps
        tokens = advance_together(n, kept, after, drafted)  # (B, n + 1)
        stats.rounds += 1
        stats.drafts += finished.count(False) if k else 0
        stats.drafted += k * finished.count(False)
        stats.accepted += sum(kept for kept, end in zip(kept_by_row, finished, strict=True) if not end)
        for row, row_tokens in enumerate(tokens.tolist()):
            for token in check_drawn(row_tokens, model=target):
                if finished[row]:
                    break
                if token in stop:
                    finished[row] = True
                    break
                new_tokens[row].append(token)
                if on_token is not None and on_token(row, token):
                    finished[row] = True
        kept_text = window.ids.shape[1] + n  # the text so far, without the token after it (fed next round)
        window = window.extend(tokens)
        for cache in (target_cache, draft_cache):
            cache.rewind(min(cache.length, kept_text))
        done += n + 1
        stats.advanced += n + 1
    return new_tokens, stats


def check_speculation_fits(models: Sequence[nn.Module], batch: int, positions: int, *, draft_tokens: int, vocab: int,
                           device: torch.device) -> None:
    """InputError, before any is allocated, when the caches of `models` (target and draft: `batch` rows of
    `positions` positions each, every position kept) and a round's scores (the target's over K + 1 positions, the
    draft's over K, fp32, with a working copy each) cannot fit in the memory free on `device` (as beam search checks
    its hypotheses before a search in `Pipeline.generate`). A cache's size per position is read from one of a single
    position (`kv_bytes_per_position`)."""
    per_position = sum(kv_bytes_per_position(model, batch) for model in models)
    need = per_position * positions + 2 * batch * (2 * draft_tokens + 1) * vocab * 4
    free = free_bytes(device)
    if free is not None and need > free:
        raise InputError(f"speculative decoding of {batch} rows of up to {positions} positions with {draft_tokens} "
                         f"draft tokens needs at least {gib(need)} for both models' caches and a round's scores, but "
                         f"{device.type} has {gib(free)} free: decode fewer prompts or samples at once, fewer new "
                         "tokens, or fewer draft tokens")


def _draft(draft: nn.Module, window: Window, cache: KVCache, k: int, done: int, shaper: Shaper,
           groups: Groups) -> tuple[Tensor, Tensor | None]:
    """The draft's k proposals (B, k) after the window, and their distributions q (B, k, V) (None when greedy)."""
    tokens: list[Tensor] = []
    probs: list[Tensor] = []
    for i in range(k):
        logits = prefill(draft, window, cache)  # (B, V): the columns the cache lacks, the last one's logits
        if shaper.sampling.greedy:
            token = shaper.choose(logits, done + i, groups)
        else:
            probs.append(shaper.probs(logits, done + i))
            token = draw(probs[-1], groups)
        tokens.append(token.clamp(min=0))  # NO_TOKEN (a broken draft) is rejected by the target, never kept
        window = window.append(tokens[-1])
    batch = window.ids.shape[0]
    drafted = torch.stack(tokens, dim=1) if tokens else window.ids.new_zeros(batch, 0)  # (B, k)
    if shaper.sampling.greedy:
        return drafted, None
    return drafted, torch.stack(probs, dim=1) if probs else torch.zeros(batch, 0, shaper.vocab, device=drafted.device)
