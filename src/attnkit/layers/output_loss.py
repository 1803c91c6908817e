"""The output projection and its cross-entropy, computed one of three ways that give the same loss and gradients.

    plain    logits = hidden @ W^T, then F.cross_entropy: the reference. With `vocab_multiple` > 1 the product runs
             over W padded with zero rows to a multiple of it (GPU matrix kernels favour such widths: nanoGPT pads
             GPT-2's 50,257 to 50,304), the padded logits held at -inf by a bias so that the softmax never sees them;
             the weight, the loss and the gradients stay those of the real vocabulary.
    fused    Liger Kernel's fused linear cross-entropy (Hsu et al. 2024): on CUDA, where it is installed.
    chunked  `chunked_loss.py`: chunks of tokens, each chunk's logits gone before the next; no (N, V) tensor.

Which one a training step takes is the training plan's choice (`train/plan.py`), handed to the model through
`use_loss_path`; tests hold the three equal in value and gradient.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data.batching import IGNORE_INDEX
from attnkit.layers.chunked_loss import chunked_linear_cross_entropy

LossKind = Literal["plain", "fused", "chunked"]
LOSS_KINDS: tuple[str, ...] = ("plain", "fused", "chunked")


@dataclass(frozen=True)
class LossPath:
    """How the output projection's loss is computed (see the module docstring)."""

    kind: LossKind = "chunked"
    chunk_size: int = 256  # chunked: tokens per chunk
    vocab_multiple: int = 1  # plain: the product's vocabulary padded to a multiple of this (1: not padded)

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"loss path {self.kind!r} is not known; use one of {', '.join(LOSS_KINDS)}")
        if self.chunk_size < 1 or self.vocab_multiple < 1:
            raise ValueError(f"chunk_size={self.chunk_size} and vocab_multiple={self.vocab_multiple} must be >= 1")


def fused_kernel_missing() -> str | None:
    """Why the fused path cannot run here (None when it can): Liger Kernel is a CUDA (Triton) kernel."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "Liger Kernel is not installed (pip install 'attnkit[gpu]')"
    return None


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, path: LossPath, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets` (ignoring -100), the way `path` says.

    hidden (…, C); weight (V, C), an output projection without bias; targets (…) class ids.
    """
    if path.kind == "chunked":
        return chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=path.chunk_size,
                                            label_smoothing=label_smoothing)
    hidden_2d, targets_1d = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)  # (N, C), (N,)
    if path.kind == "fused":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return liger_fused_linear_cross_entropy(hidden_2d, weight, targets_1d, ignore_index=IGNORE_INDEX,
                                                label_smoothing=label_smoothing)
    multiple = 1 if label_smoothing else path.vocab_multiple  # smoothing would spread weight over the padding
    logits = padded_logits(hidden_2d, weight, multiple)  # (N, V) or (N, V padded)
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()  # soft-maxed in fp32
    return F.cross_entropy(logits, targets_1d, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)


def padded_logits(hidden: Tensor, weight: Tensor, multiple: int) -> Tensor:
    """hidden (N, C) @ weight (V, C)^T -> (N, V), or (N, V') for V' the next multiple of `multiple`, whose extra
    logits are -inf: a softmax gives them probability 0 and a loss gradient 0, so the loss is the real vocabulary's.
    Label smoothing spreads weight over every logit and so is computed unpadded."""
    vocab = weight.shape[0]
    extra = -vocab % multiple
    if extra == 0:
        return F.linear(hidden, weight)
    padded = F.pad(weight, (0, 0, 0, extra))  # (V', C): zero rows
    bias = torch.zeros(vocab + extra, dtype=hidden.dtype, device=hidden.device)
    bias[vocab:] = float("-inf")
    return F.linear(hidden, padded, bias)  # (N, V')


def use_loss_path(model: nn.Module, path: LossPath) -> nn.Module:
    """Hand every module of `model` that computes an output loss (`loss_path` attribute) the path; returns the model."""
    for module in model.modules():
        if hasattr(module, "loss_path"):
            module.loss_path = path
    return model
