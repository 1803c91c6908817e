"""The run directory: checkpoints that survive a crash at any moment, and the state a resumed run continues from.

    runs/NAME/
        config.json  model.safetensors           the latest checkpoint (what `attnkit.load(run_dir)` reads) ...
        optimizer.safetensors  train_state.json  ... with its optimizer moments, step, RNG states, data position
        tokenizer/  task.json  labels.json       the tokenizer, the task, the label list (classify, tag)
        metrics.jsonl  plots/loss.png            one JSON line per step and per evaluation; the loss curves
        checkpoints/step_000200/ ...             the last `keep` checkpoints, each complete (the files above)
        best/                                    the checkpoint with the best validation score

A checkpoint is written whole into a hidden temporary directory and renamed into `checkpoints/` (a rename is
atomic), so a checkpoint directory is either complete or absent. Its `checksums.json` holds the SHA-256 of every
other file; loading checks them, and a resumed run skips (and names) damaged checkpoints for the newest intact one.
The top level and `best/` then take copies of its files (reflinks where the file system shares blocks
copy-on-write), each swapped in by rename, `checksums.json` last: they share no storage with the checkpoint, so
one file damaged in place never reaches two copies. A save (or a run) first cleans what an interrupted one left:
hidden `.*.tmp` files and directories are removed, and a `.best.old` whose `best/` is missing is put back.
Tensors are safetensors, everything else JSON: loading runs no code.

Public API: `save_checkpoint`, `find_checkpoint`, `load_checkpoint`, `resume_checkpoint`, `read_task`,
`optimizer_tensors`, `load_optimizer_tensors`, `seed_all`, `capture_rng`, `restore_rng`, `config_differences`,
`clean_leftovers`, `later_best`, `mend_best`, `remove_checkpoints_after`.
"""

from __future__ import annotations

import fcntl
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

from attnkit.chat_format import DEFAULT_FORMAT, TEMPLATE_CONFIG, ChatTemplate
from attnkit.checkpoint import (
    ADAPTERS_FILE,
    BEST_DIR,
    CHECKPOINTS_DIR,
    CHECKSUMS_FILE,
    CONFIG_FILE,
    LABELS_FILE,
    OPTIMIZER_FILE,
    TASK_FILE,
    TOKENIZER_DIR,
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    atomic_write,
    digest,
    load_run_model,
    load_tensors,
    read_checksums,
    read_json,
    read_labels,
    save_model,
    save_tensors,
    verify_files,
    write_checksums,
    writing,
)
from attnkit.checkpoint import checkpoint_dirs as checkpoints
from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError
from attnkit.tasks.common import decode_tensor, encode_tensor
from attnkit.tokenize import Tokenizer, load_tokenizer
from attnkit.train.rundir import check_own_folders, drop_replaced, existing_run

log = logging.getLogger(__name__)

LEFTOVER_SUFFIXES = (".tmp", ".del")  # hidden files and directories of interrupted saves and removals
STATE_FORMAT = 1


