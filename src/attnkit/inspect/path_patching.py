"""Path patching (Wang et al. 2022, "Interpretability in the Wild", section 3.1; Goldowsky-Dill et al. 2023): how
much of the answer flows from a sender head to a receiver head along one input of the receiver, its queries, keys
or values, and nowhere else.

    1. run the clean and the corrupted input, reading every head's output (`SITE.z`)
    2. run the corrupted input with the sender's output taken from the clean run and every other head's output
       frozen at its corrupted value (the FFNs recompute), reading the receiver's input (`SITE.q`, `.k` or `.v`)
    3. run the corrupted input with only the receiver's input replaced by what step 2 read; score it

    restored = (metric(patched) - metric(corrupted)) / (metric(clean) - metric(corrupted))

as `attnkit.inspect.patching` does for a whole activation (1: the path carries the whole difference). The metric is
any function of the logits (a logit difference, minus a loss). A grouped-query receiver's keys and values belong to
its shared key/value head: patching them patches that head for every query head of its group (`notes` says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.circuits import Kind, sites_in_order
from attnkit.inspect.edits import patch
from attnkit.inspect.inputs import Batch
from attnkit.inspect.patching import check_pair
from attnkit.inspect.points import evaluated, hook_points, module_of

Metric = Callable[[Tensor], float]  # the logits of a run -> a number that is larger for the clean answer
NO_HEADS = ("path patching follows a Transformer head's output into a later head's queries, keys or values; {model} "
            "has none: a recurrent model's one attention reads states that its recurrent cell mixes (use the "
            "activation analyses: patch, attribute, heads)")


@dataclass(frozen=True)
class PathPatching:
    """The share of `clean - corrupted` (the metric on each run) that the path alone brings back."""

    restored: float
    clean: float
    corrupted: float
    patched: float
    notes: tuple[str, ...] = ()


@evaluated
def path_patch(model: nn.Module, clean: Batch, corrupted: Batch, *, sender: tuple[str, int | Sequence[int]],
               receiver: tuple[str, int], via: Kind, metric: Metric) -> PathPatching:
    """Patch the path from `sender` (a site and one head, or several heads of it: `("blocks.0.attn", 2)`) into
    `receiver`'s `via` input ("q", "k" or "v") of one head (module docstring). Raises InputError for inputs of other
    shapes, a sender that writes after the receiver reads, or a model without Transformer heads."""
    (sender_site, sender_heads), (receiver_site, receiver_head) = sender, receiver
    sender_heads = [sender_heads] if isinstance(sender_heads, int) else list(sender_heads)
    sites = {s.name: s for s in sites_in_order(model, refusal=NO_HEADS)}
    for name in (sender_site, receiver_site):
        if name not in sites:
            raise InputError(f"no attention sublayer {name!r}; the model's are {', '.join(sites)}")
    stream, point = sites[receiver_site].reads(via)
    if sites[sender_site].stack != stream or sites[sender_site].order >= point:
        raise InputError(f"{sender_site} does not write into what {receiver_site}'s {via} reads before it: path "
                         "patching runs from an earlier sublayer of the same stream")
    read = f"{receiver_site}.{via}"
    if read not in hook_points(model):
        raise InputError(f"{read} is not a hook point here (q, k and v fused into one projection): load the model "
                         "without fuse_qkv")
    check_pair(clean, corrupted)
    attention = sites[receiver_site].attention
    group = attention.n_heads // attention.n_kv_heads
    for site, heads in ((sender_site, sender_heads), (receiver_site, [receiver_head])):
        n = sites[site].attention.n_heads
        for h in heads:
            if not 0 <= h < n:
                raise InputError(f"head {h} is out of range: {site} has {n} heads (0..{n - 1})")
    model = module_of(model)  # a pipeline from attnkit.load: its model
    outputs = [f"{name}.z" for name in sites]
    clean_run, corrupted_run = clean.run(model, names=outputs), corrupted.run(model, names=outputs)
    frozen = {name: corrupted_run[name] for name in outputs}  # (B, T, H, D) each
    mixed = frozen[f"{sender_site}.z"].clone()
    mixed[:, :, sender_heads] = clean_run[f"{sender_site}.z"][:, :, sender_heads]  # the sender alone from clean
    frozen[f"{sender_site}.z"] = mixed
    carried = corrupted.run(model, names=[read], edits={n: patch(v) for n, v in frozen.items()})[read]
    head = receiver_head if via == "q" else receiver_head // group  # keys and values: the shared head
    patched = corrupted.run(model, edits={read: patch(carried, head=head)})
    values = [metric(batch.logits(run.output)) for batch, run in
              ((clean, clean_run), (corrupted, corrupted_run), (corrupted, patched))]
    if abs(values[0] - values[1]) < 1e-9:
        raise InputError("the clean and corrupted runs score the same, so nothing can be restored; corrupt the input "
                         "where it changes the answer")
    notes = () if via == "q" or group == 1 else (
        f"{receiver_site} shares key/value head {head} among query heads {head * group}..{head * group + group - 1}: "
        f"its {via} is patched for all of them",)
    return PathPatching((values[2] - values[1]) / (values[0] - values[1]), *values, notes=notes)


def loss_metric(labels: Tensor) -> Metric:
    """Minus the mean next-token loss on `labels` (the logits' leading shape, -100: unscored): a larger value is a
    better prediction, as a metric should be."""
    def metric(logits: Tensor) -> float:
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)
        return -float(losses)

    return metric
