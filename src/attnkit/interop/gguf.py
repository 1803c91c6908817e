"""A run as one GGUF file for llama.cpp (and the tools built on it: Ollama, LM Studio), through the `gguf` package.

    convert_to_gguf(run_dir, out, type="q8_0")    -> out.gguf: weights, hyperparameters, tokenizer, chat template

The way is llama.cpp's own converter's (`convert_hf_to_gguf.py`): the model is first laid out as the Hugging Face
architecture that holds it exactly (`attnkit.interop.hf_config.match_family`: GPT-2, Llama, Mistral), then each
Hugging Face tensor gets its GGUF name from the `gguf` package's name map and is stored at the requested type by
its quantizers. What llama.cpp's graphs need beyond a rename:

    GPT-2     Conv1D weights back to (out, in); a tied output layer written as its own `output.weight`
    Llama     q and k rows and biases permuted from rotate-half RoPE pairs (i, i + D/2) to llama.cpp's adjacent
              pairs (2i, 2i + 1); a tied output layer left out (llama.cpp then reads `token_embd` for it)
    Mistral   as Llama; llama.cpp attends to every key, so the context length written is the sliding window

llama.cpp's GPT-2 graph applies GELU (its tanh form) whatever the model's activation: a GPT-2 layout with another is
refused (an exact GELU is written with a warning).

Types: 1-D tensors (norms, biases) and learned positions stay f32, as llama.cpp's converter keeps them; 2-D weights
take the requested type, or f16 where a row's length is not a multiple of the type's block (32 values for q8_0 and
q4_0). The `gguf` package quantizes f16, bf16, q8_0, q5_1, q5_0, q4_1 and q4_0; llama.cpp's K-quants (Q4_K_M, Q6_K,
... spelled as `llama-quantize` spells them) are made by llama.cpp's own quantizer from the file written at f16
(`attnkit.interop.gguf_kquants`, llama-cpp-python in a child process), in a hidden file beside `out` that goes with
the call; a weight whose rows are no whole number of 256 values gets llama.cpp's per-tensor fallback type there.

Tokenizer: a byte-level BPE (attnkit's `bpe` kind, GPT-2's `tokenizer.json`) is written as llama.cpp's `gpt2`
tokenizer with the GPT-2 pre-tokenizer, its merges, and special tokens marked as control tokens. A `char`
tokenizer has no GGUF form. The chat template comes from `--chat-template FILE`, else the `chat_template` of a
`tokenizer_config.json` in the run's tokenizer directory, else it is attnkit's own (`attnkit.chat_format`), the
plain-text turns `attnkit serve` chats in.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from attnkit.chat_format import (
    DEFAULT_CHAT_TEMPLATE,
    TEMPLATE_CONFIG,
    check_template,
    config_template,
    read_template_file,
)
from attnkit.checkpoint import TOKENIZER_DIR, load_model, unique_state_dict
from attnkit.config import DecoderConfig, ModelConfig, head_output
from attnkit.errors import ConfigError, InputError
from attnkit.interop.gguf_kquants import KQUANT_TYPES, check_quantizer, quantize_gguf
from attnkit.interop.hf_config import match_family
from attnkit.interop.hf_weights import hf_name, hf_tensor_names, to_hf_tensors
from attnkit.interop.keymaps import FamilyMap
from attnkit.interop.targets import elsewhere
from attnkit.outputs import atomic_output, scratch_file
from attnkit.tokenize import HF_FILE, Tokenizer, load_tokenizer

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _writer_quiet(gguf: Any) -> Iterator[None]:
    """gguf's writer logs, at INFO, the file it writes: the hidden partial one (`atomic_output`), whose name means
    nothing to the user; the caller says where the file went. Its warnings still show."""
    writer_log = logging.getLogger(gguf.gguf_writer.__name__)
    level = writer_log.level
    writer_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        writer_log.setLevel(level)

GGUFType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
                   "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"]  # GGUF_TYPES, KQUANT_TYPES
# --type -> (the tensors' GGML type, the file type recorded in general.file_type), by the gguf package's names
GGUF_TYPES: dict[str, tuple[str, str]] = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "q5_1": ("Q5_1", "MOSTLY_Q5_1"),
    "q5_0": ("Q5_0", "MOSTLY_Q5_0"),
    "q4_1": ("Q4_1", "MOSTLY_Q4_1"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
}
# Hugging Face model_type -> llama.cpp architecture (Mistral's graph is Llama's)
ARCHITECTURES = {"gpt2": "GPT2", "llama": "LLAMA", "mistral": "LLAMA"}
_KEEP_F32 = ("position_embd",)  # learned positions stay f32, as llama.cpp's converter keeps them


@dataclass(frozen=True)
class GGUFExport:
    """What `convert_to_gguf` wrote: the llama.cpp architecture, the type asked for, each tensor's type."""

    path: Path
    architecture: str  # llama.cpp's name: "gpt2", "llama"
    type: str
    tensor_types: dict[str, str]  # GGUF tensor name -> GGML type name
    context_length: int
    chat_template: str  # where the file's chat template came from


