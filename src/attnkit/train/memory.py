"""Will the model fit? The memory training needs at least, against the memory free, checked before allocating.

Training in fp32 with AdamW holds, per parameter: the weight (4 bytes), its gradient (4) and the two moments (8),
16 bytes in all, plus a bf16 compute copy (2) under `bf16-master` (precision.py); activations come on top, so the
estimate is a floor. A frozen parameter (LoRA's base weights, `--freeze body`: train/finetune.py) holds its weight
alone, 4 bytes (and its bf16 copy); the head and LoRA's adapters still train, at 16. A frozen copy of the starting
weights held beside the model (DPO's reference without LoRA: tasks/dpo.py) adds 4 bytes a parameter. A model whose
floor exceeds the free memory would be killed by the OS (or run out of CUDA memory) part-way through its first step,
so it is refused at once with both numbers; `--force` starts it anyway.
"""

from __future__ import annotations

import torch

from attnkit.errors import ConfigError
from attnkit.machine import free_bytes, gib

BYTES_PER_PARAMETER = {"fp32": 16, "bf16": 16, "bf16-master": 18}  # weights + gradients + AdamW moments (+ copy)
TRAINING_BYTES = 12  # of those, what a parameter that trains adds to its weight: its gradient and AdamW's moments
REFERENCE_BYTES = 4  # a parameter of a frozen fp32 copy of the weights (`Source.frozen_model`)


def training_bytes(n_parameters: int, dtype: str, *, frozen: int = 0, reference: int = 0) -> int:
    """The memory training takes at least: the weights, gradients and AdamW state (no activations); `frozen`: how
    many of the parameters are frozen, which hold their weights alone; `reference`: the parameters of a frozen copy
    held beside the model."""
    return n_parameters * BYTES_PER_PARAMETER.get(dtype, 16) - frozen * TRAINING_BYTES + reference * REFERENCE_BYTES


def check_fits(n_parameters: int, dtype: str, device: torch.device, *, force: bool = False, frozen: int = 0,
               reference: int = 0) -> None:
    """Raise ConfigError when training `n_parameters` in `dtype`, `frozen` of them frozen, beside a frozen copy of
    `reference` parameters (`training_bytes`), cannot fit in the memory free on `device`."""
    need, free = training_bytes(n_parameters, dtype, frozen=frozen, reference=reference), free_bytes(device)
    if force or free is None or need <= free:
        return
    held = ("weights, and gradients and AdamW state of those that train" if frozen
            else "weights, gradients and AdamW state")
    copy = ", a frozen reference copy of the weights" if reference else ""
    raise ConfigError(
        f"the model has {n_parameters:,} parameters: training it needs at least {gib(need)} ({held}{copy}, before "
        f"activations) but {device.type} has {gib(free)} free. Choose a smaller model (--preset, --set "
        f"n_layers=..., d_model=...), or pass --force to start anyway"
    )
