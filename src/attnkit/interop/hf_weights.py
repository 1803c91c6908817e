"""Hugging Face weights: reading checkpoint files, and renaming tensors both ways with a family's rules.

Files read, in order of preference: `model.safetensors`, `model.safetensors.index.json` (sharded, its index checked:
`attnkit.interop.hf_shards`), and only when the caller allows pickles, `pytorch_model.bin` /
`pytorch_model.bin.index.json` through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.checkpoint import check_weights, load_tensors, raise_mismatch, unique_state_dict
from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError
from attnkit.interop.hf_shards import SAFETENSORS, SAFETENSORS_INDEX, read_shards
from attnkit.interop.keymaps import FamilyMap, Rule

PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


def read_weights(directory: Path, *, allow_pickle: bool = False) -> dict[str, Tensor]:
    """All tensors of a Hugging Face model directory, by their Hugging Face names.

    Raises CheckpointError when there are no weights, a file is truncated or corrupted, a shard index is damaged
    (`attnkit.interop.hf_shards.read_shards`), or the weights are a pickle and `allow_pickle` is False.
    """
    if (directory / SAFETENSORS).is_file():
        return load_tensors(directory / SAFETENSORS)
    if (directory / SAFETENSORS_INDEX).is_file():
        return read_shards(directory, SAFETENSORS_INDEX, load_tensors)
    for name in (PICKLE, PICKLE_INDEX):
        if (directory / name).is_file() and not allow_pickle:
            raise CheckpointError(
                f"{directory / name} is a Python pickle, which can run code when it is read. Convert it to "
                f"safetensors, or if you trust its source, allow it explicitly (allow_pickle=True; on the command "
                f"line --allow-pickle); it is then read with torch.load(weights_only=True)"
            )
    if (directory / PICKLE).is_file():
        return _read_pickle(directory / PICKLE)
    if (directory / PICKLE_INDEX).is_file():
        return read_shards(directory, PICKLE_INDEX, _read_pickle)
    raise CheckpointError(
        f"{directory} holds no weights: a Hugging Face model directory has {SAFETENSORS}, {SAFETENSORS_INDEX} "
        f"(sharded) or {PICKLE}"
    )


def _read_pickle(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a bad or unsafe pickle
        raise CheckpointError(f"{path} could not be read as a weights-only PyTorch checkpoint: {err}") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a flat dictionary of tensors (a state dict)")
    return state


# Rule matching ----------------------------------------------------------------------------------------------
@functools.cache
def _pattern(template: str) -> re.Pattern[str]:
    """`stack.blocks.{i}.mlp` matches itself with any layer index, alone or followed by `.weight`, `.bias`, ..."""
    body = re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)")
    return re.compile(f"^{body}(?P<rest>\\..+)?$")


def _translate(name: str, source: str, target: str) -> str | None:
    match = _pattern(source).match(name)
    if match is None:
        return None
    filled = target.replace("{i}", match["i"]) if "{i}" in source else target
    return filled + (match["rest"] or "")


def _is_weight(name: str) -> bool:
    return name.endswith(".weight")


def hf_name(name: str, family: FamilyMap, config: ModelConfig | None) -> tuple[str, Rule] | None:
    """The Hugging Face name an attnkit tensor is written under, and the rule that says so. Without a config,
    the first name any rule gives (for messages)."""
    for rule in family.tensors:
        if config is not None and rule.when is not None and getattr(config, rule.when[0]) != rule.when[1]:
            continue
        theirs = _translate(name, rule.ours, rule.theirs)
        if theirs is not None:
            return theirs, rule
    return None


def strip_prefix(tensors: dict[str, Any], family: FamilyMap) -> dict[str, Any]:
    """Drop the base prefix (a bare base model's own layout)."""
    return {k.removeprefix(family.base_prefix): v for k, v in tensors.items()}


def add_prefix(tensors: dict[str, Tensor], family: FamilyMap) -> dict[str, Tensor]:
    """Give a bare base model's tensors the prefix the rules are written with (no-op when they have it)."""
    if any(name.startswith(family.base_prefix) for name in tensors):
        return tensors
    return {family.base_prefix + k: v for k, v in tensors.items()}


# Hugging Face -> attnkit ------------------------------------------------------------------------------------
def without_zero_rows(tensors: dict[str, Tensor], family: FamilyMap) -> dict[str, Tensor]:
    """The tensors less the family's `zero_row_tables` that are one row of zeros (a model without the table, as
    `to_hf_tensors` writes it: `config_from_hf` reads its field as 0)."""
    zero = {table for table, _ in family.zero_row_tables
            if table in tensors and tensors[table].shape[0] == 1 and not tensors[table].any()}
    return {name: tensor for name, tensor in tensors.items() if name not in zero}


def load_hf_tensors(
    model: nn.Module, tensors: dict[str, Tensor], family: FamilyMap, *, architecture: str, source: str
) -> None:
    """Copy Hugging Face tensors into `model` after checking that every tensor has its place, and the shapes fit.

    Raises one CheckpointError listing missing tensors, unexpected tensors, shape mismatches, and tied tensors
    (one attnkit tensor) whose copies in the checkpoint differ.
    """
    expected = unique_state_dict(model)
    every = model.state_dict()  # tied copies under all their names
    canonical = {name: _owner(tensor, expected) for name, tensor in every.items()}
    found: dict[str, tuple[str, Tensor]] = {}  # attnkit name -> (Hugging Face name, tensor)
    unexpected, mismatched, conflicts, misfits = [], [], [], set()
    dropped = family.dropped(architecture)
    ignored = [_pattern(template) for template in (*family.ignored, *dropped)]
    for theirs, tensor in tensors.items():
        if any(p.match(theirs) for p in ignored):
            continue
        produced = [(rule, _translate(theirs, rule.theirs, rule.ours)) for rule in family.tensors]
        produced = [(rule, ours) for rule, ours in produced if ours is not None and ours in canonical]
        if not produced:
            unexpected.append(theirs)
        for rule, ours in produced:
            value = _to_ours(tensor, rule, ours)
            target = canonical[ours]
            if value is None or value.shape != expected[target].shape:
                shape = tuple(value.shape) if value is not None else tuple(tensor.shape)
                mismatched.append(f"{theirs} -> {ours}: checkpoint {shape} vs model {tuple(expected[target].shape)}")
                misfits.add(target)
            elif target in found and not torch.equal(found[target][1], value):
                pair = " and ".join(sorted((theirs, found[target][0])))
                conflicts.append(
                    f"{pair} differ (config.json makes them one tensor; for a model trained untied, set "
                    f"tie_word_embeddings to false)"
                )
            else:
                found.setdefault(target, (theirs, value))
    missing = []
    for name, tensor in expected.items():
        if name in found or name in misfits:
            continue
        located = hf_name(name, family, None)
        if located is not None and located[0] in family.zero_if_missing:
            found[name] = (located[0], torch.zeros_like(tensor))
        else:
            missing.append(located[0] if located is not None else name)
    raise_mismatch(
        source,
        missing=sorted(set(missing)),
        unexpected=sorted(unexpected),
        mismatched=mismatched,
        conflicts=conflicts,
    )
    parameters = {name for name, _ in model.named_parameters()}
    check_weights((found[name] for name in expected if name in parameters), source)
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(found[name][1].to(target.dtype))


def _owner(tensor: Tensor, expected: dict[str, Tensor]) -> str:
    """The name under which `unique_state_dict` keeps the storage of `tensor`."""
    for name, candidate in expected.items():
        if candidate is tensor or (
            candidate.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
            and candidate.storage_offset() == tensor.storage_offset()
            and candidate.shape == tensor.shape
        ):
            return name
    raise KeyError(tensor)


def _to_ours(tensor: Tensor, rule: Rule, ours: str) -> Tensor | None:
    """Undo the Hugging Face layout of one tensor; None when its shape cannot be split as the rule says."""
    if rule.layout == "conv1d" and _is_weight(ours) and tensor.dim() == 2:
        tensor = tensor.t()  # (in, out) -> (out, in)
    elif rule.layout == "row" and tensor.dim() == 2 and tensor.shape[0] == 1:
        tensor = tensor[0]  # (1, V) -> (V,)
    if rule.part is not None:
        index, count = rule.part
        if tensor.shape[0] % count:
            return None
        tensor = tensor.chunk(count, dim=0)[index]  # (n * out, ...) -> (out, ...)
    return tensor.contiguous()


# attnkit -> Hugging Face ------------------------------------------------------------------------------------
def hf_tensor_names(model_state: dict[str, Tensor], family: FamilyMap, config: ModelConfig) -> set[str] | None:
    """The Hugging Face names `model_state` would be written under; None if a tensor has no rule."""
    names = set()
    for name in model_state:
        located = hf_name(name, family, config)
        if located is None:
            return None
        names.add(located[0])
    return names


def to_hf_tensors(model: nn.Module, family: FamilyMap, config: ModelConfig) -> dict[str, Tensor]:
    """The model's tensors (tied ones once) in the family's Hugging Face layout, fused tensors rejoined, and one row of
    zeros for each of the family's `zero_row_tables` the model has none of."""
    out: dict[str, Tensor] = {}
    parts: dict[str, list[Tensor | None]] = {}
    layouts: dict[str, str] = {}
    for name, tensor in unique_state_dict(model).items():
        located = hf_name(name, family, config)
        if located is None:
            raise CheckpointError(f"the {family.model_type} layout has no place for {name}")
        theirs, rule = located
        tensor = tensor.detach()
        if rule.part is not None:
            parts.setdefault(theirs, [None] * rule.part[1])[rule.part[0]] = tensor
            layouts[theirs] = rule.layout
            continue
        out[theirs] = _to_theirs(tensor, rule.layout, theirs)
    for theirs, pieces in parts.items():
        if any(piece is None for piece in pieces):
            raise CheckpointError(f"{theirs} is fused from {len(pieces)} tensors but the model has fewer")
        out[theirs] = _to_theirs(torch.cat(pieces, dim=0), layouts[theirs], theirs)  # (n * out, ...)
    dtype = next(model.parameters()).dtype
    for table, field in family.zero_row_tables:
        if getattr(config, family.config_fields[field]) == 0:  # the table the Hugging Face class reads, adding nothing
            out[table] = torch.zeros(1, config.d_model, dtype=dtype)  # (1, C)
    return out


def _to_theirs(tensor: Tensor, layout: str, theirs: str) -> Tensor:
    if layout == "conv1d" and _is_weight(theirs) and tensor.dim() == 2:
        return tensor.t().contiguous()  # (out, in) -> (in, out)
    if layout == "row":
        return tensor.unsqueeze(0)  # (V,) -> (1, V)
    return tensor
