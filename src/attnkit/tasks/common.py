"""What several tasks share: walking a bucketed data set epoch after epoch, a generator's state as text, the
`synthetic:NAME` data sets, holding out a validation split, an evaluation's share of the ranks and its summed
negative log-likelihood, and the refusal of a model's outputs that are nan (`broken_outputs`, which decoding in
`attnkit.generate` raises too)."""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data import IGNORE_INDEX, SyntheticTask, make_task
from attnkit.errors import BrokenOutputs, CheckpointError

SYNTHETIC = "synthetic:"  # `--data synthetic:NAME` names a generated task (`attnkit.data.synthetic`)
SYNTHETIC_SIZES = (20_000, 500)  # train, validation examples of a synthetic task


class Shard(Protocol):
    """The ranks an evaluation is split over: rank `rank` of `size` scores items i with i % size == rank, and the
    metrics come from statistics summed over the ranks (`attnkit.train.distributed.SingleProcess` and its DDP and
    FSDP2 subclasses are shards)."""

    rank: int
    size: int

    def sum(self, *values: float) -> list[float]: ...


@dataclass(frozen=True)
class OneProcess:
    """The shard of one process: every item, sums as they are."""

    rank: int = 0
    size: int = 1

    def sum(self, *values: float) -> list[float]:
        return list(values)


ONE_PROCESS = OneProcess()


def rows_of(shard: Shard, n_rows: int, first: int) -> tuple[list[int], bool]:
    """The rows of a batch of `n_rows` items, the first being item `first` of the evaluation, that `shard` scores,
    and whether they count. A rank with none takes row 0 and counts it not: under FSDP2 every rank runs every forward
    pass (the weights are all-gathered inside it), so all ranks score as many batches."""
    rows = [r for r in range(n_rows) if (first + r) % shard.size == shard.rank]
    return (rows, True) if rows else ([0], False)


def take_rows(batch: Any, rows: slice | list[int]) -> Any:
    """Rows of a batch: a tuple of tensors (lm, mlm) or a dataclass of tensors (PairBatch, LabelledBatch)."""
    if isinstance(batch, tuple):
        return tuple(t[rows] for t in batch)  # (B, ...) -> (rows, ...)
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name)[rows] for f in dataclasses.fields(batch)})


FP16_OVERFLOW_FIX = ("; in fp16 the activations may overflow (past 65504): load the run in bf16 or fp32 (dtype=, "
                     "--dtype bf16)")


def broken_outputs(message: str, model: nn.Module) -> BrokenOutputs:
    """BrokenOutputs saying `message`, and in fp16 the likely cause and its fix."""
    half = next(model.parameters()).dtype == torch.float16
    return BrokenOutputs(message + (FP16_OVERFLOW_FIX if half else ""))


def check_outputs(probs: Tensor, model: nn.Module, *, what: str) -> None:
    """BrokenOutputs (`broken_outputs`) when `probs` (a model's probabilities, any shape) hold nan, which would
    otherwise pass for a prediction; `what` names the inputs."""
    if probs.isnan().any():
        raise broken_outputs(f"the model's outputs for {what} are nan, no probabilities: the model's weights or its "
                             "input are broken", model)


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def encode_tensor(tensor: Tensor) -> str:
    """A uint8 tensor (an RNG state) as base64 text."""
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def decode_tensor(text: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def synthetic_split(data: Any, seed: int) -> tuple[SyntheticTask, SyntheticTask] | None:
    """(training, validation): the generated task the data settings name (`synthetic:NAME`), `SYNTHETIC_SIZES`
    examples each, the validation set drawn from `seed + 1`; None where they name files."""
    name = synthetic_name(data)
    if name is None:
        return None
    n_train, n_val = SYNTHETIC_SIZES
    return make_task(name, n_train, seed), make_task(name, n_val, seed + 1)


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
        """Go on from `state` (`data_state`, read by `epoch_position`). Raises CheckpointError for one that is no
        such position."""
        position = epoch_position(state)
        if position is None:
            raise CheckpointError(f"the saved data position {state!r:.80} is no {{'epoch': E, 'index': I}} of whole "
                                  "numbers: the train state is damaged; resume from another checkpoint")
        self.epoch, self.index = position


def epoch_position(state: dict[str, Any]) -> tuple[int, int] | None:
    """(epoch, batches drawn of it) from a task's saved data state (`EpochTask.data_state`); None for a task whose
    data state is no such position (a token stream's, or one a task of one's own keeps), or is damaged: a count that
    is negative or not whole (numbers written as text are read)."""
    try:
        position = int(state["epoch"]), int(state["index"])
        whole = all(float(state[key]) == count for key, count in zip(("epoch", "index"), position, strict=True))
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: infinity, or beyond a float
        return None
    return position if whole and min(position) >= 0 else None


def summed_nll(logits: Tensor, labels: Tensor) -> float:
    """The negative log-likelihood of `labels` (...) under `logits` (..., V), summed over the targets that are not
    IGNORE_INDEX: what an evaluation's loss and perplexity are of. Training's loss may be label-smoothed (the model's
    `label_smoothing`; Szegedy et al. 2016) and is then no likelihood, so evaluations score from the logits, as
    fairseq reports nll_loss beside its smoothed loss."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1).to(logits.device),
                           ignore_index=IGNORE_INDEX, reduction="sum").item()
