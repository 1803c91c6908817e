"""The convolutional family's builder: a `ConvLMConfig` becomes a `ConvLM` (registered in `models/families.py`)."""

from __future__ import annotations

import logging

from attnkit.config import ConvLMConfig
from attnkit.models.convolutional.lm import ConvLM

log = logging.getLogger(__name__)


def build_conv_lm(config: ConvLMConfig) -> ConvLM:
    dilations = [config.dilation(layer) for layer in range(config.n_layers)]
    log.debug("conv-lm: %d gated convolutions of width %d, kernel %d, dilations %s: receptive field %d tokens",
             config.n_layers, config.d_model, config.kernel_size, dilations, config.receptive_field)
    return ConvLM(
        vocab_size=config.vocab_size, d_model=config.d_model, kernel_size=config.kernel_size, dilations=dilations,
        dropout=config.dropout, tie_embeddings=config.tie_embeddings, label_smoothing=config.label_smoothing,
    )
