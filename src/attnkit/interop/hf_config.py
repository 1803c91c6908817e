"""Hugging Face `config.json` <-> `ModelConfig`, driven by the tables in `keymaps`.

Reading copies the renamed fields, fixes what the family always is, and adds the few values that need arithmetic.
Writing goes the other way; `match_family` then reads the written config back and keeps the first family and
architecture that reproduce the attnkit config exactly, so a model is only ever written in a layout that holds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import ConfigError
from attnkit.interop.keymaps import ACTIVATIONS_FROM_HF, ACTIVATIONS_TO_HF, FAMILIES, FamilyMap

_MISSING = object()
# ModelConfig fields whose meaning is a derived value (None: "same as ..."); configs are compared through these.
_RESOLVED = {"n_kv_heads": "kv_heads", "head_dim": "head_size", "n_decoder_layers": "decoder_layers",
             "final_norm": "use_final_norm"}
_TRAINING_ONLY = ("dropout", "attention_dropout", "label_smoothing")


def family_of(hf: dict[str, Any], source: str) -> FamilyMap:
    """The key map for config.json's `model_type`. Raises ConfigError naming the supported types."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        what = f"model_type {model_type!r}" if model_type is not None else "no model_type"
        raise ConfigError(
            f"{source} has {what}; attnkit reads Hugging Face models of type {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[model_type]


def architecture_of(hf: dict[str, Any], family: FamilyMap, source: str) -> str:
    """The model class named by config.json's `architectures` (the family's first when absent)."""
    named = hf.get("architectures") or [next(iter(family.architectures))]
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
    leaves unsaid (whether a bare BERT has its pooler). Raises ConfigError naming the field."""
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
    fields.update(_FROM_HF[family.model_type](hf, fields, architecture, set(tensor_names), source))
    try:
        return ModelConfig(**fields)
    except ConfigError as err:
        raise ConfigError(f"{source} describes a model attnkit cannot build: {err}") from None


def config_to_hf(
    config: ModelConfig, family: FamilyMap, architecture: str, *, labels: Sequence[str] | None = None
) -> dict[str, Any]:
    """The config.json fields for `config` written as `architecture` (token ids are added by the caller)."""
    hf: dict[str, Any] = {"model_type": family.model_type, "architectures": [architecture], **family.hf_fixed}
    for theirs, ours in family.config_fields.items():
        value = getattr(config, _RESOLVED.get(ours, ours))
        hf[theirs] = ACTIVATIONS_TO_HF.get(value, value) if ours == "activation" else value
    hf.update(_TO_HF[family.model_type](config, labels))
    return hf


def match_family(
    config: ModelConfig, hf_names: Callable[[FamilyMap], set[str] | None], *, labels: Sequence[str] | None = None
) -> tuple[FamilyMap, str]:
    """The first (family, architecture) whose config.json reproduces `config` exactly.

    hf_names(family): the Hugging Face tensor names the model would be written under, or None when the family's
    layout has no place for one of its tensors. Raises ConfigError with the differences of the nearest family.
    """
    wanted = _structure(config)
    nearest: tuple[int, str] | None = None
    for family in FAMILIES.values():
        if family.ours_fixed["family"] != config.family:  # a layout of another family cannot hold this model
            continue
        for architecture in family.architectures:
            names = hf_names(family)
            if names is None:  # a tensor the layout has no place for: not a candidate at all
                continue
            try:
                hf = config_to_hf(config, family, architecture, labels=labels)
                back = _structure(config_from_hf(hf, family, architecture, tensor_names=names, source="config"))
                problems = [
                    f"{name}={wanted.get(name)!r} (a {architecture} has {back.get(name)!r})"
                    for name in sorted(set(wanted) | set(back))
                    if wanted.get(name) != back.get(name)
                ]
            except ConfigError as err:
                problems = [str(err)]
            if not problems:
                return family, architecture
            if nearest is None or len(problems) < nearest[0]:
                nearest = (len(problems), f"{architecture}: " + "; ".join(problems))
    raise ConfigError(
        "this model has no Hugging Face layout attnkit writes (GPT-2, Llama, BERT, Marian); the nearest is "
        f"{nearest[1] if nearest else '-'}"
    )


def _structure(config: ModelConfig) -> dict[str, Any]:
    """The fields that decide the function a config computes (training-only and inert fields left out)."""
    unused = set(_TRAINING_ONLY) | config.inert_fields()
    return {f.name: getattr(config, _RESOLVED.get(f.name, f.name)) for f in dataclasses.fields(config)
            if f.name not in unused}


def _activation_from_hf(value: Any, field: str, source: str) -> str:
    if value not in ACTIVATIONS_FROM_HF:
        raise ConfigError(
            f"{source}: {field}={value!r} is not an activation attnkit has; supported: "
            f"{', '.join(ACTIVATIONS_FROM_HF)}"
        )
    return ACTIVATIONS_FROM_HF[value]


# Per-family values that need more than a rename --------------------------------------------------------------
def _gpt2_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    return {"d_ff": hf.get("n_inner") or 4 * fields["d_model"]}  # n_inner None: GPT-2's 4 C


def _gpt2_to_hf(config: ModelConfig, labels) -> dict[str, Any]:
    return {"n_inner": config.d_ff}


def _llama_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(
            f"{source}: RoPE scaling {rope_type!r} is not supported; attnkit implements plain RoPE "
            f"(rope_type 'default', Su et al. 2021)"
        )
    if hf.get("mlp_bias", False) != fields["bias"]:
        raise ConfigError(
            f"{source}: attention_bias={fields['bias']} but mlp_bias={hf.get('mlp_bias')}; attnkit's `bias` switches "
            f"the biases of attention and feed-forward together"
        )
    return {"rope_theta": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))}


def _llama_to_hf(config: ModelConfig, labels) -> dict[str, Any]:
    return {
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_theta": config.rope_theta,
        "mlp_bias": config.bias,
    }


def _bert_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    if fields["encoder_head"] == "none":  # BertModel(add_pooling_layer=False) leaves no trace but its tensors
        return {"pooler": "bert.pooler.dense.weight" in names}
    if fields["encoder_head"] == "mlm":
        return {"pooler": False}
    labels = hf.get("id2label")
    return {"pooler": True, "n_classes": len(labels) if labels else int(hf.get("num_labels", 2))}


def _bert_to_hf(config: ModelConfig, labels) -> dict[str, Any]:
    if config.encoder_head != "classify":
        return {}
    names = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(config.n_classes)]
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def _marian_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    for decoder_field, encoder_field in (("decoder_attention_heads", "encoder_attention_heads"),
                                         ("decoder_ffn_dim", "encoder_ffn_dim")):
        if hf.get(decoder_field, hf.get(encoder_field)) != hf.get(encoder_field):
            raise ConfigError(
                f"{source}: {decoder_field}={hf.get(decoder_field)} differs from {encoder_field}="
                f"{hf.get(encoder_field)}; attnkit's encoder and decoder share n_heads and d_ff"
            )
    target_vocab = hf.get("decoder_vocab_size") or fields["vocab_size"]
    if hf.get("share_encoder_decoder_embeddings", True):
        if target_vocab != fields["vocab_size"]:
            raise ConfigError(
                f"{source}: share_encoder_decoder_embeddings is set but decoder_vocab_size={target_vocab} differs "
                f"from vocab_size={fields['vocab_size']}"
            )
        return {"tgt_vocab_size": None}
    return {"tgt_vocab_size": target_vocab}


def _marian_to_hf(config: ModelConfig, labels) -> dict[str, Any]:
    return {
        "decoder_attention_heads": config.n_heads,
        "decoder_ffn_dim": config.d_ff,
        "decoder_vocab_size": config.target_vocab_size,
        "share_encoder_decoder_embeddings": config.tgt_vocab_size is None,
        "is_encoder_decoder": True,
    }


_FROM_HF = {"gpt2": _gpt2_from_hf, "llama": _llama_from_hf, "bert": _bert_from_hf, "marian": _marian_from_hf}
_TO_HF = {"gpt2": _gpt2_to_hf, "llama": _llama_to_hf, "bert": _bert_to_hf, "marian": _marian_to_hf}
