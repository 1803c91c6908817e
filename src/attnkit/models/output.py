"""What every model returns, and the loss they share."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.data.batching import IGNORE_INDEX
from attnkit.errors import InputError
from attnkit.layers.embedding import has_values
from attnkit.layers.kv_cache import KVCache


@dataclass
class ModelOutput:
    """logits: (B, T, V) for language models, (B, n_classes) for classifiers, the pooled vector (B, C) for the
        bare encoder.

    loss: mean cross-entropy over non-ignored targets, when targets were given.
    attentions: one dict per layer, {"self": (B, H, T, S)} and for encoder-decoders {"cross": (B, H, T, S_src)},
        when `need_weights=True`; `encoder_attentions` holds the encoder's layers of an encoder-decoder.
    cache: the KV cache after this call, when one was passed in.
    hidden_states: the last layer's states (B, T, C), from encoder models.
    """

    logits: Tensor
    loss: Tensor | None = None
    attentions: list[dict[str, Tensor]] | None = None
    cache: KVCache | None = None
    encoder_attentions: list[dict[str, Tensor]] | None = None
    hidden_states: Tensor | None = None


def check_labels(labels: Tensor, shape: torch.Size, n_out: int) -> None:
    """Raise InputError unless `labels` has `shape` (one per output) and holds integers in [0, n_out), or
    IGNORE_INDEX where nothing is predicted."""
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
        raise InputError(f"labels must be a tensor of integer class or token ids (torch.long), got "
                         f"{getattr(labels, 'dtype', type(labels).__name__)}")
    if labels.shape != shape:
        raise InputError(f"labels has shape {tuple(labels.shape)} but the outputs need {tuple(shape)}: one label per "
                         f"output, {IGNORE_INDEX} where there is none to predict")
    if not has_values(labels):
        return
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= n_out))
    if bool(bad.any()):
        raise InputError(f"labels holds {int(labels[bad][0])}, outside the {n_out} outputs [0, {n_out}); give ids "
                         f"the model predicts (its vocabulary or labels), {IGNORE_INDEX} where there is none")


def cross_entropy(logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """Mean token cross-entropy, ignoring IGNORE_INDEX. logits (…, V), targets (…), checked (`check_labels`)."""
    check_labels(targets, logits.shape[:-1], logits.shape[-1])
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )
