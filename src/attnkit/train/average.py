"""Checkpoint averaging: the mean of the weights of a run's last N checkpoints, written as a model of its own.

Vaswani et al. (2017, section 6.1) average the last 5 checkpoints of the base model (written 10 minutes apart)
and the last 20 of the big one. Late in training the weights wander around a minimum with the noise of the last
batches; their mean sits nearer its middle (Polyak averaging, taken after the fact), which scores better than
any one checkpoint, at no training cost.

    RUN/checkpoints/step_004500 ... step_005500      (the last N, same config and tensor names)
        -> mean of each tensor (accumulated in float64, stored in the checkpoints' dtype)
        -> OUT: config.json, model.safetensors, tokenizer/, task.json (labels.json), averaged.json, checksums.json

A LoRA run's checkpoints are averaged with their adapters folded into the weights (W + alpha / r * B A, then the
mean), so OUT is a whole model: the mean of the products B A is not the product of the means.

OUT loads like any run (`attnkit translate --run OUT`, `attnkit eval --run OUT`, `attnkit.load(OUT)`); it is
not a training checkpoint (no optimizer state) and cannot be resumed. `averaged.json` names the checkpoints.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.checkpoint import (
    ADAPTERS_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    LABELS_FILE,
    TASK_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    atomic_write,
    checkpoint_dirs,
    digest,
    load_tensors,
    merge_adapter_file,
    read_json,
    save_tensors,
    verify_files,
    write_checksums,
)
from attnkit.errors import CheckpointError, ConfigError, InputError
from attnkit.machine import free_bytes, gib

AVERAGE_FILE = "averaged.json"  # {"checkpoints": [paths], "steps": [ints]}
COPIED = (CONFIG_FILE, TASK_FILE, LABELS_FILE)  # files taken from the newest checkpoint as they are


@dataclass(frozen=True)
class AverageSettings:
    """`attnkit average`'s options."""

    run: str = field(metadata={"positional": True})
    """a training run directory (it holds checkpoints/step_*)"""
    last: int = 5  # how many of the newest checkpoints to average
    out: str | None = None  # where the averaged model goes; none: RUN/average-last-N

    def __post_init__(self) -> None:
        if isinstance(self.last, bool) or not isinstance(self.last, int) or self.last < 1:
            raise ConfigError(f"last={self.last!r} must be a positive number of checkpoints (e.g. 5)")


def average_tensors(states: list[dict[str, Tensor]], names: list[str]) -> dict[str, Tensor]:
    """The elementwise mean of each tensor over `states` (floating tensors; others must be equal in all).

    `names` label the states in errors. Raises CheckpointError naming the tensors whose names, shapes or dtypes
    differ between the states.
    """
    first = states[0]
    for state, name in zip(states[1:], names[1:], strict=True):
        problems = [f"only in {names[0]}: {k}" for k in sorted(set(first) - set(state))]
        problems += [f"only in {name}: {k}" for k in sorted(set(state) - set(first))]
        problems += [f"{k}: {tuple(first[k].shape)} {first[k].dtype} vs {tuple(state[k].shape)} {state[k].dtype}"
                     for k in sorted(set(first) & set(state))
                     if first[k].shape != state[k].shape or first[k].dtype != state[k].dtype]
        problems += [f"{k}: integer tensors differ" for k in sorted(set(first) & set(state))
                     if not first[k].is_floating_point() and first[k].shape == state[k].shape
                     and not torch.equal(first[k], state[k])]
        if problems:
            raise CheckpointError(f"cannot average {names[0]} with {name}, the tensors do not match:\n  "
                                  + "\n  ".join(problems[:20]) + "\naverage checkpoints of one run only")
    mean: dict[str, Tensor] = {}
    for key, tensor in first.items():
        if tensor.is_floating_point():
            total = sum(state[key].to(torch.float64) for state in states)
            mean[key] = (total / len(states)).to(tensor.dtype)
        else:
            mean[key] = tensor
    return mean


