"""One tiny random Hugging Face model loaded by attnkit and by TransformerLens (its `TransformerBridge`, no weight
processing), for the tests that hold attnkit.inspect equal to TransformerLens. Their modules import TransformerLens
through `transformer_lens()`, which skips them, with the reason, where it is not installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from interop_models import hf_model, word_tokenizer

from attnkit.interop import hf


def transformer_lens():
    """The `transformer_lens` module, or a skip saying why it is absent."""
    return pytest.importorskip("transformer_lens", reason=(
        "TransformerLens is not installed (pip install transformer-lens; it brings datasets, wandb and other packages "
        "attnkit does not need, so it is not among attnkit's extras)"))


def lens_pair(name: str, directory: Path, *, prepare: Callable[[torch.nn.Module], None] | None = None):
    """(attnkit's model, TransformerLens's bridge) of the tiny model `name` (interop_models), both in eval mode;
    `prepare` changes the Hugging Face model's weights in place before both read them."""
    from transformer_lens.model_bridge import TransformerBridge

    reference = hf_model(name, directory)
    if prepare is not None:
        with torch.no_grad():
            prepare(reference)
        reference.save_pretrained(directory)
    word_tokenizer(directory)  # the bridge loads a tokenizer; Llama's config names none it could build
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=reference, device="cpu")
    return hf.load(directory).model.eval(), bridge.eval()