@dataclass
class Checkpoint:
    """What `load_checkpoint` returns: everything a resumed run (or an inference tool) needs."""

    path: Path
    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    task: dict[str, Any]  # task.json: {"task": NAME, ...} (a task registered in attnkit.tasks)
    labels: list[str] | None  # classify only: index = class id
    train_state: dict[str, Any]
    optimizer: dict[str, Tensor]  # see `optimizer_tensors`
    fell_back: bool = False  # `resume_checkpoint` skipped newer, damaged checkpoints of the run to reach this one

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
    chat_template: ChatTemplate = DEFAULT_FORMAT,
) -> Path:
    """Write checkpoint `checkpoints/step_XXXXXX` for `train_state["step"]`, point the top level (and `best/`
    when `best`) at it, and delete all but the newest `keep` checkpoints; a `chat_template` of its own is written
    beside the tokenizer (tokenizer_config.json, as `chat_format.chat_template` reads it). Returns its path. Raises
    ConfigError, before anything is written, where one of the run's own folders is a link (`rundir.check_own_folders`).
    """
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least the latest checkpoint must be kept")
    run_dir = Path(run_dir)
    check_own_folders(run_dir)  # a folder made a link since the run began would take the writes and deletes below
    clean_leftovers(run_dir)
    final = run_dir / CHECKPOINTS_DIR / checkpoint_name(int(train_state["step"]))
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    kept = "; the checkpoints already saved are intact"
    try:
        with writing(run_dir, doing=f"saving checkpoint {final.name} in", note=kept):
            save_model(model, config, tmp)
            step = str(train_state["step"])
            save_tensors(optimizer_tensors(optimizer), tmp / OPTIMIZER_FILE, metadata={"step": step})
            tokenizer.save(tmp / TOKENIZER_DIR)
            if chat_template.source is not None:  # a template of its own (a converted chat model's) goes on with it
                atomic_write(tmp / TOKENIZER_DIR / TEMPLATE_CONFIG, _json(chat_template.settings()))
            atomic_write(tmp / TASK_FILE, _json(task))
            if labels is not None:
                atomic_write(tmp / LABELS_FILE, _json({"labels": labels}))
            atomic_write(tmp / TRAIN_STATE_FILE, _json({"format": STATE_FORMAT, **train_state}))
            digests = read_checksums(tmp)  # the model's files, hashed as save_model wrote them
            for path in sorted(tmp.rglob("*")):
                name = path.relative_to(tmp).as_posix()
                if path.is_file() and name != CHECKSUMS_FILE and name not in digests:
                    digests[name] = digest(path)
            write_checksums(tmp, digests)
            _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with writing(run_dir, doing=f"copying checkpoint {final.name} to the top of", note=kept):
        _mirror(final, run_dir)
    if best:  # cut short, the resume finishes it (`mend_best`)
        with writing(run_dir, doing=f"copying checkpoint {final.name} to best/ in",
                     note=f"{kept}; --resume copies it to best/"):
            _mirror_dir(final, run_dir / BEST_DIR)
    _prune(run_dir / CHECKPOINTS_DIR, keep)
    drop_replaced(run_dir)  # a run that --overwrite moved aside: this run now has a checkpoint of its own
    return final


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
    if killed_before_checkpoint(path):
        raise CheckpointError(f"nothing to resume in {path}: {stopped_early(path)}")
    if (path / WEIGHTS_FILE).is_file():
        raise CheckpointError(
            f"nothing to resume in {path}: it holds a model ({WEIGHTS_FILE}) but no training state (no "
            f"{TRAIN_STATE_FILE}: `attnkit convert` and `attnkit average` write none); train on from its weights in "
            f"a new run with --init-from {path} --out NEW_RUN"
        )
    raise CheckpointError(
        f"nothing to resume in {path}: it holds no {CHECKPOINTS_DIR}/step_* and no {TRAIN_STATE_FILE}; "
        f"point --resume at a run directory written by `attnkit train`, or drop --resume to start afresh"
    )


def has_checkpoint(path: str | Path) -> bool:
    """Whether `path` holds a checkpoint to resume from (`find_checkpoint` finds one)."""
    return bool(checkpoints(Path(path))) or (Path(path) / TRAIN_STATE_FILE).is_file()


def killed_before_checkpoint(path: str | Path) -> bool:
    """Whether `path` holds what a run stopped before its first checkpoint leaves: run files, but no checkpoint and
    no model (a model `attnkit convert` or `attnkit average` wrote holds its weights)."""
    path = Path(path)
    return bool(existing_run(path)) and not has_checkpoint(path) and not (path / WEIGHTS_FILE).is_file()


def stopped_early(run_dir: str | Path) -> str:
    """What to say of a run directory whose run stopped (killed, or failed) before its first checkpoint: its
    files (metrics.jsonl, ...) are all it left, so it starts again rather than resumes."""
    return (f"the run there ({', '.join(existing_run(run_dir)[:4])}) stopped before its first checkpoint; start it "
            f"again with --overwrite (in place of --resume), or choose another --out")


def read_task(directory: str | Path) -> dict[str, Any]:
    """The task a run or checkpoint was trained for: `{"task": NAME, ...} (a task registered in attnkit.tasks)`."""
    return read_json(Path(directory) / TASK_FILE)


def load_checkpoint(path: str | Path, *, device: torch.device | str | None = None) -> Checkpoint:
    """Load a checkpoint directory (see `find_checkpoint`) with its model on `device`, in float32, after checking
    every file against its `checksums.json`. A run directory whose top level is damaged or incomplete is read from
    its newest intact checkpoint (`checkpoint.load_run_model`). Raises CheckpointError naming a damaged file.
    """
    model, config, path = load_run_model(path, device=device)
    model_files = (CONFIG_FILE, WEIGHTS_FILE, ADAPTERS_FILE)  # checked by load_run_model
    verify_files(path, [name for name in read_checksums(path) if name not in model_files])
    model.train()
    state = checked_state(read_json(path / TRAIN_STATE_FILE), path / TRAIN_STATE_FILE)
    return Checkpoint(
        path=path,
        model=model,
        config=config,
        tokenizer=load_tokenizer(path / TOKENIZER_DIR),
        task=read_task(path),
        labels=read_labels(path),
        train_state=state,
        optimizer=load_tensors(path / OPTIMIZER_FILE),
    )


