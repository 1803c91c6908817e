"""An experiment's finished arms, kept as they finish, so that a run stopped part-way resumes where it stopped.

An arm is one trained model or one measurement of an experiment (e.g. "rope positions, seed 1"). When it finishes,
`Arms.run` saves it in `OUT/arms/` as two files, each written whole (temp file + rename): `<arm>.safetensors`
(its tensors, and PyTorch's global random state after it ran) and `<arm>.json` (its values, what decided it and the
safetensors file's SHA-256), the JSON last: an arm without its JSON was never finished. A rerun of the same command
reads each arm back before running it and reuses it only where everything that decides it is the same: the
experiment, the budget, the arm's setting (its config, steps, seed, data), the code (a digest of attnkit's
source) and what ran it (PyTorch's version, its CPU kernels and thread count, which move a loss's last digits); a
file that fails its checksum or does not read is rerun too, and progress says why. Restoring the random state
(PyTorch's CPU generator; an arm on a GPU seeds its own draws there) makes the rest of a resumed run draw what an
uninterrupted run draws, so the two reach the same numbers.
`run_experiment` removes `OUT/arms/` once the run's results are written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from attnkit.checkpoint import digest, load_tensors, save_tensors
from attnkit.errors import CheckpointError, InputError
from attnkit.outputs import atomic_write
from attnkit.readback import json_digest

log = logging.getLogger(__name__)

ARMS_DIR = "arms"
_RNG = "rng"  # the safetensors key of PyTorch's global random state after the arm ran
_TENSOR = "tensor/"  # the prefix of the arm's own tensors there

T = TypeVar("T")


@dataclass
class Arm:
    """What one finished arm left: JSON values (numbers, lists, text) and tensors (a trained model's state)."""

    values: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def is_number(value: Any) -> bool:
    """Whether a value read back from an arm's JSON is a number (NaN and infinities included: a diverged run's loss),
    not true/false and not text: what an arm's numbers are checked with before use."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def source_digest() -> str:
    """The SHA-256 of attnkit's Python source (every file's path and bytes): the code that trains an arm."""
    package = Path(__file__).resolve().parent.parent
    hashed = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        hashed.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return hashed.hexdigest()


def environment() -> dict[str, Any]:
    """What runs an arm besides attnkit's code and moves its numbers: PyTorch's version, the CPU kernels it picked
    (AVX2, AVX512; `ATEN_CPU_CAPABILITY` sets them) and its thread count (a matrix product split over 2 threads
    sums in another order than over 1)."""
    return {"torch": torch.__version__, "cpu kernels": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}


def _canonical(value: Any) -> Any:
    """`value` as JSON reads it back (tuples as lists, keys as text), for comparing a setting with a saved one; its
    keys keep their order (bottleneck's scores order its table's columns and its plot's length buckets)."""
    return json.loads(json.dumps(value, default=str))


class Arms:
    """The arms of one run of `experiment` at `budget`, saved in `directory` (OUT/arms) and reused from there; the
    log says which arms are reused and which are rerun, and why. code: `source_digest()`; version: the code's name
    for people (`base.code_version()`)."""

    def __init__(self, directory: str | Path, *, experiment: str, budget: str, code: str, version: str = "") -> None:
        self.directory = Path(directory)
        if self.directory.is_symlink() or (self.directory.exists() and not self.directory.is_dir()):
            kind = "a symbolic link" if self.directory.is_symlink() else "a file"
            # arms written through a link would land outside --out, and removing the folder would not remove them
            raise InputError(f"{self.directory} is {kind}, where the run keeps the arms it finishes (a folder of its "
                             "own in --out); move it away or give another --out")
        self.experiment, self.budget, self.code, self.version = experiment, budget, code, version
        self.reused: list[str] = []
        self.ran: list[str] = []
        self._slots: dict[str, str] = {}  # file name -> the arm it holds in this run

    def run(self, name: str, setting: dict[str, Any], compute: Callable[[], tuple[T, Arm]],
            restore: Callable[[Arm], T]) -> T:
        """The arm `name`: `restore(saved)` where a saved arm of the same setting is read back whole, else
        `compute()`, whose Arm is saved. `setting`: JSON values that decide the arm's outcome besides the
        experiment, budget and code."""
        slot = self._slot(name)
        saved, random_state, why = self._read(slot, name, _canonical(setting))
        if saved is not None:
            try:
                value = restore(saved)
            except (CheckpointError, KeyError, ValueError, RuntimeError) as error:  # tensors of another shape or set,
                why = f"what it saved does not load back ({error})"  # values of another kind
            else:
                torch.set_rng_state(random_state)
                self.reused.append(name)
                log.info("reusing %s: saved in %s by a run of the same command", name, self.directory / f"{slot}.json")
                return value
        if why:
            log.info("rerunning %s: %s", name, why)
        value, arm = compute()
        self._save(slot, name, _canonical(setting), arm)
        self.ran.append(name)
        return value

    def merge_worker(self, worker: Arms) -> None:
        """Add the arms a worker process reused and ran to this run's: a worker is handed a copy of this Arms (the
        same directory), which holds what this one had counted when it was copied, and returns it; each arm is
        counted once. The summary `run_experiment` logs reads this one's lists."""
        self.reused += [name for name in worker.reused if name not in self.reused]
        self.ran += [name for name in worker.ran if name not in self.ran]

    def stopped_run(self) -> str | None:
        """Another command's stopped run (another experiment or budget) whose arms are kept in the directory, in
        words ("'bottleneck' at budget 'small'"); None where there is none (a record that does not read is rerun)."""
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            ran = (record.get("experiment"), record.get("budget")) if isinstance(record, dict) else None
            if ran is not None and ran != (self.experiment, self.budget):
                return f"{ran[0]!r} at budget {ran[1]!r}"
        return None

    def clear(self) -> None:
        """Remove the saved arms (the run they belong to is written)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def _slot(self, name: str) -> str:
        """The arm's file name: its name in lower-case words, with a digest of the name where two names of this run
        read alike ("Transformer++ 64 x 2" and "Transformer 64 x 2")."""
        slot = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "arm"
        if self._slots.setdefault(slot, name) != name:
            slot = f"{slot}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
            self._slots[slot] = name
        return slot

    def _save(self, slot: str, name: str, setting: Any, arm: Arm) -> None:
        tensors = {_TENSOR + key: tensor for key, tensor in arm.tensors.items()}
        tensors[_RNG] = torch.get_rng_state()
        weights = self.directory / f"{slot}.safetensors"
        save_tensors(tensors, weights)
        record = {"experiment": self.experiment, "budget": self.budget, "arm": name, "setting": setting,
                  "code": self.code, "version": self.version, "environment": environment(),
                  "values": _canonical(arm.values),
                  "tensors_sha256": digest(weights)}
        record["sha256"] = json_digest(record)
        atomic_write(self.directory / f"{slot}.json", json.dumps(record, indent=1) + "\n")

    def _read(self, slot: str, name: str, setting: Any) -> tuple[Arm | None, torch.Tensor | None, str]:
        """The saved arm and the random state after it ran, or None, None and why it cannot be reused ("" where none
        was saved)."""
        path = self.directory / f"{slot}.json"
        if not path.is_file():
            return None, None, ""
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            return None, None, f"{path} does not read as JSON ({error})"
        if not isinstance(record, dict) or record.pop("sha256", None) != json_digest(record):
            return None, None, f"{path} was changed after it was saved (its checksum does not match)"
        expected = {"experiment": self.experiment, "budget": self.budget, "arm": name}
        for key, value in expected.items():
            if record.get(key) != value:
                return None, None, f"it was saved for {key} {record.get(key)!r}, this run's is {value!r}"
        if record.get("setting") != setting:
            return None, None, f"its setting differs ({_difference(record.get('setting'), setting)})"
        if record.get("code") != self.code:
            # the source digests too: two checkouts of one commit with other changes share a version's name
            saved_by = f"{record.get('version') or 'unknown'}, source {str(record.get('code'))[:12]}"
            return None, None, f"it was saved by other code ({saved_by}; now {self.version}, source {self.code[:12]})"
        if record.get("environment") != (now := environment()):
            return None, None, f"it ran under another PyTorch setup ({_difference(record.get('environment'), now)})"
        weights = self.directory / f"{slot}.safetensors"
        if not weights.is_file() or digest(weights) != record.get("tensors_sha256"):
            return None, None, f"{weights} is missing or was changed after it was saved (its checksum does not match)"
        try:
            stored = load_tensors(weights)
        except CheckpointError as error:
            return None, None, str(error)
        if _RNG not in stored or not isinstance(record.get("values"), dict):
            return None, None, f"{path} lacks what an arm holds (its values and random state)"
        expected_state = torch.get_rng_state()
        if stored[_RNG].dtype != expected_state.dtype or stored[_RNG].shape != expected_state.shape:
            return None, None, (f"{weights} holds no random state PyTorch reads ({stored[_RNG].dtype} of shape "
                                f"{tuple(stored[_RNG].shape)}, where PyTorch's is {expected_state.dtype} of shape "
                                f"{tuple(expected_state.shape)})")
        tensors = {key.removeprefix(_TENSOR): tensor for key, tensor in stored.items() if key.startswith(_TENSOR)}
        return Arm(record["values"], tensors), stored[_RNG], ""


def _difference(saved: Any, now: Any) -> str:
    """The first fields where two settings differ, as `field saved -> now`."""
    if isinstance(saved, dict) and isinstance(now, dict):
        changed = [f"{key} {saved.get(key)!r} -> {now.get(key)!r}" for key in sorted(set(saved) | set(now))
                   if saved.get(key) != now.get(key)]
        return "; ".join(changed[:3]) + ("; ..." if len(changed) > 3 else "")
    return f"{saved!r} -> {now!r}"
