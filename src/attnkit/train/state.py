"""The run directory: checkpoints that survive a crash at any moment, and the state a resumed run continues from.

    runs/NAME/
        config.json  model.safetensors           the latest checkpoint (what `attnkit.load(run_dir)` reads) ...
        optimizer.safetensors  train_state.json  ... with its optimizer moments, step, RNG states, data position
        tokenizer/  task.json  labels.json       the tokenizer, the task, the label list (classify only)
        metrics.jsonl  plots/loss.png            one JSON line per step and per evaluation; the loss curves
        checkpoints/step_000200/ ...             the last `keep` checkpoints, each complete (the files above)
        best/                                    the checkpoint with the best validation score

A checkpoint is written whole into a hidden temporary directory and renamed into `checkpoints/` (a rename is
atomic), so a checkpoint directory is either complete or absent. The top level and `best/` then take hard links
to its files, each swapped in by rename, `train_state.json` last; nothing is ever modified in place, so a link
never sees a later write. Tensors are safetensors, everything else JSON: loading runs no code.

Public API: `save_checkpoint`, `find_checkpoint`, `load_checkpoint`, `read_task`, `optimizer_tensors`,
`load_optimizer_tensors`, `seed_all`, `capture_rng`, `restore_rng`, `config_differences`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnkit.checkpoint import (
    LABELS_FILE,
    TOKENIZER_DIR,
    atomic_write,
    load_model,
    load_tensors,
    save_model,
    save_tensors,
)
from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError
from attnkit.tokenize import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

TRAIN_STATE_FILE = "train_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
TASK_FILE = "task.json"
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
STATE_FORMAT = 1


@dataclass
class Checkpoint:
    """What `load_checkpoint` returns: everything a resumed run (or an inference tool) needs."""

    path: Path
    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    task: dict[str, Any]  # task.json: {"task": "lm" | "translate" | "classify", ...}
    labels: list[str] | None  # classify only: index = class id
    train_state: dict[str, Any]
    optimizer: dict[str, Tensor]  # see `optimizer_tensors`

    @property
    def step(self) -> int:
        return int(self.train_state["step"])


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(
    run_dir: str | Path,
    *,
    model: nn.Module,
    config: ModelConfig,
    optimizer: torch.optim.Optimizer,
    tokenizer: Tokenizer,
    task: dict[str, Any],
    train_state: dict[str, Any],
    labels: list[str] | None = None,
    keep: int = 3,
    best: bool = False,
) -> Path:
    """Write checkpoint `checkpoints/step_XXXXXX` for `train_state["step"]`, point the top level (and `best/`
    when `best`) at it, and delete all but the newest `keep` checkpoints. Returns the checkpoint's path.
    """
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least the latest checkpoint must be kept")
    run_dir = Path(run_dir)
    final = run_dir / CHECKPOINTS_DIR / checkpoint_name(int(train_state["step"]))
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, config, tmp)
    save_tensors(optimizer_tensors(optimizer), tmp / OPTIMIZER_FILE, metadata={"step": str(train_state["step"])})
    tokenizer.save(tmp / TOKENIZER_DIR)
    atomic_write(tmp / TASK_FILE, _json(task))
    if labels is not None:
        atomic_write(tmp / LABELS_FILE, _json({"labels": labels}))
    atomic_write(tmp / TRAIN_STATE_FILE, _json({"format": STATE_FORMAT, **train_state}))
    _replace_dir(tmp, final)
    _mirror(final, run_dir)
    if best:
        _mirror_dir(final, run_dir / BEST_DIR)
    _prune(run_dir / CHECKPOINTS_DIR, keep)
    return final


def checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint to resume from: a run directory's newest checkpoint, or `path` itself when it is one
    (`runs/NAME/best`, `runs/NAME/checkpoints/step_000200`). Raises CheckpointError when there is none.
    """
    path = Path(path)
    found = checkpoints(path)
    if found:
        return found[-1]
    if (path / TRAIN_STATE_FILE).is_file():
        return path
    raise CheckpointError(
        f"nothing to resume in {path}: it holds no {CHECKPOINTS_DIR}/step_* and no {TRAIN_STATE_FILE}; "
        f"point --resume at a run directory written by `attnkit train`, or drop --resume to start afresh"
    )


def read_task(directory: str | Path) -> dict[str, Any]:
    """The task a run or checkpoint was trained for: `{"task": "lm" | "translate" | "classify", ...}`."""
    return _read_json(Path(directory) / TASK_FILE)


