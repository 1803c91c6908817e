"""Hugging Face `config.json` <-> `ModelConfig`, driven by the registry entries in `keymaps`.

Reading copies the renamed fields, fixes what the family always is, and adds the few values that need arithmetic.
Writing goes the other way; `match_family` then reads the written config back and keeps the first family and
architecture that reproduce the attnkit config exactly, so a model is only ever written in a layout that holds it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import ConfigError
from attnkit.interop.keymaps import (
    ACTIVATIONS_FROM_HF,
    ACTIVATIONS_TO_HF,
    FAMILIES,
    HF_CONFIG_FIX,
    FamilyMap,
    supported_text,
)
from attnkit.interop.targets import elsewhere
from attnkit.readback import FileFields

log = logging.getLogger(__name__)

_MISSING = object()
_TRAINING_ONLY = ("dropout", "attention_dropout", "label_smoothing")
_NEEDS_A_LAYOUT = ("--to-hf", "--to-gguf")  # GGUF writes a model as the Hugging Face layout that holds it


def family_of(hf: dict[str, Any], source: str) -> FamilyMap:
    """The registry entry for config.json's `model_type`. Raises ConfigError naming the supported ones."""
    model_type = hf.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        FileFields(hf, source, fix=HF_CONFIG_FIX, error=ConfigError).refuse("model_type", model_type, "a string")
    if model_type not in FAMILIES:
        what = f"model_type {model_type!r}" if model_type is not None else "no model_type"
        raise ConfigError(
            f"{source} has {what}; attnkit reads these model types and classes: {supported_text()}"
        )
    return FAMILIES[model_type]


def architecture_of(hf: dict[str, Any], family: FamilyMap, source: str) -> str:
    """The model class named by config.json's `architectures` (the family's default when absent)."""
    checked = FileFields(hf, source, fix=HF_CONFIG_FIX, error=ConfigError)
    named = checked.strings("architectures", default=None) or [family.default_architecture]
    architecture = named[0]
    if architecture not in family.architectures:
        raise ConfigError(
            f"{source} describes a {architecture}; attnkit reads the {family.model_type} classes "
            f"{', '.join(family.architectures)}"
        )
    return architecture


def config_from_hf(
    hf: dict[str, Any], family: FamilyMap, architecture: str, *, tensor_names: Collection[str], source: str
) -> ModelConfig:
    """The ModelConfig a Hugging Face config describes. `tensor_names` (Hugging Face names) settle what config.json
    leaves unsaid (whether a bare BERT has its pooler; a table of one row of zeros, left out of them by
    `hf_weights.without_zero_rows`, is none). Raises ConfigError naming the field."""
    quantized = hf.get("quantization_config")
    if quantized is not None:  # weights as integers or float8 with scales beside them, under names of their own
        method = quantized.get("quant_method") if isinstance(quantized, dict) else None
        raise ConfigError(
            f"{source} describes a quantized checkpoint (quantization_config, quant_method {method!r}), whose weights "
            f"attnkit does not read; convert the model's unquantized weights (float32, float16 or bfloat16), and "
            f"quantize when it runs (attnkit generate --int8)"
        )
    for name, required in family.hf_fixed.items():
        value = hf.get(name, required)
        if value != required:
            raise ConfigError(
                f"{source}: {name}={value!r} is not supported; attnkit reads {family.model_type} models with "
                f"{name}={required!r}"
            )
    fields: dict[str, Any] = {**family.ours_fixed, **family.architectures[architecture]}
    for theirs, ours in family.config_fields.items():
        value = hf.get(theirs, family.hf_defaults.get(theirs, _MISSING))
        if value is _MISSING:
            raise ConfigError(f"{source} lacks {theirs!r}, which every {family.model_type} config.json holds")
        fields[ours] = _activation_from_hf(value, theirs, source) if ours == "activation" else value
    for table, theirs in family.zero_row_tables:  # one row of zeros (left out of tensor_names): no table
        if fields[family.config_fields[theirs]] == 1 and table not in tensor_names:
            fields[family.config_fields[theirs]] = 0
    fields.update(family.from_hf(hf, fields, architecture, set(tensor_names), source))
    try:
        return ModelConfig(**fields)
    except ConfigError as err:
        raise ConfigError(f"{source} describes a model attnkit cannot build: {err}") from None


def config_to_hf(
    config: ModelConfig, family: FamilyMap, architecture: str, *, labels: Sequence[str] | None = None
) -> dict[str, Any]:
    """The config.json fields for `config` written as `architecture` (token ids are added by the caller)."""
    hf: dict[str, Any] = {"model_type": family.model_type, "architectures": [architecture], **family.hf_fixed}
    resolved = config.resolved  # "None: same as ..." fields as the numbers Hugging Face configs hold
    for theirs, ours in family.config_fields.items():
        value = getattr(resolved, ours)
        hf[theirs] = ACTIVATIONS_TO_HF.get(value, value) if ours == "activation" else value
    for _, theirs in family.zero_row_tables:  # written as one row of zeros (`to_hf_tensors`)
        hf[theirs] = hf[theirs] or 1
    hf.update(family.to_hf(config, labels))
    return hf