COUNTERS = ("step", "evaluated_step", "tokens_seen")  # train_state.json's counts, whole numbers from 0 up
NOT_YET = {"evaluated_step": -1}  # a counter's value before its first event (a save before any evaluation)


def checked_state(state: Any, path: Path) -> dict[str, Any]:
    """train_state.json's contents, checked before a run continues from them: an object of this format whose counters
    (`COUNTERS`; `step` at least) are whole numbers from 0 up (or `NOT_YET`'s value: -1 for a run saved before its
    first evaluation) and whose `elapsed` seconds a finite number from 0 up.
    A file read unverified (no checksums.json) may have been edited or cut short; CheckpointError names the field and
    the fix."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a JSON {type(state).__name__}, not the object a save writes; the file is "
                              "damaged: resume from a checkpoint of the run (--resume RUN/checkpoints/step_N)")
    if state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path} has format {state.get('format')!r}; expected {STATE_FORMAT}")
    given = {key: state.get(key) for key in (*COUNTERS, "elapsed") if key in state or key == "step"}
    bad = [f"{key}={value!r}" for key, value in given.items()
           if isinstance(value, bool) or not isinstance(value, int if key in COUNTERS else (int, float))
           or not (0 <= value < float("inf") or value == NOT_YET.get(key))]
    if bad:
        raise CheckpointError(f"{path} holds {', '.join(bad)}, where a save writes whole numbers of steps and tokens "
                              "and seconds from 0 up; the file is damaged or was edited: resume from a checkpoint of "
                              "the run (--resume RUN/checkpoints/step_N), or restore the file")
    return state


def resume_checkpoint(path: str | Path, *, device: torch.device | str | None = None) -> Checkpoint:
    """The checkpoint a resumed run continues from. For a run directory: its newest checkpoint that loads intact
    (the top level's copy last), each one skipped with a warning naming what is wrong; for a checkpoint directory
    (`runs/NAME/best`, `.../checkpoints/step_000200`): that one, refused when damaged. Raises CheckpointError when
    none is intact.
    """
    path = Path(path)
    found = checkpoints(path)
    if not found:
        return load_checkpoint(find_checkpoint(path), device=device)
    problems = []
    top = [path] if (path / TRAIN_STATE_FILE).is_file() else []  # the top level: a copy of the newest, checked too
    for candidate in [*reversed(found), *top]:
        try:
            checkpoint = load_checkpoint(candidate, device=device)
            checkpoint.fell_back = bool(problems)
            return checkpoint
        except CheckpointError as err:
            log.warning("skipping %s, which cannot be resumed: %s", candidate, err)
            problems.append(str(err))
    raise CheckpointError(
        f"no checkpoint of {path} is intact:\n  " + "\n  ".join(problems)
        + "\nStart a new run (--overwrite replaces this one, or choose another --out)"
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


FICLONE = 0x40049409  # Linux ioctl: the copy shares blocks copy-on-write (Btrfs, XFS), so a write never reaches both


def _copy(src: Path, dst: Path) -> None:
    """Make `dst` a copy of `src` that shares no storage with it (a reflink where possible), swapped in by rename."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        with open(src, "rb") as source, open(tmp, "wb") as target:
            try:
                fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
                cloned = True
            except OSError:  # ext4, tmpfs, another file system or OS: copy the bytes
                cloned = False
        if not cloned:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _mirror(checkpoint: Path, target: Path) -> None:
    """Make `target`'s copies of the checkpoint's files; `checksums.json` last, so a reader never trusts a mix.
    Files the previous copy had and this checkpoint lacks (labels.json, adapters) are removed."""
    try:
        previous = set(read_checksums(target))
    except CheckpointError:
        previous = set()
    files = sorted(p.relative_to(checkpoint) for p in checkpoint.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == CHECKSUMS_FILE)
    for stale in previous - {p.as_posix() for p in files}:
        (target / stale).unlink(missing_ok=True)
    if not (checkpoint / LABELS_FILE).exists():
        (target / LABELS_FILE).unlink(missing_ok=True)
    for relative in files:
        _copy(checkpoint / relative, target / relative)


def _mirror_dir(checkpoint: Path, target: Path) -> None:
    """Make directory `target` a copy of `checkpoint`, swapped in by rename."""
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _mirror(checkpoint, tmp)
    _replace_dir(tmp, target)


def _replace_dir(new: Path, target: Path) -> None:
    """Rename `new` to `target`; an existing `target` is moved aside first (to `.NAME.old`, which
    `clean_leftovers` puts back if a kill comes before `new` is in place) and deleted after."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def clean_leftovers(run_dir: str | Path) -> None:
    """Undo or finish what an interrupted save or removal left in a run directory: a `.NAME.old` directory whose
    `NAME` is missing is renamed back; hidden `.tmp` and `.del` files and directories are deleted."""
    run_dir = Path(run_dir)
    folders = [run_dir, run_dir / CHECKPOINTS_DIR, run_dir / TOKENIZER_DIR, run_dir / BEST_DIR,
               run_dir / BEST_DIR / TOKENIZER_DIR, run_dir / "plots"]
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in list(folder.iterdir()):
            if not path.name.startswith("."):
                continue
            if path.name.endswith(".old"):
                original = path.with_name(path.name[1:-4])
                if not original.exists():
                    os.replace(path, original)
                    log.warning("put back %s, which an interrupted save had moved aside", original)
                    continue
            elif not path.name.endswith(LEFTOVER_SUFFIXES):
                continue
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
            log.debug("removed %s, left by an interrupted save", path)


def _prune(folder: Path, keep: int) -> None:
    for stale in checkpoints(folder.parent)[:-keep]:
        _remove_dir(stale)
        log.debug("removed old checkpoint %s", stale)


def _remove_dir(path: Path) -> None:
    """Delete a directory so that no kill leaves it half-deleted under its name: rename it hidden, then delete."""
    hidden = path.with_name(f".{path.name}.del")
    os.replace(path, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def later_best(run_dir: str | Path, step: int) -> dict[str, Any] | None:
    """The train state of the run's `best/` when it was saved after `step` and every file it lists is intact; else
    None. A run resumed at `step` (past damaged checkpoints, or forked there by path) keeps that `best/` and its
    score, the best model the run has made, until it scores better (`remove_checkpoints_after(..., keep_best=True)`)."""
    best = Path(run_dir) / BEST_DIR
    try:
        state = read_json(best / TRAIN_STATE_FILE)
        # hashed only when it is later: no checksums means not a checkpoint, or one that predates them (unchecked)
        if state.get("step", 0) <= step or not read_checksums(best):
            return None
        verify_files(best)
    except CheckpointError:
        return None
    return state


def mend_best(run_dir: str | Path, checkpoint: Path) -> bool:
    """Copy `checkpoint` (of this run) into `best/` when its train state records its own step as the one that
    scored best (`best_step`: a tie scores no better) and `best/` holds another model or none: a save cut short (a
    full disk, a kill) after writing the checkpoint but before `best/` took its copy. The models are compared by
    the digests their `checksums.json` record (step numbers repeat across a fork's branches). Returns whether it
    copied."""
    run_dir = Path(run_dir)
    state = read_json(checkpoint / TRAIN_STATE_FILE)
    if checkpoint.parent != run_dir / CHECKPOINTS_DIR or state.get("best_step") != state.get("step"):
        return False
    best = run_dir / BEST_DIR
    model_files = (CONFIG_FILE, WEIGHTS_FILE, ADAPTERS_FILE)
    try:
        held = read_checksums(best) if best.is_dir() else {}
    except CheckpointError:
        held = {}
    wanted = read_checksums(checkpoint)
    if held and all(held.get(name) == wanted.get(name) for name in model_files):
        return False
    with writing(run_dir, doing=f"copying checkpoint {checkpoint.name} to best/ in"):
        _mirror_dir(checkpoint, best)
    return True


def remove_checkpoints_after(run_dir: str | Path, step: int, *, keep_best: bool = False) -> list[Path]:
    """Delete the run's checkpoints newer than `step` (a run resumed from an earlier checkpoint forks there), and
    `best/` when it is one of them, unless `keep_best` (see `later_best`); the top level then holds the newest
    checkpoint left. A kill at any moment leaves whole checkpoints only: each is renamed hidden (newest first)
    before it is deleted. Returns the removed.
    """
    run_dir = Path(run_dir)
    later = [p for p in checkpoints(run_dir) if int(p.name[5:]) > step]
    doomed = []
    for path in reversed(later):
        doomed.append(path.with_name(f".{path.name}.del"))
        os.replace(path, doomed[-1])
    best = run_dir / BEST_DIR
    if (later and not keep_best and (best / TRAIN_STATE_FILE).is_file()
            and read_json(best / TRAIN_STATE_FILE).get("step", 0) > step):
        doomed.append(run_dir / f".{BEST_DIR}.del")
        os.replace(best, doomed[-1])
        log.warning("removed %s: its checkpoint came after step %d", best, step)
    left = checkpoints(run_dir)
    if later and left:
        with writing(run_dir):
            _mirror(left[-1], run_dir)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return later
