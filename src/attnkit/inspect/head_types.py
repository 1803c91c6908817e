"""What each head attends to, scored from its attention pattern (Olsson et al. 2022, "In-context Learning and
Induction Heads"; Clark et al. 2019, "What Does BERT Look At?").

    type         query t puts its weight on key j where ...                   scored over queries that have such j
    previous     j = t - 1                                                    t >= 1
    first        j = 0                                                        t >= 1
    separator    token j is one of the given separators (SEP, EOS, ...)       every t
    duplicate    j < t and token j == token t (an earlier copy of itself)     tokens seen before
    induction    j <= t and token j - 1 == token t (the token that followed   tokens seen before
                 an earlier copy: "A B ... A -> B")

A score is the mean over those queries of the weight on those keys (1: all of it). On repeated random tokens
`[x1..xn x1..xn]` a duplicate-token head looks n back and an induction head n - 1 back, so one period cannot tell
an induction head from a head that looks a fixed n - 1 back: `repeat_types` scores several periods and keeps, for
the duplicate and induction types, a head's lowest score over them (it is typed induction only where it holds at
each period). The tokens are framed as the model reads a text (`frame`: an encoder's CLS ... SEP, a converted
Llama's BOS), so `first` is the weight on CLS or BOS and `separator` the weight on the marks, as Clark et al. read
BERT's heads; an encoder read without them reads an input unlike any it learned. A model that reads its text bare
(an attnkit decoder, a converted GPT-2) is scored on the bare tokens: `first` is the weight on the first random
token, and `separator`, with no mark to weigh, is not scored (NaN); nor is it where the first token is the only mark
(a converted Llama's BOS), which `first` already scores. The random tokens are none of the tokenizer's
special ones. Cross-attention is scored by
how monotonic its alignment is (`monotonicity`): the share of target steps whose most-attended source position does
not move backwards (1: a monotone alignment, about 0.5 for chance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.points import attends_across, evaluated, head_sites, module_of
from attnkit.inspect.tracing import trace

FrameIds = tuple[Sequence[int], Sequence[int]]  # (before, after): the ids around a text (`tasks.reading.text_frame`)
SELF_TYPES = ("previous", "first", "duplicate", "induction")
PERIODIC = ("duplicate", "induction")  # types whose keys sit a period back on repeated tokens
MONOTONIC = 0.9  # a cross-attention head whose peak moves backwards at no more than one step in ten


def repeated_tokens(vocab: Sequence[int] | int, length: int, *, batch: int = 8,
                    generator: torch.Generator | None = None, frame: FrameIds = ((), ())) -> Tensor:
    """Random token sequences of `length` drawn from `vocab` (ids, or range(vocab)), each followed by itself and
    framed by `frame`'s (before, after) ids: (B, len(before) + 2 * length + len(after))."""
    pool = torch.arange(vocab) if isinstance(vocab, int) else torch.as_tensor(list(vocab))
    if len(pool) < 2 or length < 2:
        raise InputError(f"repeated tokens need at least 2 distinct tokens and length >= 2; got {len(pool)} tokens "
                         f"and length {length}")
    first = pool[torch.randint(len(pool), (batch, length), generator=generator)]  # (B, n)
    before, after = (torch.tensor(marks, dtype=first.dtype).expand(batch, len(marks)) for marks in frame)
    return torch.cat((before, first, first, after), dim=1)  # (B, len(before) + 2n + len(after))


def key_masks(ids: Tensor, separators: Sequence[int] = ()) -> dict[str, Tensor]:
    """For each type, which keys count for each query: ids (B, T) -> {type: (B, T, T) bool} (query rows)."""
    length = ids.shape[1]
    t = torch.arange(length)
    query, key = t[:, None], t[None, :]  # (T, 1), (1, T)
    same = ids[:, :, None] == ids[:, None, :]  # (B, T, T): token t == token j
    after_same = torch.zeros_like(same)
    after_same[:, :, 1:] = same[:, :, :-1]  # token t == token j - 1
    masks = {
        "previous": (key == query - 1).expand_as(same),
        "first": ((key == 0) & (query >= 1)).expand_as(same),
        "duplicate": same & (key < query),
        "induction": after_same & (key <= query),
    }
    if separators:
        is_separator = torch.isin(ids, torch.as_tensor(list(separators), device=ids.device))  # (B, T)
        masks["separator"] = is_separator[:, None, :].expand_as(same)
    return masks


