"""What several tasks share: walking a bucketed data set epoch after epoch, a generator's state as text, the
`synthetic:NAME` data sets, and holding out a validation split."""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch import Tensor, nn

SYNTHETIC = "synthetic:"  # `--data synthetic:NAME` names a generated task (`attnkit.data.synthetic`)
SYNTHETIC_SIZES = (20_000, 500)  # train, validation examples of a synthetic task


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def encode_tensor(tensor: Tensor) -> str:
    """A uint8 tensor (an RNG state) as base64 text."""
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def decode_tensor(text: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def synthetic_name(data: Any) -> str | None:
    """NAME when the data settings name one generated data set, `synthetic:NAME`; else None."""
    if len(data.data) == 1 and data.data[0].startswith(SYNTHETIC):
        return data.data[0][len(SYNTHETIC):]
    return None


def split(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """Hold out `fraction` of `examples` (a seeded random choice) for validation."""
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, int(len(examples) * fraction))
    return [examples[i] for i in sorted(order[n_val:])], [examples[i] for i in sorted(order[:n_val])]


class EpochTask:
    """Walks the batches of a bucketed data set epoch after epoch; the position is (epoch, index)."""

    def __init__(self, train: Any) -> None:
        self.train = train
        self.epoch, self.index = 0, 0

    def next_batch(self) -> Any:
        if self.index >= len(self.train.batch_order(self.epoch)):
            self.epoch, self.index = self.epoch + 1, 0
        batch = self.train.batch(self.epoch, self.index)
        self.index += 1
        return batch

    def data_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def mean_loss(task: Any, model: nn.Module, batches) -> float:
    """Loss over `batches`, each weighted by its number of targets (`task.loss`, `task.weight`)."""
    total, count = 0.0, 0
    for batch in batches:
        n = task.weight(batch)
        total += task.loss(model, batch).item() * n
        count += n
    return total / count
