"""Head importance by ablation (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"): how much the loss
on held-out text rises when one head's output is removed, every head of every attention sublayer in turn.

    importance[site][h] = loss(model with head h of site ablated) - loss(model)

Sites are the model's attention sublayers (`blocks.L.attn`, and an encoder-decoder's `encoder.` and `decoder.` ones
with `decoder.blocks.L.cross_attn`). Without targets the score is the mean KL divergence of the output distribution
from the model's own (`inputs.score`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.edits import Ablation, ablate, patch
from attnkit.inspect.inputs import Batch, check_batch, score
from attnkit.inspect.points import evaluated, head_sites, module_of


@dataclass(frozen=True)
class HeadImportance:
    """`scores[i, h]`: the loss change (or KL) when head h of `sites[i]` is ablated (NaN where a site has fewer heads);
    `baseline`: the loss unchanged (0 for KL)."""

    sites: list[str]
    scores: Tensor  # (n_sites, H)
    baseline: float
    metric: str  # "loss" or "kl"
    ablation: str

    def rows(self) -> list[dict]:
        """One row per site: its heads' scores."""
        return [{"site": site, **{f"head {h}": round(float(v), 4) for h, v in enumerate(row)}}
                for site, row in zip(self.sites, self.scores, strict=True)]

    def top(self, k: int = 5) -> list[tuple[str, int, float]]:
        """The k most important heads: (site, head, score)."""
        flat = self.scores.flatten().nan_to_num(float("-inf"))
        order = flat.argsort(descending=True)[:k]
        width = self.scores.shape[1]
        return [(self.sites[int(i) // width], int(i) % width, float(flat[i])) for i in order]


@evaluated
def head_importance(model: nn.Module, batches: Batch | Sequence[Batch], *, ablation: Ablation = "zero",
                    seed: int = 0) -> HeadImportance:
    """Ablate each head of each attention sublayer at its output (`SITE.z`) and score the model on `batches` (one,
    or several of different shapes, e.g. sentence pairs; scores are their mean).

    Mean ablation reads its reference from each batch itself (its mean). Resample ablation replaces each row's head
    output by other rows' (`resampled`: of this batch or another, never its own), so it needs two rows at least.
    """
    model = module_of(model)  # a pipeline from attnkit.load: its model
    batches = [batches] if isinstance(batches, Batch | Tensor) else list(batches)
    if not batches:
        raise InputError("head importance needs at least one batch of inputs")
    for batch in batches:
        check_batch(batch, "a batch")
    sites = head_sites(model)
    if not sites:
        raise InputError(f"{type(model).__name__} has no attention heads to ablate")
    generator = torch.Generator().manual_seed(seed)
    cleans = [batch.run(model, names=[f"{s}.z" for s in sites]) for batch in batches]
    if ablation == "resample":
        donors = {site: resampled([clean[f"{site}.z"] for clean in cleans], generator) for site in sites}
    totals, baseline = None, 0.0
    for index, (batch, clean) in enumerate(zip(batches, cleans, strict=True)):
        clean_logits = batch.logits(clean.output)
        base = float(score(batch, clean_logits, clean_logits))
        scores = torch.full((len(sites), max(clean[f"{s}.z"].shape[2] for s in sites)), float("nan"))  # NaN: no head
        for i, site in enumerate(sites):
            for head in range(clean[f"{site}.z"].shape[2]):
                edit = (patch(donors[site][index], head=head) if ablation == "resample" else
                        ablate(ablation, clean[f"{site}.z"], head=head))
                changed = batch.run(model, edits={f"{site}.z": edit})
                scores[i, head] = float(score(batch, batch.logits(changed.output), clean_logits)) - base
        totals = scores if totals is None else totals + scores
        baseline += base
    return HeadImportance(sites, totals / len(batches), baseline / len(batches),
                          "kl" if batches[0].labels is None else "loss", ablation)


def resampled(activations: Sequence[Tensor], generator: torch.Generator) -> list[Tensor]:
    """Resample ablation's reference (Chan et al. 2022) over rows of several batches, activations [(B, T, ...)]: each
    row's activation at position t is another row's at t, drawn at random among the rows (of any batch) that reach
    t, never the row's own; a position no other row reaches takes the mean of the other rows. Raises InputError for
    a single row, which has no other to draw from."""
    rows = [(b, r) for b, a in enumerate(activations) for r in range(a.shape[0])]
    if len(rows) < 2:
        raise InputError("resample ablation replaces each text's head outputs by another text's, and one text has no "
                         "other: give two texts or more (--input FILE, several --text), or use --ablation mean")
    lengths = torch.tensor([activations[b].shape[1] for b, _ in rows])  # (rows,)
    out = []
    for b, activation in enumerate(activations):
        new = torch.empty_like(activation)
        for r in range(activation.shape[0]):
            others = torch.tensor([row != (b, r) for row in rows])  # (rows,)
            for t in range(activation.shape[1]):
                donors = (others & (lengths > t)).nonzero()[:, 0]
                if len(donors):
                    donor_b, donor_r = rows[int(donors[torch.randint(len(donors), (), generator=generator)])]
                    new[r, t] = activations[donor_b][donor_r, t]
                else:
                    new[r, t] = torch.cat([activations[o][q] for o, q in (rows[int(i)] for i in others.nonzero())
                                           ]).mean(0)
        out.append(new)
    return out