def self_scores(pattern: Tensor, ids: Tensor, separators: Sequence[int] = ()) -> dict[str, Tensor]:
    """Each head's score per type: pattern (B, H, T, T) of self-attention over ids (B, T) -> {type: (H,)}; NaN where
    no query has such keys."""
    if pattern.shape[-1] != pattern.shape[-2] or pattern.shape[-1] != ids.shape[1]:
        raise InputError(f"a self-attention pattern {tuple(pattern.shape)} over ids {tuple(ids.shape)}: give the ids "
                         "the pattern was computed on")
    out = {}
    for name, mask in key_masks(ids.to(pattern.device), separators).items():
        weight = (pattern.float() * mask[:, None]).sum(-1)  # (B, H, T): weight on the counted keys
        counted = mask.any(-1)[:, None].expand_as(weight)  # (B, H, T): queries that have such keys
        out[name] = (weight * counted).sum((0, 2)) / counted.sum((0, 2))  # (H,)
    return out


def monotonicity(pattern: Tensor, query_mask: Tensor | None = None) -> Tensor:
    """The share of consecutive target steps whose most-attended source position does not decrease: pattern
    (B, H, T, S), query_mask (B, T) True at real target steps -> (H,)."""
    if pattern.shape[2] < 2:
        raise InputError("monotonicity needs at least two target steps")
    peak = pattern.argmax(-1)  # (B, H, T)
    forward = (peak[..., 1:] >= peak[..., :-1]).float()  # (B, H, T - 1)
    if query_mask is None:
        return forward.mean((0, 2))
    pairs = (query_mask[:, 1:] & query_mask[:, :-1])[:, None].expand_as(forward).float()
    return (forward * pairs).sum((0, 2)) / pairs.sum((0, 2))


def classify(scores: dict[str, Tensor], threshold: float = 0.4) -> list[str]:
    """Each head's type: the type it scores highest on when that score reaches `threshold`, else "-". scores
    {type: (H,)} -> H names."""
    names = list(scores)
    table = torch.stack([scores[n].nan_to_num(0.0) for n in names])  # (types, H)
    best, which = table.max(0)
    return [names[int(w)] if float(b) >= threshold else "-" for b, w in zip(best, which, strict=True)]


