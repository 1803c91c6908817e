"""Will the model fit? The memory training needs at least, against the memory free, checked before allocating.

Training in fp32 with AdamW holds, per parameter: the weight (4 bytes), its gradient (4) and the two moments (8),
16 bytes in all, plus a bf16 compute copy (2) under `bf16-master` (precision.py); activations come on top, so the
estimate is a floor. A frozen parameter (LoRA's base weights, `--freeze body`: train/finetune.py) holds its weight
alone, 4 bytes (and its bf16 copy); the head and LoRA's adapters still train, at 16. A model whose floor exceeds
the free memory would be killed by the OS (or run out of CUDA memory) part-way through its first step, so it is
refused at once with both numbers; `--force` starts it anyway.
"""

from __future__ import annotations

import torch

from attnkit.errors import ConfigError
from attnkit.machine import free_bytes, gib

BYTES_PER_PARAMETER = {"fp32": 16, "bf16": 16, "bf16-master": 18}  # weights + gradients + AdamW moments (+ copy)
TRAINING_BYTES = 12  # of those, what a parameter that trains adds to its weight: its gradient and AdamW's moments


def training_bytes(n_parameters: int, dtype: str, *, frozen: int = 0) -> int:
    """The memory training takes at least: the weights, gradients and AdamW state (no activations); `frozen`: how
    many of the parameters are frozen, which hold their weights alone."""
    return n_parameters * BYTES_PER_PARAMETER.get(dtype, 16) - frozen * TRAINING_BYTES


def check_fits(n_parameters: int, dtype: str, device: torch.device, *, force: bool = False, frozen: int = 0) -> None:
    """Raise ConfigError when training `n_parameters` in `dtype`, `frozen` of them frozen (`training_bytes`), cannot
    fit in the memory free on `device`."""
    need, free = training_bytes(n_parameters, dtype, frozen=frozen), free_bytes(device)
    if force or free is None or need <= free:
        return
    held = ("weights, and gradients and AdamW state of those that train, before activations" if frozen
            else "weights, gradients and AdamW state, before activations")
    raise ConfigError(
        f"the model has {n_parameters:,} parameters: training it needs at least {gib(need)} ({held}) but "
        f"{device.type} has {gib(free)} free. Choose a smaller model (--preset, --set n_layers=..., d_model=...), or "
        f"pass --force to start anyway"
    )
