"""Model checkpoints: `config.json` + `model.safetensors`, written atomically, loaded strictly.

Nothing here unpickles: tensors travel as safetensors, everything else as JSON. Tied weights (an output layer
sharing the embedding table) are stored once; the model rebuilt from its config ties them again. `checksums.json`
records the SHA-256 of every file beside it; reading a file checks it, so flipped bytes are refused by name rather
than loaded. A training run's directory that cannot be read at its top level (a save interrupted before the top
level took the new checkpoint, or a damaged file) is read from its newest intact `checkpoints/step_*` instead.
A model with LoRA adapters (`attnkit.layers.lora`) keeps its base weights in `model.safetensors` and the adapters
beside them in `adapters.safetensors`; reading the directory folds them into the weights unless asked not to.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError
from attnkit.layers.lora import adapter_alphas, adapter_tensors, merge_adapter_tensors
from attnkit.models import build_model
from attnkit.models.families import check_weights_fit, estimate_parameters
from attnkit.outputs import atomic_write, file_mode, sibling_file, writing
from attnkit.readback import digest
from attnkit.textfiles import special_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ADAPTERS_FILE = "adapters.safetensors"  # LoRA adapters beside the base weights; metadata "alphas": {module: alpha}
TOKENIZER_DIR = "tokenizer"  # a run's tokenizer, as `attnkit.tokenize` saves it
LABELS_FILE = "labels.json"  # a classifier's class names: {"labels": [...]}
CHECKSUMS_FILE = "checksums.json"  # {"sha256": {relative path: hex digest}} of the files beside it
METRICS_FILE = "metrics.jsonl"  # a training run's log, a JSON record a line
INSTRUMENTS_KIND = "instruments"  # the "kind" of metrics.jsonl records holding the training instruments
CHECKPOINTS_DIR = "checkpoints"  # a training run's checkpoints: checkpoints/step_XXXXXX (see attnkit.train.state)
TRAIN_STATE_FILE = "train_state.json"  # where training stands: step, RNG states, data position (attnkit.train.state)
OPTIMIZER_FILE = "optimizer.safetensors"  # the optimizer's tensors
TASK_FILE = "task.json"  # the task a run trained for and its data settings
HF_SOURCE_FILE = "hf_source.json"  # a converted run's origin: model type, class, and config.json's token ids
BEST_DIR = "best"  # a copy of the checkpoint with the best validation score
REPLACED_PREFIX = ".replaced-"  # a run `--overwrite` moved aside until the new one's first checkpoint (train.rundir)
RUN_MARKER = ".attnkit-run"  # written into every run directory attnkit trains or converts into: only such a
# directory (or one of the older layout, `is_attnkit_run`) may be replaced by --overwrite

log = logging.getLogger(__name__)


def save_tensors(tensors: dict[str, Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Atomically write tensors as safetensors (contiguous CPU copies)."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = sibling_file(path)
        try:
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
            os.chmod(tmp, file_mode())  # safetensors writes a file of its own, private (0600)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def absent(path: Path) -> str:
    """Why a path that `exists()` denies cannot be read, in words: a symbolic link that loops back on itself, one
    pointing nowhere, or no such path."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link that loops back on itself"
    if path.is_symlink():
        return f"is a symbolic link to {os.readlink(path)}, which does not exist"
    return "does not exist"


def not_a_file(path: Path) -> str:
    """What stands at `path` where a file is to be read, in words: a directory, a FIFO, device or socket (reading one
    could wait forever), or nothing (`absent`)."""
    if path.is_dir():
        return "is a directory"
    kind = special_file(path)
    return f"is {kind}, not a file" if kind is not None else absent(path)


def mark_run(directory: str | Path) -> None:
    """Label `directory` as a run attnkit writes (`RUN_MARKER`)."""
    path = Path(directory) / RUN_MARKER
    if not path.is_file():
        atomic_write(path, json.dumps({"written_by": "attnkit"}) + "\n")


def is_attnkit_run(directory: str | Path) -> bool:
    """Whether attnkit wrote the run in `directory`: its marker, or (runs written before the marker) the layout a
    training run has: config.json, model.safetensors and train_state.json."""
    directory = Path(directory)
    return (directory / RUN_MARKER).is_file() or all(
        (directory / name).is_file() for name in (CONFIG_FILE, WEIGHTS_FILE, TRAIN_STATE_FILE))


