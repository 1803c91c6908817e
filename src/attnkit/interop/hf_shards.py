"""Sharded Hugging Face weights: the layout `save_pretrained(max_shard_size=...)` writes, and its index checked when
read back.

    model-00001-of-00003.safetensors, ...     the tensors in order, a new file wherever the next would pass the size
    model.safetensors.index.json              {"metadata": {"total_size": bytes, "total_parameters": n},
                                               "weight_map": {tensor name: file name}}

A model that fits in one shard is written as `model.safetensors` alone, with no index, as save_pretrained writes it;
a tensor larger than the size gets a shard of its own (larger than the size), as there. The split is
huggingface_hub's (`split_torch_state_dict_into_shards`, which save_pretrained calls): tensors in order, greedily.
Saving into a directory that holds an earlier save's weights removes those the new save did not write (its
model.safetensors, index and shards), since transformers and attnkit read model.safetensors before an index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from torch import Tensor

from attnkit.checkpoint import save_tensors
from attnkit.errors import CheckpointError, InputError
from attnkit.outputs import atomic_write

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SHARD_NAME = "model-{index:05d}-of-{count:05d}.safetensors"
_SHARD_FILE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")  # SHARD_NAME's files, any count
MAX_SHARD_SIZE = "5GB"  # huggingface_hub's default (and transformers 4's; transformers 5 writes 50GB shards)
_UNITS = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])(i?)([Bb]))?", re.IGNORECASE)
_DAMAGED = ("the index and its shards do not belong together (a download or copy that stopped, or files of two "
            "saves mixed): fetch or save the checkpoint again")


def parse_shard_size(size: str | int) -> int:
    """Bytes from the forms transformers' `max_shard_size` takes: an integer of bytes, or a number with a unit:
    "5GB", "500MB", "100KB" (powers of 1000), "2GiB", "512MiB" (powers of 1024), "8Gb" (bits: an eighth). Raises
    InputError naming the size and the forms for anything else, or a size under one byte."""
    match = _SIZE.fullmatch(str(size).strip())
    if match is None:
        raise InputError(f"the shard size {size!r} (--max-shard-size, max_shard_size=) is not a size: give bytes (an "
                         "integer) or a number with a unit, as transformers' max_shard_size takes it: 5GB, 500MB, "
                         "2GiB, 100KB")
    number, unit, binary, byte = match.groups()
    value = float(number)
    if unit is not None:
        value *= 1024 ** (" KMGT".index(unit.upper())) if binary else _UNITS[unit.upper()]
        if byte == "b" and not binary:
            value /= 8  # transformers reads "5Gb" as gigabits
    if int(value) < 1:
        raise InputError(f"the shard size {size!r} (--max-shard-size, max_shard_size=) is under one byte; give the "
                         "largest file size wanted, e.g. 5GB")
    return int(value)


def _bytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def split_shards(tensors: dict[str, Tensor], max_bytes: int) -> list[dict[str, Tensor]]:
    """`tensors` in order, in shards of at most `max_bytes` each, except that a tensor larger than that is a shard of
    its own (huggingface_hub's `split_state_dict_into_shards_factory`)."""
    shards: list[dict[str, Tensor]] = []
    current: dict[str, Tensor] = {}
    size = 0
    for name, tensor in tensors.items():
        if _bytes(tensor) > max_bytes:
            shards.append({name: tensor})
            continue
        if current and size + _bytes(tensor) > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += _bytes(tensor)
    if current or not shards:
        shards.append(current)
    return shards


def save_shards(tensors: dict[str, Tensor], directory: Path, *, max_bytes: int, metadata: dict[str, str]
                ) -> list[str]:
    """Write `tensors` into `directory` as save_pretrained does for `max_shard_size=max_bytes` (see the module
    docstring); returns the weight files' names. An earlier save's weight files there that this one does not write
    are removed: first model.safetensors and the index, which would make a loader read the old weights (the single
    file is replaced in place), last the old shards, so a save stopped midway leaves the new weights or none that
    load, never the old ones read as new. Each file is written atomically; the command line writes `directory` as a
    whole (`attnkit.outputs.atomic_output`)."""
    shards = split_shards(tensors, max_bytes)
    for entry in (SAFETENSORS_INDEX,) if len(shards) == 1 else (SAFETENSORS, SAFETENSORS_INDEX):
        (directory / entry).unlink(missing_ok=True)
    if len(shards) == 1:
        save_tensors(tensors, directory / SAFETENSORS, metadata=metadata)
        _remove_stale_shards(directory, kept=set())
        return [SAFETENSORS]
    weight_map: dict[str, str] = {}
    for index, shard in enumerate(shards, start=1):
        name = SHARD_NAME.format(index=index, count=len(shards))
        save_tensors(shard, directory / name, metadata=metadata)
        weight_map.update(dict.fromkeys(shard, name))
    totals = {"total_size": sum(map(_bytes, tensors.values())),
              "total_parameters": sum(tensor.numel() for tensor in tensors.values())}
    index = {"metadata": totals, "weight_map": weight_map}
    atomic_write(directory / SAFETENSORS_INDEX, json.dumps(index, indent=2, sort_keys=True) + "\n")
    _remove_stale_shards(directory, kept=set(weight_map.values()))
    return [*dict.fromkeys(weight_map.values()), SAFETENSORS_INDEX]


def _remove_stale_shards(directory: Path, *, kept: set[str]) -> None:
    """Remove the shard files in `directory` (model-0000i-of-0000n.safetensors, any n) not in `kept`: an earlier
    save's (save_pretrained removes them likewise)."""
    for path in directory.iterdir():
        if _SHARD_FILE.fullmatch(path.name) and path.name not in kept and path.is_file():
            path.unlink()


def read_shards(directory: Path, index_name: str, read: Callable[[Path], dict[str, Tensor]]) -> dict[str, Tensor]:
    """Every tensor of a sharded checkpoint, its index checked before and after the shards are read: each file it
    names is a plain name beside it and exists, each tensor it lists is held, in the shard it names and in no other.
    As transformers does, a tensor of a named shard that the index does not list is read too, and
    metadata.total_size is not checked (huggingface_hub counts a storage that tied tensors share once, and whole
    storages, so it need not equal the tensors' bytes). Raises CheckpointError naming the fault and the fix."""
    path = directory / index_name
    try:
        index = json.loads(path.read_text())
        weight_map = index["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not a shard index with a 'weight_map' ({err}); {_DAMAGED}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{path}: 'weight_map' must map tensor names to shard file names; {_DAMAGED}")
    files = sorted(set(weight_map.values()))
    for shard in files:
        # A plain file name beside the index; a symlink there is followed (the Hugging Face cache links to blobs)
        if Path(shard).name != shard or shard in (".", "..") or "\\" in shard:
            raise CheckpointError(
                f"{path} names shard {shard!r}, which is not a file of {directory}: shards must sit beside their "
                f"index (a plain file name), so the index cannot make attnkit read other files"
            )
    missing = [shard for shard in files if not (directory / shard).is_file()]
    if missing:
        raise CheckpointError(f"{path} names {len(missing)} shard file{'s' * (len(missing) > 1)} missing from "
                              f"{directory}: {', '.join(missing)}; {_DAMAGED}")
    tensors: dict[str, Tensor] = {}
    misplaced: list[str] = []
    for shard in files:
        for name, tensor in read(directory / shard).items():
            if name in tensors:
                misplaced.append(f"{name} in {shard} (and in another shard)")
            elif weight_map.get(name, shard) != shard:
                misplaced.append(f"{name} in {shard} (the index says {weight_map[name]})")
            tensors.setdefault(name, tensor)
    absent = sorted(set(weight_map) - set(tensors))
    if absent:
        raise CheckpointError(f"{path} lists tensors its shards do not hold: {', '.join(absent)}; {_DAMAGED}")
    if misplaced:
        raise CheckpointError(f"{path}: tensors are not where the index puts them, each once: "
                              f"{', '.join(misplaced)}; {_DAMAGED}")
    return tensors
