"""The optimizer and the learning-rate schedules.

AdamW (Loshchilov & Hutter 2019) decays only the weight matrices of linear maps: norms' gains, biases and
embedding tables are left alone, as in GPT-2 and BERT practice; a position scheme says itself whether its
parameters decay (`PositionScheme.weight_decay`; position tables do not).

Schedules give the learning rate at an optimizer step, as a multiple of the peak rate `lr`:

    constant   lr after a linear warmup
    cosine     linear warmup, then half a cosine from lr down to min_lr_ratio * lr at the end of training
    noam       Vaswani et al. 2017, 5.3: proportional to min(step^-0.5, step * warmup^-1.5), scaled so that its
               peak (at step = warmup) equals lr: rises linearly, then decays as 1 / sqrt(step)
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn

from attnkit.errors import ConfigError
from attnkit.layers.positions import PositionScheme

Schedule = Literal["cosine", "noam", "constant"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict]:
    """Two AdamW groups: weight matrices with `weight_decay`, everything else (norms, biases, embeddings) without.

    Each group carries `names` (the parameters' names, in order) so optimizer state can be saved by name.
    Tied parameters appear once, under their first name.
    """
    no_decay_ids = {id(p) for m in model.modules() if _no_decay(m) for p in m.parameters()}
    decay: dict[str, nn.Parameter] = {}
    plain: dict[str, nn.Parameter] = {}
    for name, param in model.named_parameters():  # named_parameters yields a shared parameter only once
        if not param.requires_grad:
            continue
        (plain if param.dim() < 2 or id(param) in no_decay_ids else decay)[name] = param
    return [
        {"params": list(decay.values()), "names": list(decay), "weight_decay": weight_decay},
        {"params": list(plain.values()), "names": list(plain), "weight_decay": 0.0},
    ]


def _no_decay(module: nn.Module) -> bool:
    """Token tables, and position schemes that say their parameters take no decay."""
    return isinstance(module, nn.Embedding) or (isinstance(module, PositionScheme) and not module.weight_decay)


def make_optimizer(
    model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
) -> torch.optim.AdamW:
    """AdamW over `param_groups(model)`; `lr` is the peak rate the schedule scales."""
    if lr <= 0:
        raise ConfigError(f"lr={lr} must be positive (1e-3 suits small models, 3e-4 larger ones)")
    if weight_decay < 0:
        raise ConfigError(f"weight_decay={weight_decay} must be >= 0 (0.1 is usual; 0 disables it)")
    # fused: one kernel per parameter tensor updates moments and weights in one pass over memory (CPU and CUDA);
    # it is deterministic, so a resumed run still continues bit for bit
    return torch.optim.AdamW(param_groups(model, weight_decay=weight_decay), lr=lr, betas=betas, fused=True)


def lr_factor(schedule: str, step: int, *, warmup: int, progress: float, min_lr_ratio: float = 0.1) -> float:
    """The learning-rate multiplier (of the peak `lr`) at optimizer step `step` (1-based).

    `progress` is the fraction of the post-warmup budget used, in [0, 1]; only `cosine` reads it.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup < 0:
        raise ConfigError(f"warmup={warmup} must be >= 0 steps")
    step = max(step, 1)
    if schedule == "noam":
        # lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); d_model^-0.5 * warmup^-0.5 is its peak, so
        # the paper's rates come back with lr = (d_model * warmup)^-0.5 (7e-4 for d_model 512, warmup 4000)
        warmup = max(warmup, 1)
        return min(step**-0.5, step * warmup**-1.5) * warmup**0.5
    if step <= warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