# Integrity ---------------------------------------------------------------------------------------------------
def read_json(path: str | Path) -> Any:
    """A run file's JSON; CheckpointError naming the file when it is missing, unreadable or not JSON."""
    path = Path(path)
    if not path.is_file() and (path.exists() or path.is_symlink()):  # a FIFO in its place would be read forever
        raise CheckpointError(f"{path} {not_a_file(path)}, where a JSON file should be; put back the file attnkit "
                              "saved")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; is {path.parent} a run or checkpoint written by attnkit?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(f"{path} is not readable JSON ({err}); the file is damaged") from None


def read_labels(directory: str | Path) -> list[str] | None:
    """A classifier run's class names from labels.json (`{"labels": [...]}` or a plain list); None without one."""
    path = Path(directory) / LABELS_FILE
    if not path.is_file():
        return None
    labels = read_json(path)
    if isinstance(labels, dict):  # the trainer writes {"labels": [...]}
        labels = labels.get("labels")
    if not isinstance(labels, list):
        raise CheckpointError(f'{path} must hold the class names as a list or as {{"labels": [...]}}; got {labels!r}')
    return [str(label) for label in labels]


def read_origin_ids(directory: str | Path) -> dict[str, Any]:
    """A converted run's origin token ids (hf_source.json's special_ids: config.json's bos_token_id, eos_token_id,
    decoder_start_token_id, ... as they were, for the caller to check); {} for a run that was not converted.
    Raises CheckpointError for a file that is not JSON."""
    path = Path(directory) / HF_SOURCE_FILE
    origin = read_json(path) if path.is_file() else {}
    ids = origin.get("special_ids") if isinstance(origin, dict) else None
    return ids if isinstance(ids, dict) else {}


def read_end_ids(directory: str | Path, vocab_size: int) -> list[int]:
    """The end tokens a converted run's model names beside its tokenizer's EOS: hf_source.json's eos_token_id, one
    or several (Llama 3's <|end_of_text|> and <|eot_id|>, any of which ends a text; config.json's and
    generation_config.json's, as transformers' and vLLM's generate stop at each); [] for none. Raises
    CheckpointError for a list that holds something else than token ids of the model's vocabulary."""
    path = Path(directory) / HF_SOURCE_FILE
    ends = read_origin_ids(directory).get("eos_token_id")
    if isinstance(ends, int) and not isinstance(ends, bool):  # one: kept where it names a token of the model
        return [ends] if 0 <= ends < vocab_size else []
    if not isinstance(ends, list):
        return []
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ends):
        raise CheckpointError(f"{path}: eos_token_id={ends!r} must list token ids from 0 to {vocab_size - 1}; the file "
                              "is damaged: convert the model again")
    return ends


_HALF_TYPES = {"BF16": torch.bfloat16, "F16": torch.float16}  # safetensors' names of the types a run may keep


def stored_dtype(path: str | Path) -> torch.dtype:
    """The floating-point type a weights file holds every tensor in (bfloat16 for a run converted with --dtype
    bf16): the type a model loaded "as stored" (`dtype=None`) takes; float32 where they differ."""
    with safe_open(str(path), framework="pt") as handle:
        stored = {handle.get_slice(name).get_dtype() for name in handle.keys()}
    return _HALF_TYPES.get(stored.pop(), torch.float32) if len(stored) == 1 else torch.float32


def write_checksums(directory: str | Path, digests: dict[str, str]) -> None:
    """Record `digests` ({path relative to `directory`: sha256}) in `directory/checksums.json`."""
    atomic_write(Path(directory) / CHECKSUMS_FILE, json.dumps({"sha256": digests}, indent=1, sort_keys=True) + "\n")