def average_run(run: str | Path, *, last: int = 5, out: str | Path | None = None) -> Path:
    """Average the weights of the newest `last` checkpoints of `run` into `out` (default RUN/average-last-N).

    Every file read is checked against its checksums. Raises InputError when the run has fewer checkpoints,
    CheckpointError when their configs or tensors differ (naming them) or a file is damaged, and InputError when
    `out` holds something other than an earlier average. Returns `out`.
    """
    run = Path(run)
    found = checkpoint_dirs(run)
    if not found:
        raise InputError(f"{run} holds no {CHECKPOINTS_DIR}/step_*: give a run directory written by attnkit train")
    if last > len(found):
        held = f"{len(found)} checkpoint{'s' * (len(found) > 1)}"
        raise InputError(f"--last {last}: {run} holds only {held} ({found[0].name} to {found[-1].name}); average at "
                         f"most {len(found)}, or train with checkpoints saved more often (--eval-every) and more of "
                         "them kept (--keep)")
    chosen = found[-last:]
    out = Path(out) if out is not None else run / f"average-last-{last}"
    if out.exists() and not (out / AVERAGE_FILE).is_file() and any(out.iterdir()):
        raise InputError(f"{out} exists and is not an earlier average; choose another --out")
    _check_fits(chosen)
    states, configs = [], []
    for checkpoint in chosen:
        verify_files(checkpoint, [CONFIG_FILE, WEIGHTS_FILE])
        tensors = load_tensors(checkpoint / WEIGHTS_FILE)
        if (checkpoint / ADAPTERS_FILE).exists():  # LoRA: the mean of the merged weights, as the mean of the
            verify_files(checkpoint, [ADAPTERS_FILE])  # updates B A is not the product of the means of B and A
            tensors = merge_adapter_file(tensors, checkpoint / ADAPTERS_FILE)
        states.append(tensors)
        configs.append(read_json(checkpoint / CONFIG_FILE))
    verify_files(chosen[-1])  # the tokenizer and task files are copied from the newest
    _check_configs(configs, [str(c) for c in chosen])
    mean = average_tensors(states, [str(c) for c in chosen])
    _write(out, chosen, mean)
    return out


def _check_fits(chosen: list[Path]) -> None:
    """InputError when the checkpoints' weights and their mean cannot all be in the memory free at once."""
    sizes = [(c / WEIGHTS_FILE).stat().st_size if (c / WEIGHTS_FILE).is_file() else 0 for c in chosen]
    need, free = sum(sizes) + max(sizes), free_bytes(torch.device("cpu"))
    if free is not None and need > free:
        raise InputError(f"averaging {len(chosen)} checkpoints holds their weights and the mean in memory at once, "
                         f"{gib(need)}, but {gib(free)} is free: average fewer (--last)")


def _check_configs(configs: list[dict[str, Any]], names: list[str]) -> None:
    for config, name in zip(configs[1:], names[1:], strict=True):
        differ = sorted(k for k in set(config) | set(configs[0]) if config.get(k) != configs[0].get(k))
        if differ:
            raise CheckpointError(f"cannot average {names[0]} with {name}: their configs differ in "
                                  f"{', '.join(differ)}; average checkpoints of one run only")


def _write(out: Path, chosen: list[Path], mean: dict[str, Tensor]) -> None:
    """Build the average beside `out`, then swap it in (an earlier average is replaced)."""
    newest = chosen[-1]
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_tensors(mean, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        for name in COPIED:
            if (newest / name).is_file():
                shutil.copyfile(newest / name, tmp / name)
        shutil.copytree(newest / TOKENIZER_DIR, tmp / TOKENIZER_DIR)
        steps = [int(c.name.removeprefix("step_")) for c in chosen]
        atomic_write(tmp / AVERAGE_FILE, json.dumps({"checkpoints": [str(c) for c in chosen], "steps": steps},
                                                    indent=1) + "\n")
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        write_checksums(tmp, {p.relative_to(tmp).as_posix(): digest(p) for p in files})
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