@dataclass(frozen=True)
class HeadTypes:
    """`scores[type][i, h]`: head h of `sites[i]` on that type (NaN: not scored there, e.g. a cross-attention site on
    self-attention types, `monotonic` on self-attention); `types[i][h]`: its type (`typed`)."""

    sites: list[str]
    scores: dict[str, Tensor]  # {type: (n_sites, H)}
    types: list[list[str]]

    @classmethod
    def typed(cls, sites: list[str], scores: dict[str, Tensor], threshold: float = 0.4) -> HeadTypes:
        """Name each head's type: a self-attention head's by `classify`; a cross-attention head is `monotonic` when
        its score reaches MONOTONIC."""
        types = []
        for i, site in enumerate(sites):
            heads = int((~scores["monotonic"][i].isnan()).sum()) if attends_across(site) else None
            if heads is not None:
                types.append(["monotonic" if float(v) >= MONOTONIC else "-" for v in scores["monotonic"][i, :heads]])
            else:
                own = {k: v[i] for k, v in scores.items() if k != "monotonic"}
                width = int((~own["previous"].isnan()).sum())
                types.append(classify({k: v[:width] for k, v in own.items()}, threshold))
        return cls(sites, scores, types)

    def rows(self) -> list[dict]:
        """One row per site and head: its scores and its type."""
        return [{"site": site, "head": h, **{k: _rounded(v[i, h]) for k, v in self.scores.items()},
                 "type": self.types[i][h]}
                for i, site in enumerate(self.sites) for h in range(len(self.types[i]))]

    def best(self, kind: str) -> tuple[str, int, float]:
        """The head scoring highest on `kind`: (site, head, score)."""
        table = self.scores[kind].nan_to_num(-1.0)
        index = int(table.argmax())
        return self.sites[index // table.shape[1]], index % table.shape[1], float(table.flatten()[index])


def _rounded(value: Tensor) -> float | None:
    return None if bool(value.isnan()) else round(float(value), 3)


@evaluated
def head_types(model: nn.Module, *args: Tensor, separators: Sequence[int] = (), threshold: float = 0.4) -> HeadTypes:
    """Score every head of `model` run on `args` (its ids; an encoder-decoder's source and target): self-attention
    heads on `SELF_TYPES` (and `separator` given separators), cross-attention heads on `monotonic`."""
    model = module_of(model)
    sites = head_sites(model)
    if not sites:
        raise InputError(f"{type(model).__name__} has no attention heads to score")
    read = trace(model, *args, names=[f"{s}.pattern" for s in sites])
    names = [*SELF_TYPES, *(["separator"] if separators else []), "monotonic"]
    width = max(read[f"{s}.pattern"].shape[1] for s in sites)
    scores = {name: torch.full((len(sites), width), float("nan")) for name in names}
    for i, site in enumerate(sites):
        pattern = read[f"{site}.pattern"]  # (B, H, T, S)
        if attends_across(site):
            found = {"monotonic": monotonicity(pattern)}
        else:
            found = self_scores(pattern, args[1] if site.startswith("decoder.") else args[0], separators)
        for name, values in found.items():
            scores[name][i, : len(values)] = values.cpu()
    return HeadTypes.typed(sites, scores, threshold)


def repeat_periods(longest: int) -> tuple[int, ...]:
    """The periods `repeat_types` repeats at: `longest`, about two thirds and two fifths of it (20, 13, 8), so that a
    head looking a fixed distance back matches at one of them at most."""
    return tuple(sorted({longest, max(2, round(longest * 2 / 3)), max(2, round(longest * 2 / 5))}, reverse=True))


def repeat_types(model: nn.Module, vocab: Sequence[int] | int, *, periods: Sequence[int], batch: int = 16,
                 generator: torch.Generator | None = None, separators: Sequence[int] = (), frame: FrameIds = ((), ()),
                 threshold: float = 0.4) -> HeadTypes:
    """Score every head on `batch` random sequences from `vocab` repeated once, at each of `periods`, framed by
    `frame` (its marks count as separators): the duplicate and induction scores are a head's lowest over the periods,
    the others their mean (module docstring). Where the only mark a sequence can hold is its first token (a converted
    Llama's BOS, no separator among `vocab`), `separator` would score the key `first` scores: it is not scored."""
    model = module_of(model)
    device = next(model.parameters()).device
    drawn = set(range(vocab)) if isinstance(vocab, int) else set(vocab)
    elsewhere = ({*separators} & drawn) | {*frame[0][1:], *frame[1]}  # marks a sequence holds after its first token
    separators = sorted({*separators, *frame[0], *frame[1]}) if elsewhere else []
    runs = [head_types(model, repeated_tokens(vocab, n, batch=batch, generator=generator, frame=frame).to(device),
                       separators=separators) for n in periods]
    scores = {kind: torch.stack([r.scores[kind] for r in runs]) for kind in runs[0].scores}  # (periods, sites, H)
    return HeadTypes.typed(runs[0].sites, {kind: table.amin(0) if kind in PERIODIC else table.nanmean(0)
                                           for kind, table in scores.items()}, threshold)