def read_checksums(directory: str | Path) -> dict[str, str]:
    """The digests recorded in `directory/checksums.json`; {} for a directory written before checksums."""
    path = Path(directory) / CHECKSUMS_FILE
    if not path.is_file():
        return {}
    try:
        digests = json.loads(path.read_text(encoding="utf-8"))["sha256"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{path} is damaged: it is not the JSON attnkit writes") from None
    if not isinstance(digests, dict):
        raise CheckpointError(f"{path} is damaged (no table of digests); the checkpoint cannot be trusted")
    return digests


def verify_files(directory: str | Path, names: Iterable[str] | None = None) -> None:
    """Check the files `names` (default: every file listed) against `checksums.json`; files it does not list pass.

    Raises CheckpointError naming the first file that is missing or whose bytes changed.
    """
    directory = Path(directory)
    digests = read_checksums(directory)
    for name in digests if names is None else names:
        if name not in digests:
            continue
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path} {not_a_file(path)}, where {directory / CHECKSUMS_FILE} lists a file: put "
                                  "the file saved there back, or use another checkpoint of the run "
                                  "(RUN/checkpoints/step_N)")
        if digest(path) != digests[name]:
            raise CheckpointError(
                f"{path} is damaged: its SHA-256 differs from the one recorded in {CHECKSUMS_FILE} when it was saved "
                f"(if you changed it on purpose, delete its entry \"{name}\" under \"sha256\" from "
                f"{directory / CHECKSUMS_FILE}: it is then read unverified)"
            )


def record_checksums(directory: str | Path) -> None:
    """Add to `directory/checksums.json` the digest of every file beside it (folders included) it does not list yet:
    files written after `save_model` (a tokenizer, labels) are covered too."""
    directory = Path(directory)
    digests = read_checksums(directory)
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if path.is_file() and name != CHECKSUMS_FILE and name not in digests and not path.name.startswith("."):
            digests[name] = digest(path)
    write_checksums(directory, digests)


def verify_run_files(directory: str | Path, names: Iterable[str], *, require: bool = False) -> None:
    """Check the files `names` and the tokenizer's against `checksums.json` (`verify_files`). Files that it cannot
    vouch for (no checksums.json, or a tokenizer file it does not list) are unverified: a warning, or with `require`
    a CheckpointError; never called intact."""
    directory = Path(directory)
    digests = read_checksums(directory)
    tokenizer = directory / TOKENIZER_DIR
    unlisted = sorted(
        path.relative_to(directory).as_posix() for path in (tokenizer.rglob("*") if tokenizer.is_dir() else ())
        if path.is_file() and path.relative_to(directory).as_posix() not in digests
    )
    problem = (f"has no {CHECKSUMS_FILE}" if not digests
               else f"lists no checksum for {', '.join(unlisted[:3])}" if unlisted else None)
    if problem is not None:
        message = f"{directory} {problem}: its files are unverified (written before checksums, or the file removed)"
        if require:
            raise CheckpointError(f"{message}; load it without verification, or save it again so that its "
                                  f"checksums are recorded")
        log.warning("%s", message)
    listed_tokenizer = [name for name in digests if name.startswith(f"{TOKENIZER_DIR}/")]
    verify_files(directory, [*names, *listed_tokenizer])


