"""bf16 training with fp32 master weights: the model computes in bf16, the optimizer updates fp32 copies.

Autocast keeps fp32 weights and casts each one to bf16 at every use, forward and backward. Here the model's own
weights are bf16, so nothing is cast per step; the optimizer holds fp32 "master" copies and fp32 state, so small
updates are not lost to bf16's 8-bit mantissa (Micikevicius et al. 2018, mixed-precision training):

    fp32 master --(copy, rounded)--> bf16 model --forward/backward--> bf16 grads --(to fp32)--> AdamW on master
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class MasterWeights:
    """Pairs a bf16 model with fp32 master parameters that an optimizer updates.

    Usage: `master = MasterWeights(model)`; build the optimizer over `master.param_groups(groups)`; after
    `loss.backward()` call `master.grads_to_master()`, clip and step the optimizer over the masters, then
    `master.master_to_model()`.
    """

    def __init__(self, model: nn.Module, *, dtype: torch.dtype = torch.bfloat16) -> None:
        self.model_params = [p for p in model.parameters() if p.requires_grad]
        self.master_params = [nn.Parameter(p.detach().float().clone()) for p in self.model_params]
        self._by_id = {id(p): m for p, m in zip(self.model_params, self.master_params, strict=True)}
        model.to(dtype)

    def param_groups(self, groups: list[dict]) -> list[dict]:
        """Optimizer groups over the model's parameters -> the same groups over their master copies."""
        return [{**group, "params": [self._by_id[id(p)] for p in group["params"]]} for group in groups]

    @torch.no_grad()
    def grads_to_master(self) -> None:
        for param, master in zip(self.model_params, self.master_params, strict=True):
            master.grad = None if param.grad is None else param.grad.float()
            param.grad = None

    @torch.no_grad()
    def master_to_model(self) -> None:
        for param, master in zip(self.model_params, self.master_params, strict=True):
            param.copy_(master)

    def step(self, optimizer: torch.optim.Optimizer, clip: Callable[[list[nn.Parameter]], object] | None = None):
        """grads to fp32, optional clipping of the master grads, optimizer step, weights back to the model."""
        self.grads_to_master()
        result = clip(self.master_params) if clip is not None else None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.master_to_model()
        return result