def convert_to_gguf(run_dir: str | Path, out: str | Path, *, type: GGUFType = "f16",
                    chat_template: str | Path | None = None, overwrite: bool = False) -> GGUFExport:
    """Write the decoder of `run_dir` as a GGUF file llama.cpp runs, whole or not at all (`overwrite` replaces an
    existing `out`). Raises ConfigError for a model no llama.cpp architecture holds, a tokenizer with no GGUF form or
    an unknown type; InputError for an existing `out` without `overwrite`."""
    gguf = _gguf()
    run_dir, out = Path(run_dir), Path(out)
    if type not in GGUF_TYPES and type not in KQUANT_TYPES:
        raise ConfigError(f"--type {type!r} is not a GGUF type attnkit writes; choose one of {', '.join(GGUF_TYPES)}, "
                          f"or llama.cpp's {', '.join(KQUANT_TYPES)} (spelled as llama-quantize spells them)")
    if type in KQUANT_TYPES:
        check_quantizer(type)
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists; choose another file name, or add --overwrite to replace it")
    if out.suffix != ".gguf":
        raise InputError(f"{out} should end in .gguf, the name llama.cpp and its tools look for")
    tokenizer_dir = run_dir / TOKENIZER_DIR
    if not tokenizer_dir.is_dir():
        raise ConfigError(f"{run_dir} has no {TOKENIZER_DIR}/ directory; a GGUF file carries its tokenizer, so "
                          "export a run trained or converted with one")
    model, config = load_model(run_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    family = _family(model, config)
    arch = gguf.MODEL_ARCH[ARCHITECTURES[family.model_type]]
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    context_length = config.max_seq_len
    if config.attention_window is not None and config.attention_window < context_length:
        log.warning("llama.cpp attends to every key: the file's context length is the sliding window (%d), "
                    "within which both compute the same", config.attention_window)
        context_length = config.attention_window
    vocab = gguf_vocabulary(tokenizer, tokenizer_dir, config.vocab_size)
    template, template_source = _chat_template(chat_template, tokenizer_dir)

    def write(path: Path, type: str) -> dict[str, str]:
        """The file at one of GGUF_TYPES; each tensor's type."""
        writer = gguf.GGUFWriter(str(path), arch_name)
        try:
            writer.add_name(run_dir.resolve().name)
            writer.add_file_type(gguf.LlamaFileType[GGUF_TYPES[type][1]])
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            _add_hyperparameters(writer, config, family, context_length)
            _add_vocabulary(writer, vocab, template)
            tensor_types = {}
            for name, array in gguf_tensors(model, config, family).items():
                stored, qtype = _stored(gguf, name, array, type)
                writer.add_tensor(name, stored, raw_dtype=qtype)
                tensor_types[name] = qtype.name
            _say_kept_at_f16(gguf, tensor_types, type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        return tensor_types

    with atomic_output(out, directory=False, overwrite=overwrite, flag="--to-gguf") as partial, _writer_quiet(gguf):
        if type in GGUF_TYPES:
            tensor_types = write(partial, type)
        else:  # llama.cpp quantizes the f16 file, written beside `out` and removed whatever happens
            source = scratch_file(out)
            try:
                write(source, "f16")
                quantize_gguf(source, partial, type)
            finally:
                source.unlink(missing_ok=True)
            tensor_types = {tensor.name: tensor.tensor_type.name for tensor in gguf.GGUFReader(partial).tensors}
    log.debug("wrote %s as llama.cpp's %s at %s to %s", run_dir, arch_name, type, out)
    return GGUFExport(path=out, architecture=arch_name, type=type, tensor_types=tensor_types,
                      context_length=context_length, chat_template=template_source)


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ConfigError("GGUF export needs the gguf package: pip install 'attnkit[export]'") from None
    return gguf


def _family(model: torch.nn.Module, config: ModelConfig) -> FamilyMap:
    """The Hugging Face family that holds the model exactly, when llama.cpp runs it."""
    if not isinstance(config, DecoderConfig):
        raise ConfigError(f"GGUF export writes decoders (llama.cpp generates text); this run is family="
                          f"{config.family!r}: {elsewhere(config, '--to-gguf')}")
    output = head_output(config.family, config.decoder_head)
    if output != "token":  # a reward model's score per sequence has no Hugging Face layout attnkit writes either
        gives, tried = (("a label per position", ("--to-gguf",)) if output == "position" else
                        ("a score per sequence", ("--to-gguf", "--to-hf")))
        raise ConfigError(f"GGUF export writes a decoder that predicts the next token (llama.cpp generates text); "
                          f"this one's head {config.decoder_head!r} gives {gives}: {elsewhere(config, *tried)}")
    state = unique_state_dict(model)
    try:
        family, _ = match_family(config, lambda f: hf_tensor_names(state, f, config))
    except ConfigError as err:
        raise ConfigError(f"llama.cpp runs a GPT-2, Llama or Mistral layout and {err}") from None
    if family.model_type not in ARCHITECTURES:
        raise ConfigError(f"this model is a {family.name}, which attnkit does not write as GGUF; it writes "
                          f"{', '.join(ARCHITECTURES)}")
    if family.model_type == "gpt2" and config.activation != "gelu_tanh":
        _check_gpt2_activation(config.activation)
    return family


def _check_gpt2_activation(activation: str) -> None:
    """llama.cpp's GPT-2 graph applies GELU in its tanh form (ggml_gelu) in every feed-forward layer, and GGUF has no
    key for another: an exact GELU is written with a warning (it differs by under 1e-3 an activation), anything else
    would run as GELU there and is refused."""
    if activation == "gelu":
        log.warning("llama.cpp's GPT-2 graph computes GELU in its tanh form; this model's exact GELU differs from it "
                    "by under 1e-3 an activation, so llama.cpp's logits will differ slightly from attnkit's")
        return
    raise ConfigError(f"llama.cpp's GPT-2 graph applies GELU in every feed-forward layer and GGUF has no key for "
                      f"another activation, so this model's activation={activation!r} would run as GELU there; "
                      f"export it --to-hf or --to-onnx, which hold it, or train with activation='gelu_tanh'")


def _add_hyperparameters(writer, config: ModelConfig, family: FamilyMap, context_length: int) -> None:
    config = config.resolved  # the head dimension and key/value heads as numbers
    writer.add_context_length(context_length)
    writer.add_embedding_length(config.d_model)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_block_count(config.n_layers)
    writer.add_head_count(config.n_heads)
    if family.model_type == "gpt2":
        writer.add_layer_norm_eps(config.norm_eps)
        return
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_vocab_size(config.vocab_size)


# Tensors -----------------------------------------------------------------------------------------------------------
def gguf_tensors(model: torch.nn.Module, config: ModelConfig, family: FamilyMap) -> dict[str, np.ndarray]:
    """The model's tensors by GGUF name, fp32, in the layouts llama.cpp's graphs read (see the module docstring)."""
    gguf = _gguf()
    arch = gguf.MODEL_ARCH[ARCHITECTURES[family.model_type]]
    names = gguf.get_tensor_name_map(arch, config.n_layers)
    transposed = {hf_name(ours, family, config)[0] for ours in unique_state_dict(model)
                  if hf_name(ours, family, config)[1].layout == "conv1d"}
    out: dict[str, np.ndarray] = {}
    for theirs, tensor in to_hf_tensors(model, family, config).items():
        name = names.get_name(theirs, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigError(f"the gguf package has no {family.name} tensor name for {theirs}")
        if theirs in transposed and tensor.dim() == 2:
            tensor = tensor.t()  # Conv1D (in, out) -> (out, in)
        if family.model_type != "gpt2" and name.endswith(("attn_q.weight", "attn_k.weight", "attn_q.bias",
                                                           "attn_k.bias")):
            heads = config.n_heads if ".attn_q." in name else config.resolved.n_kv_heads
            tensor = rope_pairs_adjacent(tensor, heads)  # a bias moves with its rows
        out[name] = tensor.detach().float().cpu().contiguous().numpy()
    if family.model_type == "gpt2" and "output.weight" not in out:  # tied: llama.cpp's gpt2 reads its own copy
        out["output.weight"] = out["token_embd.weight"]
    return out


def rope_pairs_adjacent(weight: Tensor, heads: int) -> Tensor:
    """Rows of a q or k projection (H * D, C), or its bias (H * D,), reordered, within each head, from the
    rotate-half pairing of RoPE (dimension i turns with i + D/2) to the adjacent pairing llama.cpp's Llama graph uses
    (2i with 2i + 1): row order per head [0, D/2, 1, D/2 + 1, ...]. The scores are unchanged, since q and k move
    alike."""
    rows, *columns = weight.shape
    half = rows // heads // 2
    return weight.reshape(heads, 2, half, *columns).transpose(1, 2).reshape(rows, *columns)


def _stored(gguf, name: str, array: np.ndarray, type: str):
    """(the array as stored, its GGML type) for one tensor at the requested `type` (see the module docstring)."""
    qtype = gguf.GGMLQuantizationType[GGUF_TYPES[type][0]]
    if array.ndim < 2 or name.startswith(_KEEP_F32):
        qtype = gguf.GGMLQuantizationType.F32
    if array.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        qtype = gguf.GGMLQuantizationType.F16
    return gguf.quants.quantize(array, qtype), qtype


def _say_kept_at_f16(gguf, tensor_types: dict[str, str], type: str) -> None:
    """One line for the weights `_stored` kept at f16, their rows no whole number of the type's blocks."""
    asked = GGUF_TYPES[type][0]
    kept = [name for name, stored in tensor_types.items() if stored == "F16" and asked != "F16"]
    if kept:
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[asked]][0]
        log.warning("%d of %d tensors (%s%s) have rows that are no whole number of %s blocks (%d values); they are "
                    "stored as f16", len(kept), len(tensor_types), ", ".join(kept[:3]), ", ..." * (len(kept) > 3),
                    asked, block)


# Tokenizer ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GGUFVocabulary:
    """A tokenizer as GGUF stores it: `tokens` by id, their `types` (gguf.TokenType), BPE `merges`, special ids."""

    model: str  # llama.cpp's tokenizer model: "gpt2" (byte-level BPE)
    pre: str  # its pre-tokenizer: "gpt-2"
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special_ids: dict[str, int]  # "bos", "eos", "unk", "pad" -> id
    starts_with_bos: bool  # llama.cpp puts BOS before a prompt as the tokenizer does its texts (`Tokenizer`)


def gguf_vocabulary(tokenizer: Tokenizer, directory: Path, vocab_size: int) -> GGUFVocabulary:
    """The run's tokenizer as GGUF stores it, padded to the model's `vocab_size` with unused tokens. Raises
    ConfigError for a tokenizer llama.cpp cannot reproduce."""
    gguf = _gguf()
    if tokenizer.kind == "char" or not (directory / HF_FILE).is_file():
        raise ConfigError(
            f"a {tokenizer.kind!r} tokenizer has no GGUF form: llama.cpp tokenizes with byte-level BPE, "
            f"SentencePiece or WordPiece; train the run with --tokenizer bpe"
        )
    spec = json.loads((directory / HF_FILE).read_text(encoding="utf-8"))
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or not _is_gpt2_byte_level(pre):
        raise ConfigError(
            f"{directory / HF_FILE} is a {model.get('type')} tokenizer with pre-tokenizer {pre.get('type')}; GGUF "
            f"export writes byte-level BPE with GPT-2's pre-tokenizer (attnkit's bpe kind, GPT-2's tokenizer)"
        )
    steps = _normalizations(spec.get("normalizer") or {})  # llama.cpp's gpt2 tokenizer reads the text as it comes
    if steps and set(steps) == {"NFC"}:  # llama.cpp's own converter writes such a tokenizer too
        log.warning("%s normalizes text to NFC before it splits it, which llama.cpp's byte-level BPE does not: text "
                    "already in NFC (most text) splits alike, text that is not (decomposed accents) may split "
                    "differently there; --to-hf and --to-onnx carry the normalizer", directory / HF_FILE)
    elif steps:
        raise ConfigError(
            f"{directory / HF_FILE} normalizes text before it splits it ({_describe(spec['normalizer'])}), which "
            f"llama.cpp's byte-level BPE does not, so llama.cpp would tokenize differently; GGUF export writes byte-"
            f"level BPE without a normalizer (attnkit's bpe kind, GPT-2's tokenizer): export --to-hf or --to-onnx"
        )
    by_id: dict[int, str] = {index: token for token, index in model["vocab"].items()}
    special: set[int] = set()
    added: set[int] = set()
    for entry in spec.get("added_tokens") or []:
        by_id[entry["id"]] = entry["content"]
        (special if entry.get("special") else added).add(entry["id"])
    if max(by_id) >= vocab_size:
        raise ConfigError(f"the tokenizer has ids up to {max(by_id)} but the model's vocabulary is {vocab_size}")
    tokens, types = [], []
    for index in range(vocab_size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[index])
        types.append(gguf.TokenType.CONTROL if index in special else
                     gguf.TokenType.USER_DEFINED if index in added else gguf.TokenType.NORMAL)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges") or []]
    special_ids = {role: tokenizer.token_id(role) for role in ("bos", "eos", "unk", "pad")}
    return GGUFVocabulary(model="gpt2", pre="gpt-2", tokens=tokens, types=[int(t) for t in types], merges=merges,
                          special_ids={role: i for role, i in special_ids.items() if i is not None},
                          starts_with_bos=tokenizer.starts_with_bos)


def _describe(normalizer: Mapping[str, Any]) -> str:
    """A tokenizer.json normalizer by its type, a Sequence by its parts' (`Sequence of NFC, Lowercase`); "" for
    none, an empty Sequence included."""
    steps = _normalizations(normalizer)
    return ("Sequence of " + ", ".join(steps) if normalizer.get("type") == "Sequence" else steps[0]) if steps else ""


def _normalizations(normalizer: Mapping[str, Any]) -> list[str]:
    """The types of a tokenizer.json normalizer's steps, a Sequence's in order (nested ones flattened); [] for none."""
    if normalizer.get("type") == "Sequence":
        return [step for part in normalizer.get("normalizers") or [] for step in _normalizations(part)]
    return [str(normalizer["type"])] if normalizer.get("type") else []


def _is_gpt2_byte_level(pre: Mapping[str, Any]) -> bool:
    """GPT-2's pre-tokenizer: ByteLevel splitting with its regex, without a prefix space."""
    if pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers") or []
        return len(parts) == 1 and _is_gpt2_byte_level(parts[0])
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space", False)


def _add_vocabulary(writer, vocab: GGUFVocabulary, chat_template: str) -> None:
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id, "unk": writer.add_unk_token_id,
              "pad": writer.add_pad_token_id}
    for role, index in vocab.special_ids.items():
        adders[role](index)
    writer.add_add_bos_token(vocab.starts_with_bos)  # as attnkit generates: BOS first where the tokenizer puts it
    writer.add_add_eos_token(False)
    writer.add_chat_template(chat_template)


def _chat_template(given: str | Path | None, tokenizer_dir: Path) -> tuple[str, str]:
    """(the Jinja chat template, where it came from): the file given, else the run's tokenizer_config.json's (a
    model converted from Hugging Face; of several named ones, `default`), else attnkit's own plain-text format, the
    one `attnkit serve` chats in (`attnkit.chat_format`). A template given or found is compiled and tried on a
    sample conversation first (InputError naming the file and the fault)."""
    if given is not None:
        path = Path(given)
        template = read_template_file(path, "--chat-template")
        check_template(template, f"--chat-template {path}")
        return template, str(path)
    template, _ = config_template(tokenizer_dir)
    if template is not None:
        where = str(tokenizer_dir / TEMPLATE_CONFIG)
        check_template(template, f"the chat template of {where}")
        return template, where
    return DEFAULT_CHAT_TEMPLATE, "attnkit's own (System: / User: / Assistant: / Tool: lines)"