def load_tensors(path: str | Path) -> dict[str, Tensor]:
    """Read a safetensors file; a missing, truncated or corrupted file raises CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} {not_a_file(path)}, where a safetensors file should be; a checkpoint directory "
                              f"holds {WEIGHTS_FILE} and {CONFIG_FILE} as files")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, MemoryError) as err:
        if isinstance(err, MemoryError) or getattr(err, "errno", None) == errno.ENOMEM:  # the mmap refused
            raise CheckpointError(f"{path} cannot be mapped into memory ({err}): the process's memory limit "
                                  "(ulimit -v) or the memory free is too small for it; raise the limit or free "
                                  "memory") from None
        raise CheckpointError(f"{path} is not a readable safetensors file (truncated or corrupted?): {err}") from None


def unique_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's state with each shared tensor (tied weights) kept once, under its first name."""
    seen: set[tuple[int, int]] = set()
    state: dict[str, Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if not tensor.is_meta else (id(tensor), 0)
        if key in seen and tensor.numel() > 0:
            continue
        seen.add(key)
        state[name] = tensor
    return state


def check_state_matches(expected: dict[str, Tensor], found: dict[str, Tensor], source: str) -> None:
    """Raise one CheckpointError listing every missing key, unexpected key and shape mismatch."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = [
        f"{name}: checkpoint {tuple(found[name].shape)} vs model {tuple(expected[name].shape)}"
        for name in sorted(set(expected) & set(found))
        if tuple(found[name].shape) != tuple(expected[name].shape)
    ]
    raise_mismatch(source, missing=missing, unexpected=unexpected, mismatched=mismatched)


def raise_mismatch(
    source: str,
    *,
    missing: list[str],
    unexpected: list[str],
    mismatched: list[str],
    conflicts: list[str] | None = None,
) -> None:
    """Raise one CheckpointError naming every problem found, if there is any."""
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {'; '.join(mismatched)}")
    if conflicts:
        problems.append(f"tied tensors that differ: {'; '.join(conflicts)}")
    if problems:
        raise CheckpointError(
            f"{source} does not match the model its config describes:\n  " + "\n  ".join(problems)
            + "\nThe weights and config.json must come from the same model."
        )


def save_model(
    model: nn.Module, config: ModelConfig, directory: str | Path, *, extra: dict[str, Any] | None = None
) -> None:
    """Write `config.json`, `model.safetensors` (and `adapters.safetensors`) into `directory`, each atomically,
    then `checksums.json` with their digests."""
    directory = Path(directory)
    adapters = adapter_tensors(model)
    base = {name: t for name, t in unique_state_dict(model).items() if name not in adapters}
    save_tensors(base, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    if adapters:
        alphas = json.dumps(adapter_alphas(model), sort_keys=True)
        save_tensors(adapters, directory / ADAPTERS_FILE, metadata={"format": "pt", "alphas": alphas})
    payload = config.to_dict() if extra is None else {**config.to_dict(), **extra}
    atomic_write(directory / CONFIG_FILE, json.dumps(payload, indent=2, sort_keys=True) + "\n")
    written = [WEIGHTS_FILE, CONFIG_FILE] + ([ADAPTERS_FILE] if adapters else [])
    write_checksums(directory, {name: digest(directory / name) for name in written})


_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # gpt2, meta-llama/Llama-2-7b-hf: a name on the hub


def require_directory(directory: str | Path) -> Path:
    """`directory` as a Path, when it is a directory; a CheckpointError naming the fix when it does not exist (a
    Hugging Face model's name: how to fetch and convert it) or is a file. What every command that reads a run checks
    first, before any other work."""
    directory = Path(directory)
    if not directory.exists():
        parent = directory.parent.name and directory.parent.exists()  # runs/x names a run; gpt2, org/model the hub
        hub = _HUB_NAME.fullmatch(str(directory)) is not None and not parent
        raise CheckpointError(f"{directory} {absent(directory)}; give a run directory (runs/NAME, holding "
                              f"{CONFIG_FILE})"
                              + (f"; if {directory} names a Hugging Face model, nothing is downloaded here: fetch its "
                                 "directory, then attnkit convert --from-hf DIR --out runs/NAME" if hub else ""))
    if not directory.is_dir():
        raise CheckpointError(f"{directory} is a file; give a run directory (runs/NAME, holding {CONFIG_FILE})")
    return directory


def load_config(directory: str | Path) -> ModelConfig:
    """The model config of a run or checkpoint directory; CheckpointError saying what the directory lacks (for a run
    an `--overwrite` moved aside and has not yet replaced, where it waits and how to get it back)."""
    directory = require_directory(directory)
    if (directory / CONFIG_FILE).is_dir():
        raise CheckpointError(f"{directory / CONFIG_FILE} is a directory, where the run's config (a JSON file) should "
                              "be; put the run's config.json there")
    if not (directory / CONFIG_FILE).is_file():
        replaced = sorted(directory.glob(f"{REPLACED_PREFIX}*"))
        if replaced and not checkpoint_dirs(directory):  # as `train.rundir` decides: the newest is put back
            raise CheckpointError(
                f"{directory} has no {CONFIG_FILE}: an `attnkit train --overwrite` there has not saved its first "
                f"checkpoint (it was killed, or is still running), and the run it replaces waits in {replaced[-1]}; "
                f"load that directory, or put the run back with `attnkit train --out {directory} --resume` (which "
                f"continues it) or by moving the files in {replaced[-1].name} back into {directory}"
            )
        raise CheckpointError(f"{directory} has no {CONFIG_FILE}; is it a run directory (runs/NAME)?")
    return ModelConfig.from_json(directory / CONFIG_FILE, saved=True)  # checked: ConfigError naming the problem


def load_model(
    directory: str | Path,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    merge_adapters: bool = True,
    verify: bool = True,
    require_checksums: bool = False,
) -> tuple[nn.Module, ModelConfig]:
    """Rebuild the model from `config.json` and load `model.safetensors` strictly. Returns (model, config).

    LoRA adapters saved beside the weights are folded into them, unless `merge_adapters=False` (the base alone:
    a resumed LoRA run wraps it again and loads the adapters with `load_adapters`). With `verify`, the files are
    checked against `checksums.json` first (the tokenizer's files too); files without checksums are unverified, a
    warning, or with `require_checksums` a CheckpointError. A run directory whose top level cannot be read falls
    back to its newest checkpoint that loads (see `load_run_model`, which also says which directory was read).
    """
    model, config, _ = load_run_model(
        directory, device=device, dtype=dtype, merge_adapters=merge_adapters, verify=verify,
        require_checksums=require_checksums,
    )
    return model, config


def load_run_model(
    directory: str | Path,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    merge_adapters: bool = True,
    verify: bool = True,
    require_checksums: bool = False,
) -> tuple[nn.Module, ModelConfig, Path]:
    """`load_model`, returning also the directory read: `directory` itself or, for a training run whose top level
    is missing or damaged (a save interrupted before it was updated), its newest checkpoint that loads.

    Raises the top level's CheckpointError when no checkpoint loads either.
    """
    directory = Path(directory)
    checks = dict(verify=verify, require=require_checksums)
    try:
        if checkpoint_dirs(directory):
            _check_complete(directory)
        return (*_load_model(directory, device, dtype, merge_adapters, **checks), directory)
    except CheckpointError as err:
        for checkpoint in reversed(checkpoint_dirs(directory)):
            try:
                loaded = _load_model(checkpoint, device, dtype, merge_adapters, **checks)
            except CheckpointError as other:
                log.warning("skipped %s: %s", checkpoint, other)
                continue
            state = "intact" if verify and read_checksums(checkpoint) else "unverified"
            log.warning("%s; read its newest checkpoint that loads (%s), %s, instead", err, state, checkpoint)
            return (*loaded, checkpoint)
        raise


def _check_complete(run_dir: Path) -> None:
    """A run's top level is a copy of a checkpoint with `checksums.json` copied last: without it, or without a file it
    lists, the copy was cut short (or the run predates checksums) and the top level is not to be trusted."""
    digests = read_checksums(run_dir)
    missing = [name for name in digests if not (run_dir / name).is_file()]
    if not digests or missing:
        what = f"lacks {', '.join(missing[:3])}" if missing else f"has no {CHECKSUMS_FILE}"
        raise CheckpointError(f"the top level of {run_dir} {what}: a save was cut short (or predates checksums)")


def _load_model(
    directory: Path, device, dtype, merge_adapters: bool, *, verify: bool, require: bool
) -> tuple[nn.Module, ModelConfig]:
    adapters = merge_adapters and (directory / ADAPTERS_FILE).is_file()
    if verify:
        verify_run_files(directory, [CONFIG_FILE, WEIGHTS_FILE, LABELS_FILE, TASK_FILE]
                         + ([ADAPTERS_FILE] if adapters else []), require=require)
    config = load_config(directory)
    check_weights_cover(config, stored_values(directory / WEIGHTS_FILE), config_file=str(directory / CONFIG_FILE),
                        weights=str(directory / WEIGHTS_FILE))
    model = build_model(config)  # its size checked against the memory free before the weights are read
    tensors = load_tensors(directory / WEIGHTS_FILE)
    if adapters:
        tensors = merge_adapter_file(tensors, directory / ADAPTERS_FILE)
    load_weights(model, tensors, source=str(directory / WEIGHTS_FILE))
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, config


def stored_values(path: Path) -> int:
    """How many values the safetensors file `path` holds, counted from its header alone. Raises CheckpointError as
    `load_tensors` does for a file that is missing, a directory, truncated or corrupted."""
    if not path.is_file():
        load_tensors(path)  # names what is there instead, before an open that a FIFO would hold forever
    try:
        with safe_open(str(path), framework="pt") as handle:
            return sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    except (OSError, SafetensorError):
        load_tensors(path)  # names the problem
        raise CheckpointError(f"{path} is not a readable safetensors file (its header cannot be read)") from None


def check_weights_cover(config: ModelConfig, stored: int, *, config_file: str, weights: str) -> None:
    """Refuse, before the model is built, a config (read from `config_file`) that describes more than twice the
    `stored` values its `weights` hold: another model's config, or a damaged one (an n_layers of 100,000 beside one
    layer's weights), whose model can take many minutes to build before strict loading would list its every tensor as
    missing. Closer counts are left to strict loading, which names each missing or misshapen tensor; a model too large
    for memory is refused as such first (`check_weights_fit`)."""
    described = estimate_parameters(config)
    if described <= 2 * stored:
        return
    check_weights_fit(config, torch.get_default_device())
    raise CheckpointError(f"{config_file} describes a model of {described:,} parameters, but {weights} holds "
                          f"{stored:,} values in all; the weights and the config must come from the same model (a "
                          "damaged or replaced config.json?)")


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """A training run's complete checkpoints (`checkpoints/step_XXXXXX`), oldest first; [] for any other directory.
    Hidden directories (saves in progress, checkpoints being removed) are not checkpoints."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


_WEIGHT_TYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def check_weights(named: Iterable[tuple[str, Tensor]], source: str) -> None:
    """Refuse weights (name, tensor) that are not floating point or hold NaN or infinity, naming the first: a model
    built from them would compute garbage without a word (a diverged run saved, a broken conversion)."""
    for name, tensor in named:
        if tensor.dtype not in _WEIGHT_TYPES:  # integers, float8: a quantized form, which needs its scales
            raise CheckpointError(f"{source}: the weight {name} is {str(tensor.dtype).removeprefix('torch.')}, not "
                                  "a type attnkit reads weights in; weights are stored as float32, float16 or "
                                  "bfloat16 (convert the checkpoint again from its unquantized source)")
        bad = tensor.numel() - int(torch.isfinite(tensor).sum())
        if bad:
            raise CheckpointError(f"{source}: the weight {name} holds {bad:,} NaN or infinite values of "
                                  f"{tensor.numel():,}; the weights are damaged (a training run that diverged, or a "
                                  "broken conversion): use an earlier checkpoint or convert again from the source")


def load_weights(model: nn.Module, tensors: dict[str, Tensor], *, source: str) -> None:
    """Copy `tensors` into `model` after checking names and shapes match exactly and the parameters' values are
    finite floating-point numbers (`check_weights`)."""
    expected = unique_state_dict(model)
    check_state_matches(expected, tensors, source)
    parameters = {name for name, _ in model.named_parameters()}
    check_weights(((name, tensors[name]) for name in expected if name in parameters), source)
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(tensors[name].to(target.dtype))


def load_adapter_file(path: str | Path) -> tuple[dict[str, Tensor], dict[str, float]]:
    """The adapters of `adapters.safetensors` and each adapted module's alpha."""
    tensors = load_tensors(path)
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    try:
        alphas = {str(k): float(v) for k, v in json.loads(metadata["alphas"]).items()}
    except (KeyError, ValueError, AttributeError):
        raise CheckpointError(f"{path} has no readable 'alphas' metadata; it was not written by attnkit") from None
    return tensors, alphas


def merge_adapter_file(tensors: dict[str, Tensor], path: Path) -> dict[str, Tensor]:
    """Base weights `tensors` with the LoRA adapters of `path` (adapters.safetensors) folded in (W + alpha / r * B A).
    Raises CheckpointError naming an adapter whose base weight is absent."""
    adapters, alphas = load_adapter_file(path)
    try:
        return merge_adapter_tensors(tensors, adapters, alphas)
    except KeyError as err:
        raise CheckpointError(f"{path} adapts {err.args[0]!r}, which the base weights lack") from None