def load_checkpoint(path: str | Path, *, device: torch.device | str | None = None) -> Checkpoint:
    """Load a checkpoint directory (see `find_checkpoint`) with its model on `device`, in float32."""
    path = Path(path)
    model, config = load_model(path, device=device)
    model.train()
    labels_path = path / LABELS_FILE
    state = _read_json(path / TRAIN_STATE_FILE)
    if state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path / TRAIN_STATE_FILE} has format {state.get('format')!r}; expected {STATE_FORMAT}")
    return Checkpoint(
        path=path,
        model=model,
        config=config,
        tokenizer=load_tokenizer(path / TOKENIZER_DIR),
        task=read_task(path),
        labels=_read_json(labels_path)["labels"] if labels_path.is_file() else None,
        train_state=state,
        optimizer=load_tensors(path / OPTIMIZER_FILE),
    )


# Optimizer state by parameter name ---------------------------------------------------------------------------
def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """Each parameter's optimizer state as `{name}/{key}` tensors (AdamW: step, exp_avg, exp_avg_sq).

    Needs parameter groups carrying `names` (see `optim.param_groups`); names survive a rebuilt model, where
    the optimizer's own integer ids would silently pair state with the wrong parameter.
    """
    out: dict[str, Tensor] = {}
    for group in optimizer.param_groups:
        for name, param in zip(group["names"], group["params"], strict=True):
            for key, value in optimizer.state.get(param, {}).items():
                out[f"{name}/{key}"] = value if isinstance(value, Tensor) else torch.tensor(value)
    return out


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], *, source: str) -> None:
    """Put the state saved by `optimizer_tensors` back, checking every parameter's state is there."""
    expected = {name for group in optimizer.param_groups for name in group["names"]}
    saved = {key.rpartition("/")[0] for key in tensors}
    if saved and saved != expected:
        missing, unexpected = sorted(expected - saved), sorted(saved - expected)
        raise CheckpointError(
            f"{source} holds optimizer state for other parameters (missing: {missing[:5]}, unexpected: "
            f"{unexpected[:5]}); it belongs to a different model"
        )
    for group in optimizer.param_groups:
        for name, param in zip(group["names"], group["params"], strict=True):
            state = {key.rpartition("/")[2]: t for key, t in tensors.items() if key.rpartition("/")[0] == name}
            if state:
                optimizer.state[param] = {
                    k: v.to(param.device) if k != "step" else v.to(torch.float32) for k, v in state.items()
                }


# Random number generators ------------------------------------------------------------------------------------
def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (the start of a run; a resumed run restores them)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """The global RNG states (Python, NumPy, torch CPU and CUDA) as JSON-ready values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": encode_tensor(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [encode_tensor(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(decode_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([decode_tensor(s) for s in state["cuda"]])


def encode_tensor(tensor: Tensor) -> str:
    """A uint8 tensor (an RNG state) as base64 text."""
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def decode_tensor(text: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


# Comparing what a resumed run asks for with what the checkpoint holds ----------------------------------------
def config_differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """`field: saved -> requested` for every field whose value differs (missing fields count as None)."""
    return [
        f"{key}: {saved.get(key)!r} -> {requested.get(key)!r}"
        for key in sorted(set(saved) | set(requested))
        if saved.get(key) != requested.get(key)
    ]


# Files -------------------------------------------------------------------------------------------------------
def _json(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; is {path.parent} a checkpoint written by `attnkit train`?") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); the file is damaged") from None


def _link(src: Path, dst: Path) -> None:
    """Make `dst` the same file as `src` (a hard link, or a copy where links are impossible), atomically."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _mirror(checkpoint: Path, target: Path) -> None:
    """Point `target`'s copies of the checkpoint's files at the checkpoint; train_state.json last."""
    files = sorted(p.relative_to(checkpoint) for p in checkpoint.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == TRAIN_STATE_FILE)
    for relative in files:
        _link(checkpoint / relative, target / relative)
    if not (checkpoint / LABELS_FILE).exists():
        (target / LABELS_FILE).unlink(missing_ok=True)


def _mirror_dir(checkpoint: Path, target: Path) -> None:
    """Make directory `target` a copy (by links) of `checkpoint`, swapped in by rename."""
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _mirror(checkpoint, tmp)
    _replace_dir(tmp, target)


def _replace_dir(new: Path, target: Path) -> None:
    """Rename `new` to `target`; an existing `target` is moved aside first and deleted after."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def _prune(folder: Path, keep: int) -> None:
    for stale in checkpoints(folder.parent)[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)
        log.debug("removed old checkpoint %s", stale)


def remove_checkpoints_after(run_dir: str | Path, step: int) -> list[Path]:
    """Delete the run's checkpoints newer than `step` (a run resumed from an earlier checkpoint forks there)."""
    removed = [p for p in checkpoints(run_dir) if int(p.name[5:]) > step]
    for path in removed:
        shutil.rmtree(path)
    return removed
