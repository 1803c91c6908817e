"""Training precision: which dtype the forward and backward passes compute in, and where the weights live.

    fp32         the model trains as it is
    bf16         autocast: matrix products (and what follows them up to the next fp32 op) in bfloat16; weights,
                 the residual stream, gradients and AdamW's moments stay fp32 (each product casts its weight afresh)
    bf16-master  mixed-precision training with master weights (Micikevicius et al. 2018): a bfloat16 copy of
                 the model runs forward and backward, so activations and gradients are bf16 too; its gradients
                 are added into the fp32 model's, AdamW updates the fp32 weights (the masters), and the bf16 copy
                 is refreshed from them. The fp32 model is the one checkpointed, so runs save and resume as fp32;
                 evaluation scores the bf16 copy, the model as it trains.

Master weights matter because an update smaller than half a bf16 step (1/512 to 1/256 of the weight) is lost if
the bf16 weights are updated in place; the fp32 masters accumulate it. Norms, softmax, RoPE and the loss still
compute in fp32 inside their modules, whatever the dtype of their inputs.
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager, nullcontext
from typing import Literal, get_args

import torch
from torch import nn

from attnkit.errors import ConfigError

TrainDType = Literal["fp32", "bf16", "bf16-master"]
TRAIN_DTYPES: tuple[str, ...] = get_args(TrainDType)


class FullPrecision:
    """fp32: `compute_model` is the model; nothing is cast or copied."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def compute_model(self) -> nn.Module:
        """The module to run forward and backward on."""
        return self.model

    def context(self) -> AbstractContextManager:
        """Entered around each forward pass (training and evaluation)."""
        return nullcontext()

    def gradients_to_model(self) -> None:
        """After each backward: move `compute_model`'s gradients onto `model`'s parameters."""

    def weights_to_compute(self) -> None:
        """After each optimizer step (and after loading weights into `model`): refresh `compute_model`."""


class Autocast(FullPrecision):
    """bf16 autocast around the fp32 model."""

    def context(self) -> AbstractContextManager:
        device_type = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)


class MasterWeights(FullPrecision):
    """A bf16 copy of the fp32 model computes; the fp32 model holds the master weights the optimizer updates.

    Parameters pair up in `parameters()` order, so tied weights stay tied in the copy. Buffers (position
    tables, RoPE frequencies) stay fp32: each module casts what it derives from them to its input's dtype.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        # deepcopy takes each parameter from the memo, already bf16: no transient fp32 copy, and tied weights stay
        # one tensor, since the memo is keyed by the original's identity
        bf16 = {id(p): nn.Parameter(p.detach().to(torch.bfloat16), p.requires_grad) for p in model.parameters()}
        self._compute = copy.deepcopy(model, memo=bf16)
        self._pairs = list(zip(model.parameters(), self._compute.parameters(), strict=True))

    @property
    def compute_model(self) -> nn.Module:
        return self._compute

    @torch.no_grad()
    def gradients_to_model(self) -> None:
        # accumulated in fp32 across micro-batches: bf16 sums of many small gradients would round away
        for master, compute in self._pairs:
            if compute.grad is None:
                continue
            if master.grad is None:
                master.grad = compute.grad.to(master.dtype)
            else:
                master.grad.add_(compute.grad)
            compute.grad = None

    @torch.no_grad()
    def weights_to_compute(self) -> None:
        for master, compute in self._pairs:
            compute.copy_(master)  # rounds each fp32 weight to the nearest bf16


def make_precision(dtype: str, model: nn.Module) -> FullPrecision:
    """The precision strategy named by `dtype` (one of `TRAIN_DTYPES`) for an fp32 `model`.

    Raises:
        ConfigError: for any other name.
    """
    check_dtype(dtype)
    strategies = {"fp32": FullPrecision, "bf16": Autocast, "bf16-master": MasterWeights}
    return strategies[dtype](model)


def check_dtype(dtype: str) -> None:
    """Raises ConfigError unless `dtype` names a training precision."""
    if dtype not in TRAIN_DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not a known choice; use one of {', '.join(TRAIN_DTYPES)}")
