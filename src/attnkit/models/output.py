"""What every model returns, and the loss they share."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from attnkit.data.batching import IGNORE_INDEX
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


def cross_entropy(logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """Mean token cross-entropy, ignoring IGNORE_INDEX. logits (…, V), targets (…)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )
