"""Will the model fit? The memory training needs at least, against the memory free, checked before allocating.

Training in fp32 with AdamW holds, per parameter: the weight (4 bytes), its gradient (4) and the two moments (8),
16 bytes in all, plus a bf16 compute copy (2) under `bf16-master` (precision.py); activations come on top, so the
estimate is a floor. A model whose floor exceeds the free memory would be killed by the OS (or run out of CUDA
memory) part-way through its first step, so it is refused at once with both numbers; `--force` starts it anyway.
"""

from __future__ import annotations

import torch

from attnkit.errors import ConfigError
from attnkit.machine import free_bytes, gib

BYTES_PER_PARAMETER = {"fp32": 16, "bf16": 16, "bf16-master": 18}  # weights + gradients + AdamW moments (+ copy)


def training_bytes(n_parameters: int, dtype: str) -> int:
    """The memory training takes at least: the weights, gradients and AdamW state (no activations)."""
    return n_parameters * BYTES_PER_PARAMETER.get(dtype, 16)


def check_fits(n_parameters: int, dtype: str, device: torch.device, *, force: bool = False) -> None:
    """Raise ConfigError when training `n_parameters` in `dtype` cannot fit in the memory free on `device`."""
    need, free = training_bytes(n_parameters, dtype), free_bytes(device)
    if force or free is None or need <= free:
        return
    raise ConfigError(
        f"the model has {n_parameters:,} parameters: training it needs at least {gib(need)} (weights, gradients and "
        f"AdamW state, before activations) but {device.type} has {gib(free)} free. Choose a smaller model "
        f"(--preset, --set n_layers=..., d_model=...), or pass --force to start anyway"
    )
