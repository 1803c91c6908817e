"""Hugging Face model directories in and out, with the reference's numbers, for the architectures of the
registry `attnkit.interop.keymaps.FAMILIES` (`attnkit convert --help` lists them).

    load(dir)                        config.json + safetensors (+ tokenizer.json) -> model, ModelConfig, tokenizer
    save(model, dir, config=...)     -> a directory `transformers` loads with from_pretrained; a mean-pooled BERT
                                        encoder as a sentence-transformers directory, with its classifier in
                                        classifier/ (`attnkit.interop.sentence_embeddings`)
    convert_from_hf(dir, run_dir)    -> runs/NAME (config.json, model.safetensors, tokenizer/, labels.json)
    convert_to_hf(run_dir, dir)      the way back

Nothing here imports `transformers`: config.json is JSON and the weights are safetensors (or, only when the caller
allows it, a weights-only pickle). The layouts are the registry entries of `attnkit.interop.keymaps`. An encoder's
tokenizer.json frames its text as attnkit does (`[CLS] text [SEP]`: `attnkit.interop.runtime_tokenizer`), so the
tokenizer `transformers` reads from the directory gives the ids the model was trained on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnkit.chat_format import (
    DEFAULT_CHAT_TEMPLATE,
    TEMPLATE_CONFIG,
    check_template,
    config_template,
    is_default_template,
)
from attnkit.checkpoint import (
    CONFIG_FILE,
    HF_SOURCE_FILE,
    LABELS_FILE,
    TASK_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    atomic_write,
    check_weights_cover,
    is_attnkit_run,
    load_run_model,
    mark_run,
    read_json,
    read_labels,
    record_checksums,
    save_model,
    stored_dtype,
    unique_state_dict,
)
from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError, ConfigError, InputError
from attnkit.interop.hf_config import (
    architecture_of,
    config_from_hf,
    config_to_hf,
    family_of,
    match_family,
    special_ids_from_hf,
)
from attnkit.interop.hf_shards import MAX_SHARD_SIZE, SAFETENSORS, SAFETENSORS_INDEX, parse_shard_size, save_shards
from attnkit.interop.hf_weights import (
    add_prefix,
    hf_tensor_names,
    load_hf_tensors,
    read_weights,
    strip_prefix,
    to_hf_tensors,
    without_zero_rows,
)
from attnkit.interop.keymaps import FamilyMap
from attnkit.interop.runtime_tokenizer import runtime_tokenizer
from attnkit.interop.sentence_embeddings import (
    CLASSIFIER_CLASS,
    CLASSIFIER_DIR,
    REMOTE_CODE,
    classifier_fields,
    has_classifier,
    mean_pooled_body,
    sentence_transformers_files,
)
from attnkit.models import build_model
from attnkit.outputs import as_written, atomic_output, check_output, clear_leftovers
from attnkit.tasks import task_of_config, task_of_run, task_record
from attnkit.tasks.reading import frame_of
from attnkit.tokenize import HF_FILE, JSON_KINDS, Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"  # transformers' generate settings, beside config.json
_NULLABLE_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
PEFT_ADAPTER_CONFIG = "adapter_config.json"  # a PEFT (LoRA) adapter directory's, beside adapter_model.safetensors
_ROLE_IDS = {"bos_token_id": "bos", "eos_token_id": "eos", "pad_token_id": "pad", "decoder_start_token_id": "bos"}


@dataclass
class HFModel:
    """What `load` returns. `special_ids` are config.json's token ids (bos_token_id, decoder_start_token_id, ...;
    eos_token_id a list where the model has several end tokens, from generation_config.json where it lists them)."""

    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer | None
    labels: list[str] | None
    model_type: str
    architecture: str
    special_ids: dict[str, int | list[int]]


def _id_list(value: Any) -> list[int]:
    """The token ids an eos_token_id names (a number, or a list of them); [] for anything else."""
    values = value if isinstance(value, list) else [value]
    return [i for i in values if isinstance(i, int) and not isinstance(i, bool)]


def load(
    directory: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    allow_pickle: bool = False,
) -> HFModel:
    """Read a Hugging Face model directory into an attnkit model (eval mode), its config and its tokenizer.

    allow_pickle: read `pytorch_model.bin` (a pickle) when there are no safetensors, with
        `torch.load(weights_only=True)`; refused otherwise.
    Raises CheckpointError (no config.json, unreadable or mismatched weights) or ConfigError (an unsupported
    model_type, class or option).
    """
    directory = Path(directory)
    hf = read_hf_config(directory)
    source = str(directory / CONFIG_FILE)
    generation = read_json(directory / GENERATION_CONFIG) if (directory / GENERATION_CONFIG).is_file() else {}
    ends = generation.get("eos_token_id") if isinstance(generation, dict) else None
    named = _id_list(hf.get("eos_token_id"))
    one_id = _id_list(ends) == [ends]  # generation_config.json names a single end token, not a list
    if one_id and named and ends not in named:
        ends = [*named, ends]  # a Qwen chat model names <|im_end|> here, <|endoftext|> there: generate stops at each
    if isinstance(ends, list) or (one_id and hf.get("eos_token_id") is None):
        hf = {**hf, "eos_token_id": ends}  # Llama 3 lists its end tokens here, config.json one of them
    family = family_of(hf, source)
    architecture = architecture_of(hf, family, source)
    tensors = without_zero_rows(add_prefix(read_weights(directory, allow_pickle=allow_pickle), family), family)
    config = config_from_hf(hf, family, architecture, tensor_names=set(tensors), source=source)
    check_weights_cover(config, sum(tensor.numel() for tensor in tensors.values()), config_file=source,
                        weights=f"the weights of {directory}")
    model = build_model(config)
    load_hf_tensors(model, tensors, family, architecture=architecture, source=str(directory))
    model.to(device=device, dtype=dtype).eval()
    log.debug("loaded %s (%s) from %s", architecture, family.model_type, directory)
    return HFModel(
        model=model,
        config=config,
        tokenizer=_read_tokenizer(directory, config),
        labels=_labels(hf) if (task := task_of_config(config)) is not None and task.labelled else None,
        model_type=family.model_type,
        architecture=architecture,
        special_ids=special_ids_from_hf(hf, family, config.vocab_size, source),
    )


def save(
    model: nn.Module,
    directory: str | Path,
    *,
    config: ModelConfig,
    tokenizer: Tokenizer | None = None,
    labels: Sequence[str] | None = None,
    special_ids: dict[str, int] | None = None,
    architecture: str | None = None,
    chat_template: str | None = None,
    own_frame: bool = False,
    max_shard_size: int | str = MAX_SHARD_SIZE,
) -> str:
    """Write `model` as a Hugging Face model directory (config.json, model.safetensors, tokenizer files, with
    `chat_template` in tokenizer_config.json where given; `own_frame`: a tagger's tokenizer.json frames its text as
    the tokenizer's own post-processor does, not as attnkit frames it: `attnkit.interop.runtime_tokenizer`).

    The layout is `architecture` when it holds `config` exactly (a converted model's own class), else the first of
    the registry's that does; a mean-pooled BERT encoder is written for sentence-transformers, with its classifier
    for transformers (`attnkit.interop.sentence_embeddings`). special_ids: config.json's token ids; those not given
    come from the tokenizer. max_shard_size: as save_pretrained's, weights past it split into
    `model-0000i-of-0000n.safetensors` with an index (`attnkit.interop.hf_shards`). Returns what was written (the
    Hugging Face class). Raises ConfigError naming the fields no supported layout can express, InputError for a
    size that is not one.
    """
    directory = Path(directory)
    shard_bytes = parse_shard_size(max_shard_size)
    body = mean_pooled_body(config)
    if body is not None:
        return _save_mean_pooled(model, directory, config=config, body=body, tokenizer=tokenizer, labels=labels,
                                 special_ids=special_ids, shard_bytes=shard_bytes)
    state = unique_state_dict(model)
    family, architecture = match_family(
        config, lambda f: hf_tensor_names(state, f, config), labels=labels, prefer=architecture
    )
    if getattr(config, "encoder_head", None) == "none" and not config.pooler:
        log.warning("%s has no pooler; transformers will add a randomly initialised one when it loads it", architecture)
    _write(model, directory, config=config, family=family, architecture=architecture, tokenizer=tokenizer,
           labels=labels, special_ids=special_ids, chat_template=chat_template, own_frame=own_frame,
           shard_bytes=shard_bytes)
    return architecture


def _write(model: nn.Module, directory: Path, *, config: ModelConfig, family: FamilyMap, architecture: str,
           tokenizer: Tokenizer | None, labels: Sequence[str] | None, special_ids: dict[str, int] | None,
           fields: dict[str, Any] | None = None, chat_template: str | None = None, own_frame: bool = False,
           shard_bytes: int) -> None:
    """config.json (the family's fields for `config`, then `fields`), model.safetensors (or its shards, each at most
    `shard_bytes`) and the tokenizer files."""
    hf = config_to_hf(config, family, architecture, labels=labels)
    hf.update(_special_ids(family, tokenizer, special_ids or {}))
    hf["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    hf.update(fields or {})
    tensors = to_hf_tensors(model, family, config)
    if architecture in family.bare_architectures:
        tensors = strip_prefix(tensors, family)
    save_shards(tensors, directory, max_bytes=shard_bytes, metadata={"format": "pt"})
    atomic_write(directory / CONFIG_FILE, json.dumps(hf, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        _write_tokenizer(tokenizer, directory, config=config, chat_template=chat_template, own_frame=own_frame)
    log.debug("wrote %s (%s) to %s", architecture, family.model_type, directory)


def _save_mean_pooled(model: nn.Module, directory: Path, *, config: ModelConfig, body: ModelConfig,
                      tokenizer: Tokenizer | None, labels: Sequence[str] | None,
                      special_ids: dict[str, int] | None, shard_bytes: int) -> str:
    """A mean-pooled encoder: its body as a sentence-transformers directory, and a classifier's head with the body in
    classifier/ (`attnkit.interop.sentence_embeddings`). Raises ConfigError when BERT's layout cannot hold the
    body."""
    encoder = build_model(body).to(next(model.parameters()).dtype)
    own = encoder.state_dict()
    encoder.load_state_dict({name: tensor for name, tensor in model.state_dict().items() if name in own})  # strict
    state = unique_state_dict(encoder)
    family, architecture = match_family(body, lambda f: hf_tensor_names(state, f, body), prefer="BertModel")
    if architecture != "BertModel":
        raise ConfigError(f"a mean-pooled encoder is written for sentence-transformers as a BertModel; this one's "
                          f"body is a {architecture}")
    _write(encoder, directory, config=body, family=family, architecture=architecture, tokenizer=tokenizer,
           labels=None, special_ids=special_ids, shard_bytes=shard_bytes)
    for name, value in sentence_transformers_files(body).items():
        atomic_write(directory / name, json.dumps(value, indent=2) + "\n")
    written = "sentence-transformers model (a BertModel, mean pooling)"
    if has_classifier(config):
        classifier = directory / CLASSIFIER_DIR
        _write(model, classifier, config=config, family=family, architecture=CLASSIFIER_CLASS, tokenizer=tokenizer,
               labels=labels, special_ids=special_ids, fields=classifier_fields(), shard_bytes=shard_bytes)
        atomic_write(classifier / REMOTE_CODE.name, REMOTE_CODE.read_bytes())
        written += f", its classifier in {CLASSIFIER_DIR}/ as a {CLASSIFIER_CLASS} (trust_remote_code=True)"
    return written


def convert_from_hf(
    hf_dir: str | Path, run_dir: str | Path, *, allow_pickle: bool = False, dtype: torch.dtype = torch.float32,
    overwrite: bool = False,
) -> HFModel:
    """Turn a Hugging Face model directory into a run directory that generate / translate / classify use, written
    whole or not at all (`attnkit.outputs.atomic_output`); `overwrite` replaces a run attnkit wrote there."""
    run_dir = Path(run_dir)
    if run_dir.resolve() == Path(hf_dir).resolve():
        raise InputError(f"--out {run_dir} is the Hugging Face directory being read; choose another --out (a new or "
                         "empty directory) for the run")
    _refuse_existing(run_dir, "--out", overwrite=overwrite, replaceable=is_attnkit_run(run_dir))
    check_output(run_dir, directory=True, overwrite=overwrite)
    loaded = load(hf_dir, dtype=dtype, allow_pickle=allow_pickle)
    settings = _tokenizer_settings(Path(hf_dir)) if loaded.tokenizer is not None else None
    with atomic_output(run_dir, directory=True, overwrite=overwrite) as partial:
        save_model(loaded.model, loaded.config, partial)
        if loaded.tokenizer is not None:
            loaded.tokenizer.save(partial / TOKENIZER_DIR)
        if settings is not None:  # the chat template attnkit serve chats in and the exports carry
            atomic_write(partial / TOKENIZER_DIR / TEMPLATE_CONFIG, settings)
        if loaded.labels is not None:
            atomic_write(partial / LABELS_FILE, json.dumps({"labels": loaded.labels}, indent=2) + "\n")
        origin = {"model_type": loaded.model_type, "architecture": loaded.architecture,
                  "special_ids": loaded.special_ids, "source": str(hf_dir)}
        atomic_write(partial / HF_SOURCE_FILE, json.dumps(origin, indent=2) + "\n")
        record_checksums(partial)  # the tokenizer, labels and origin verified as the weights are
        mark_run(partial)
    return loaded


def _tokenizer_settings(hf_dir: Path) -> bytes | None:
    """The directory's tokenizer_config.json (its chat template, its special tokens) for the run's tokenizer/, checked
    first as `attnkit serve` and the exports read it (InputError naming the file and the fault); None where it has
    none. attnkit's own template, which --to-hf writes, is left out: the run chats in attnkit's format as before, its
    stop strings with it."""
    path = hf_dir / TEMPLATE_CONFIG
    if not path.is_file():
        return None
    template, settings = config_template(hf_dir)
    if template is not None and is_default_template(template):
        del settings["chat_template"]
        return (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode()
    if template is not None:
        check_template(template, f"the chat template of {path}")
    return path.read_bytes()


def convert_to_hf(run_dir: str | Path, hf_dir: str | Path, *, overwrite: bool = False,
                  max_shard_size: int | str = MAX_SHARD_SIZE) -> str:
    """Write a run directory (trained or converted) as a Hugging Face model directory, whole or not at all, its
    weights in shards of at most `max_shard_size` where they are larger (as save_pretrained splits them);
    `overwrite` replaces a Hugging Face model directory there. A run that chats (its task generates) carries the
    chat template `attnkit serve` chats in: its own, else attnkit's (`attnkit.chat_format`). Returns the class
    written."""
    run_dir, hf_dir = Path(run_dir), Path(hf_dir)
    parse_shard_size(max_shard_size)  # a size that is not one is refused before the run loads
    if hf_dir.resolve() == run_dir.resolve() or is_attnkit_run(hf_dir):
        raise InputError(f"--to-hf {hf_dir} is an attnkit run, not a Hugging Face model directory, and --overwrite "
                         "never replaces a run: choose another --to-hf (a new or empty directory)")
    _refuse_existing(hf_dir, "--to-hf", overwrite=overwrite, replaceable=_holds_hf_model(hf_dir))
    check_output(hf_dir, directory=True, overwrite=overwrite, flag="--to-hf")
    model, config, read_from = load_run_model(run_dir)
    model.to(stored_dtype(read_from / WEIGHTS_FILE))  # as save_pretrained keeps a model's type: bf16 stays bf16
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR) if (run_dir / TOKENIZER_DIR).is_dir() else None
    if tokenizer is None:
        log.warning("%s has no %s/ directory, so %s gets the model alone: AutoTokenizer.from_pretrained will not find "
                    "a tokenizer there; put the run's tokenizer back in %s/ to export it too", run_dir, TOKENIZER_DIR,
                    hf_dir, TOKENIZER_DIR)
    labels = read_labels(run_dir)
    origin = read_json(run_dir / HF_SOURCE_FILE) if (run_dir / HF_SOURCE_FILE).is_file() else {}
    chat_template = None
    if tokenizer is not None and (task := task_of_run(run_dir, config)) is not None and task.method == "generate":
        chat_template, _ = config_template(run_dir / TOKENIZER_DIR)
        if chat_template is not None:
            check_template(chat_template, f"the chat template of {run_dir / TOKENIZER_DIR}")
        chat_template = chat_template or DEFAULT_CHAT_TEMPLATE
    with atomic_output(hf_dir, directory=True, overwrite=overwrite, flag="--to-hf") as partial:
        return save(model, partial, config=config, tokenizer=tokenizer, labels=labels,
                    special_ids=origin.get("special_ids"), architecture=origin.get("architecture"),
                    chat_template=chat_template, max_shard_size=max_shard_size,
                    own_frame=frame_of(task_record(run_dir), run_dir / TASK_FILE) == "own")


def read_hf_config(directory: Path) -> dict[str, Any]:
    """config.json of a Hugging Face model directory. Raises CheckpointError when absent or not a JSON object."""
    if not directory.is_dir():
        raise CheckpointError(f"{directory} is not a directory; point at a Hugging Face model directory")
    path = directory / CONFIG_FILE
    if not path.is_file() and (directory / PEFT_ADAPTER_CONFIG).is_file():  # LoRA adapters alone, no model
        adapters = read_json(directory / PEFT_ADAPTER_CONFIG)
        base = adapters.get("base_model_name_or_path") if isinstance(adapters, dict) else None
        named = f" ({base})" if isinstance(base, str) and base else ""
        raise CheckpointError(
            f"{directory} holds PEFT adapters ({PEFT_ADAPTER_CONFIG}), not a model: merge them into their base "
            f"model{named} first (peft: PeftModel.from_pretrained(base, \"{directory}\").merge_and_unload()"
            f".save_pretrained(\"merged\")) and convert the merged directory"
        )
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {CONFIG_FILE}; a Hugging Face model directory holds {CONFIG_FILE} and "
            f"{SAFETENSORS} (as written by save_pretrained)"
        )
    hf = read_json(path)
    if not isinstance(hf, dict):
        raise CheckpointError(f"{path} must hold a JSON object of field: value")
    return hf


def _holds_hf_model(directory: Path) -> bool:
    """Whether `directory` holds a Hugging Face model, one --to-hf may replace: its config.json names a model_type
    (an attnkit run's names a family)."""
    try:
        return "model_type" in read_hf_config(directory)
    except CheckpointError:
        return False


def _refuse_existing(directory: Path, flag: str, *, overwrite: bool, replaceable: bool) -> None:
    """Refuse to write a model where a directory holds files: another model's (its config, weights or tokenizer),
    unless `overwrite` and `replaceable` (a model attnkit writes again), or anything else, which is never removed."""
    if directory.parent.is_dir():
        clear_leftovers(directory)  # a killed writer's partial output, or the one it had moved aside, put back
    if not directory.is_dir() or not any(directory.iterdir()) or (overwrite and replaceable):
        return  # absent, empty, a file (atomic_output names it), or what --overwrite replaces
    found = [name for name in (CONFIG_FILE, SAFETENSORS, SAFETENSORS_INDEX, HF_FILE, TOKENIZER_DIR)
             if (directory / name).exists()]
    if found:
        fix = "add --overwrite to replace it" if replaceable else "remove them"
        raise InputError(f"{directory} already holds a model's files ({', '.join(found)}); choose another {flag} or "
                         f"{fix}")
    raise InputError(f"{directory} holds files of its own and no model; choose another {flag} (a new or empty "
                     "directory): --overwrite replaces only a model attnkit wrote")


def _labels(hf: dict[str, Any]) -> list[str] | None:
    id2label = hf.get("id2label")
    if not id2label:
        return None
    return [str(id2label[key]) for key in sorted(id2label, key=int)]


def _read_tokenizer(directory: Path, config: ModelConfig) -> Tokenizer | None:
    """The directory's tokenizer.json; CheckpointError when it has ids past the model's vocabulary (another
    model's tokenizer: its ids would index past the embedding table)."""
    if (directory / HF_FILE).is_file():
        tokenizer = load_tokenizer(directory)
        if tokenizer.vocab_size > config.vocab_size:
            raise CheckpointError(
                f"{directory / HF_FILE} has {tokenizer.vocab_size:,} ids but the model's vocabulary holds "
                f"{config.vocab_size:,} (config.json's vocab_size): it is another model's tokenizer; put the model's "
                f"own {HF_FILE} beside its weights"
            )
        return tokenizer
    log.warning(
        "%s has no %s, so the model comes without a tokenizer (Marian, for one, ships SentencePiece files, which "
        "attnkit does not read)", directory, HF_FILE,
    )
    return None


def _special_ids(family: FamilyMap, tokenizer: Tokenizer | None, given: dict[str, int]) -> dict[str, int | None]:
    """config.json's token ids: those given, else the tokenizer's (a target starts with BOS in attnkit), else the
    family's stand-in, else null where transformers allows it (its own defaults, such as GPT-2's 50256, may lie
    outside a smaller vocabulary) and absent where it does not."""
    ids: dict[str, int | None] = {name: given.get(name) for name in family.special_ids}
    if tokenizer is not None:
        for name in family.special_ids:
            role = _ROLE_IDS.get(name)
            if ids[name] is None and role is not None:
                ids[name] = tokenizer.token_id(role)
    for name, stand_in in family.special_id_fallbacks:
        if ids[name] is None:
            ids[name] = ids[stand_in]
    return {name: value for name, value in ids.items() if value is not None or name in _NULLABLE_IDS}


def _write_tokenizer(tokenizer: Tokenizer, directory: Path, *, config: ModelConfig, chat_template: str | None = None,
                     own_frame: bool = False) -> None:
    """tokenizer.json as a runtime reads it alone (an encoder's text framed as attnkit frames it:
    `attnkit.interop.runtime_tokenizer`), attnkit's note of its kind, and the tokenizer_config.json that tells
    transformers its special tokens (and its chat template, where given)."""
    if tokenizer.kind not in JSON_KINDS:
        log.warning("a %r tokenizer has no Hugging Face form; %s gets no tokenizer", tokenizer.kind,
                    as_written(directory))  # the output's name, not the temporary folder it is written in
        return
    tokenizer.save(directory)  # with attnkit's note of its kind, read back by convert --from-hf
    framed, _ = runtime_tokenizer(tokenizer, config, own_frame=own_frame)
    atomic_write(directory / HF_FILE, framed.to_str(pretty=True))
    settings = {f"{role}_token": token for role, token in tokenizer.specials.items()}
    settings.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=config.max_seq_len)
    if chat_template is not None:
        settings["chat_template"] = chat_template
    atomic_write(directory / "tokenizer_config.json", json.dumps(settings, indent=2, sort_keys=True) + "\n")
