"""Model checkpoints: `config.json` + `model.safetensors`, written atomically, loaded strictly.

Nothing here unpickles: tensors travel as safetensors, everything else as JSON. Tied weights (an output layer
sharing the embedding table) are stored once; the model rebuilt from its config ties them again. A model with LoRA
adapters (`attnkit.layers.lora`) keeps its base weights in `model.safetensors` and the adapters beside them in
`adapters.safetensors`; reading the directory folds them into the weights unless asked not to.
"""

from __future__ import annotations

import json
import os
import tempfile
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

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ADAPTERS_FILE = "adapters.safetensors"  # LoRA adapters beside the base weights; metadata "alphas": {module: alpha}
TOKENIZER_DIR = "tokenizer"  # a run's tokenizer, as `attnkit.tokenize` saves it
LABELS_FILE = "labels.json"  # a classifier's class names: {"labels": [...]}


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`: readers see old or new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_tensors(tensors: dict[str, Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Atomically write tensors as safetensors (contiguous CPU copies)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_tensors(path: str | Path) -> dict[str, Tensor]:
    """Read a safetensors file; a missing, truncated or corrupted file raises CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist; a checkpoint directory holds {WEIGHTS_FILE} and {CONFIG_FILE}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
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
    """Write `config.json` and `model.safetensors` into `directory`, each atomically."""
    directory = Path(directory)
    adapters = adapter_tensors(model)
    base = {name: t for name, t in unique_state_dict(model).items() if name not in adapters}
    save_tensors(base, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    if adapters:
        alphas = json.dumps(adapter_alphas(model), sort_keys=True)
        save_tensors(adapters, directory / ADAPTERS_FILE, metadata={"format": "pt", "alphas": alphas})
    payload = config.to_dict() if extra is None else {**config.to_dict(), **extra}
    atomic_write(directory / CONFIG_FILE, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def load_config(directory: str | Path) -> ModelConfig:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {CONFIG_FILE}; is it a run directory (runs/NAME)?")
    return ModelConfig.from_json(path)


def load_model(
    directory: str | Path,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    merge_adapters: bool = True,
) -> tuple[nn.Module, ModelConfig]:
    """Rebuild the model from `config.json` and load `model.safetensors` strictly. Returns (model, config).

    LoRA adapters saved beside the weights are folded into them, unless `merge_adapters=False` (the base alone:
    a resumed LoRA run wraps it again and loads the adapters with `load_adapters`).
    """
    directory = Path(directory)
    config = load_config(directory)
    tensors = load_tensors(directory / WEIGHTS_FILE)
    if merge_adapters and (directory / ADAPTERS_FILE).is_file():
        tensors = _merge_adapters(tensors, directory / ADAPTERS_FILE)
    model = build_model(config)
    load_weights(model, tensors, source=str(directory / WEIGHTS_FILE))
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, config


def load_weights(model: nn.Module, tensors: dict[str, Tensor], *, source: str) -> None:
    """Copy `tensors` into `model` after checking names and shapes match exactly."""
    expected = unique_state_dict(model)
    check_state_matches(expected, tensors, source)
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


def _merge_adapters(tensors: dict[str, Tensor], path: Path) -> dict[str, Tensor]:
    adapters, alphas = load_adapter_file(path)
    try:
        return merge_adapter_tensors(tensors, adapters, alphas)
    except KeyError as err:
        raise CheckpointError(f"{path} adapts {err.args[0]!r}, which the base weights lack") from None