def match_family(
    config: ModelConfig,
    hf_names: Callable[[FamilyMap], set[str] | None],
    *,
    labels: Sequence[str] | None = None,
    prefer: str | None = None,
) -> tuple[FamilyMap, str]:
    """The first (family, architecture) whose config.json reproduces `config` exactly, `prefer` (the class a
    converted model came from) tried first.

    hf_names(family): the Hugging Face tensor names the model would be written under, or None when the family's
    layout has no place for one of its tensors. Raises ConfigError with the differences of the nearest family: of
    those whose layout places every tensor, else of all of the model's family (a model built from scratch, e.g. a
    pre-norm encoder with a final norm, which BERT's layout lacks).
    """
    wanted = _structure(config)
    nearest: tuple[int, str] | None = None
    unplaced: tuple[int, str] | None = None  # the nearest of the layouts that have no place for some tensor
    candidates = [(family, architecture) for family in FAMILIES.values() for architecture in family.architectures]
    candidates.sort(key=lambda candidate: candidate[1] != prefer)  # stable: otherwise the registry's order
    for family, architecture in candidates:
        if family.ours_fixed["family"] != config.family:  # a layout of another family cannot hold this model
            continue
        names = hf_names(family)
        try:
            hf = config_to_hf(config, family, architecture, labels=labels)
            back = _structure(config_from_hf(hf, family, architecture, tensor_names=names or set(), source="config"))
            differing = [name for name in sorted(set(wanted) | set(back)) if wanted.get(name) != back.get(name)]
            # a field one side alone uses follows from one both use (rope_theta from position): said only if alone
            shown = [name for name in differing if name in wanted and name in back] or differing
            problems = [f"{name}={wanted.get(name)!r} (a {architecture} has {back.get(name)!r})" for name in shown]
            distance = len(differing)
        except ConfigError as err:
            problems, distance = [str(err)], 1
        if names is None:  # a tensor the layout has no place for: never written, only named when nothing is nearer
            problems = problems or [f"a tensor a {architecture} has no place for"]
            distance = max(distance, 1)
            if unplaced is None or distance < unplaced[0]:
                unplaced = (distance, f"{architecture}: " + "; ".join(problems))
            continue
        if not problems:
            return family, architecture
        if nearest is None or distance < nearest[0]:
            nearest = (distance, f"{architecture}: " + "; ".join(problems))
    nearest = nearest or unplaced
    if nearest is None:
        raise ConfigError(f"this model (family={config.family!r}) has no Hugging Face layout attnkit writes "
                          f"({supported_text()}): {elsewhere(config, *_NEEDS_A_LAYOUT)}")
    raise ConfigError(
        f"this model has no Hugging Face layout attnkit writes ({supported_text()}); the nearest is {nearest[1]}. "
        f"Train with those fields as the class has them (--set NAME=VALUE), or {elsewhere(config, *_NEEDS_A_LAYOUT)}"
    )


def _structure(config: ModelConfig) -> dict[str, Any]:
    """The fields that decide the function a config computes (training-only and inert fields left out), resolved
    ("None: same as ..." compares equal to the value it stands for)."""
    unused = set(_TRAINING_ONLY) | config.inert_fields()
    resolved = config.resolved
    return {f.name: getattr(resolved, f.name) for f in dataclasses.fields(config) if f.name not in unused}


def special_ids_from_hf(hf: dict[str, Any], family: FamilyMap, vocab_size: int, source: str
                        ) -> dict[str, int | list[int]]:
    """config.json's token ids (bos_token_id, eos_token_id, ...: a number, a list of them, or null), each a whole
    number. An id outside the model's vocabulary (GPT2Config's default 50256 kept in a config of 311 tokens) is read
    as absent, as transformers loads it (with a warning), and said in one line: it names no token the model has.
    Returns those given as one number within the vocabulary, and eos_token_id as a list where it lists several end
    tokens within it (transformers' generate stops at any; so do attnkit's `Pipeline.generate` and server). Raises
    ConfigError for an id that is no whole number."""
    outside = []
    for name in family.special_ids:
        value = hf.get(name)
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is None:
                continue
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise ConfigError(f"{source}: {name}={value!r} is not a token id (a whole number, a list of them, or "
                                  "null); set it to the id the token has in tokenizer.json, or to null")
            if not 0 <= token_id < vocab_size and f"{name}={value!r}" not in outside:
                outside.append(f"{name}={value!r}")
    if outside:
        log.warning("%s: %s outside the vocabulary (vocab_size=%d: ids 0 to %d): read as absent, as no token has "
                    "that id", source, ", ".join(outside), vocab_size, vocab_size - 1)
    found: dict[str, int | list[int]] = {
        name: hf[name] for name in family.special_ids
        if isinstance(hf.get(name), int) and not isinstance(hf[name], bool) and 0 <= hf[name] < vocab_size}
    ends = hf.get("eos_token_id")
    if isinstance(ends, list) and len(ends := [i for i in ends if isinstance(i, int) and 0 <= i < vocab_size]) > 1:
        found["eos_token_id"] = ends  # several end tokens (Llama 3's <|end_of_text|> and <|eot_id|>): any stops
    return found


def _activation_from_hf(value: Any, field: str, source: str) -> str:
    if not isinstance(value, str) or value not in ACTIVATIONS_FROM_HF:
        raise ConfigError(
            f"{source}: {field}={value!r} is not an activation attnkit has; supported: "
            f"{', '.join(ACTIVATIONS_FROM_HF)}"
        )
    return ACTIVATIONS_FROM_HF[value]
