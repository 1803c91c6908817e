"""What an analysis runs a model on and scores it by: a `Batch` (the model's inputs and the targets its logits are
scored against), for every family alike.

    lm_batch(ids)               decoder LM     model(ids[:, :-1]); targets ids[:, 1:]
    seq2seq_batch(src, tgt)     encoder-decoder, recurrent seq2seq: model(src, tgt[:, :-1]); targets tgt[:, 1:]
    Batch((ids,), labels)       anything else: a masked LM's masked ids and their labels (-100 elsewhere), ...

Without targets an analysis compares the changed model's output distribution with the model's own (`kl`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data.batching import IGNORE_INDEX
from attnkit.errors import InputError
from attnkit.inspect.tracing import Edit, Names, Trace, trace


@dataclass(frozen=True)
class Batch:
    """The model is called as `model(*args, **kwargs)`; `labels` (the logits' leading shape, -100: unscored) score
    it."""

    args: tuple[Tensor, ...]
    labels: Tensor | None = None
    kwargs: dict = field(default_factory=dict)

    def run(self, model: nn.Module, names: Names = (), edits: Mapping[str, Edit] | None = None) -> Trace:
        """`trace` the model on this batch."""
        return trace(model, *self.args, names=names, edits=edits, **self.kwargs)

    def logits(self, output) -> Tensor:
        """The logits of a model's output (a ModelOutput, or a tensor)."""
        return output.logits if hasattr(output, "logits") else output


def check_batch(value: object, name: str) -> None:
    """InputError unless `value` is a Batch, naming how token ids become one."""
    if not isinstance(value, Batch):
        shown = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else f"a {type(value).__name__}"
        raise InputError(f"{name} is {shown}, where the analyses take a Batch: Batch((ids,)) runs the model on token "
                         "ids (lm_batch(ids) also scores each next token; seq2seq_batch(src, tgt) a translation)")


def lm_batch(ids: Tensor) -> Batch:
    """Next-token prediction over ids (B, T): inputs (B, T - 1), targets the tokens after them. Raises InputError for
    ids that are not (B, T) integers, or fewer than 2 tokens a row (one read, one predicted)."""
    _check_ids(ids, "ids")
    if ids.shape[1] < 2:
        raise InputError(f"next-token prediction reads a token and predicts the next, so a text needs at least 2 "
                         f"tokens; this one has {ids.shape[1]}: give a longer text")
    return Batch((ids[:, :-1],), ids[:, 1:])


def seq2seq_batch(src: Tensor, tgt: Tensor) -> Batch:
    """Teacher forcing: the decoder reads tgt (B, T) without its last token and predicts it without its first.
    Raises InputError for ids that are not (B, T) integers, or a target without BOS and a token."""
    _check_ids(src, "src")
    _check_ids(tgt, "tgt")
    if tgt.shape[1] < 2:
        raise InputError(f"a target needs BOS and at least one token to predict; this one has {tgt.shape[1]} "
                         "token(s): give a longer target")
    return Batch((src, tgt[:, :-1]), tgt[:, 1:])


def _check_ids(ids: object, name: str) -> None:
    if isinstance(ids, Tensor) and ids.dim() == 2 and not (ids.dtype.is_floating_point or ids.dtype.is_complex):
        return
    shown = f"shape {tuple(ids.shape)}, {ids.dtype}" if isinstance(ids, Tensor) else f"a {type(ids).__name__}"
    raise InputError(f"{name} must be a tensor of token ids (integers) of shape (batch, length); got {shown} "
                     "(torch.tensor([ids]) makes one row)")


def output_ids(value: int | Tensor, name: str, rows: int, outputs: int, device: torch.device) -> Tensor:
    """An answer (or wrong answer): one token or class id, or one per row, as (rows,) ids on `device`. Raises
    InputError for anything but whole numbers within the model's `outputs` (its vocabulary or classes), one or
    `rows` of them."""
    ids = torch.as_tensor(value, device=device)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool or ids.dim() > 1 or (
            ids.dim() == 1 and len(ids) != rows):
        raise InputError(f"{name}={_shown_ids(value)} must be one token or class id, or one per row of the batch "
                         f"({rows})")
    if ids.numel() and not bool(((ids >= 0) & (ids < outputs)).all()):
        raise InputError(f"{name}={_shown_ids(value)} is outside the model's {outputs} outputs (ids 0..{outputs - 1}): "
                         "give ids from its tokenizer (or its class indices)")
    return ids.long().expand(rows)  # (B,)


def _shown_ids(value: object) -> str:
    return str(value.tolist()) if isinstance(value, Tensor) else repr(value)


def token_losses(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy per target, (…, V) and (…) -> (…) in float32, NaN where the label is -100."""
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1).clamp(min=0),
                             reduction="none").view(labels.shape)
    return losses.masked_fill(labels == IGNORE_INDEX, float("nan"))


def divergence(logits: Tensor, reference: Tensor) -> Tensor:
    """KL(reference || changed) per position, (…, V) twice -> (…): how far a change moved the output distribution."""
    return F.kl_div(F.log_softmax(logits.float(), -1), F.log_softmax(reference.float(), -1), log_target=True,
                    reduction="none").sum(-1)


def score(batch: Batch, logits: Tensor, clean: Tensor) -> Tensor:
    """The mean loss on the batch's targets, or without targets the mean KL from the clean logits."""
    if batch.labels is None:
        return divergence(logits, clean).mean()
    return token_losses(logits, batch.labels).nanmean()


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
