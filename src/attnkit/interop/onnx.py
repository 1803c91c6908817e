"""A run as a folder onnxruntime runs from text with nothing else, through `torch.onnx.export` (the dynamo exporter,
`torch.export`).

    convert_to_onnx(run_dir, out)    -> out/  model.onnx      the graph, batch and lengths dynamic (an encoder-
                                                              decoder's three graphs: see below)
                                              tokenizer.json  the run's tokenizer, framing an encoder's or a
                                                              tagger's text as attnkit does ([CLS] text [SEP], BOS
                                                              text EOS, or a converted tagger's own; cut to
                                                              max_seq_len, padded), a decoder's prompt as is (BOS
                                                              first where its tokenizer puts it):
                                                              `attnkit.interop.runtime_tokenizer`
                                              config.json     the run's model config
                                              labels.json     a classifier's or tagger's labels, by class index
                                              runtime.json    the graph's inputs and outputs, what the tokenizer adds,
                                                              the labels' file, a decoder's past shapes
    export_onnx(model, config, path) -> the graph alone
    export_seq2seq_onnx(model, config, folder) -> an encoder-decoder's three graphs alone

Decoders (next-token models, with the KV cache as explicit inputs and outputs, the layout `transformers` models
export to):

    inputs   input_ids (batch, sequence)                    int64
             attention_mask (batch, total)                  int64, 1 at real tokens; total = past_sequence + sequence
             past_key_values.{i}.key / .value               (batch, n_kv_heads, past_sequence, head_dim), each layer i
    outputs  logits (batch, sequence, vocab)
             present.{i}.key / .value                       (batch, n_kv_heads, past_sequence + sequence, head_dim)

The prompt goes in with an empty past (past_sequence 0); each later step feeds one token and the presents back as
the next past. Positions continue after the past ones, as in attnkit's own decoding.

Encoders (input_ids and attention_mask (batch, sequence), plus token_type_ids where the model has token types; all
three are what `tokenizers` returns for a batch read with the folder's tokenizer.json):

    encoder_head  classify   logits (batch, n_classes)
                  tag        logits (batch, sequence, n_classes)
                  mlm        logits (batch, sequence, vocab)
                  none       last_hidden_state (batch, sequence, d_model), pooled (batch, d_model): embeddings

A decoder with a tag head (GPT2ForTokenClassification's layout) is written as an encoder tagger is: input_ids and
attention_mask in, logits (batch, sequence, n_classes) out, each position's from the tokens up to it; no past.

Encoder-decoders (translation) are three graphs with Optimum's file and input/output names for a Marian or T5
model (`export_seq2seq_onnx`; {i} a decoder layer, the target's positions continue after the past ones). Optimum
does not load the folder (config.json is attnkit's): runtime.json says how greedy translation runs through them:

    encoder_model.onnx            input_ids, attention_mask (batch, encoder_sequence)  -> last_hidden_state
                                                                                          (batch, encoder_sequence, C)
    decoder_model.onnx            input_ids (batch, sequence), encoder_attention_mask,  -> logits (batch, sequence, V),
    (the first step)              encoder_hidden_states                                    present.{i}.decoder.key /
                                                                                           .value, present.{i}.encoder
                                                                                           .key / .value
    decoder_with_past_model.onnx  input_ids, encoder_attention_mask,                    -> logits, present.{i}.decoder
    (each later step)             past_key_values.{i}.decoder.key / .value                 .key / .value
                                  (batch, n_kv_heads, past_sequence, head_dim),
                                  past_key_values.{i}.encoder.key / .value
                                  (batch, n_kv_heads, encoder_sequence, head_dim)

The encoder's keys and values are computed once, by the first step, and passed back in at every later one.

The value checks the models make on their inputs (ids within the vocabulary) read tensor values and are left out
of the graph; ids outside the vocabulary are the caller's to prevent. The model is exported in eval mode (no
dropout).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.checkpoint import (
    CONFIG_FILE,
    LABELS_FILE,
    TASK_FILE,
    TOKENIZER_DIR,
    load_model,
    read_labels,
    read_origin_ids,
)
from attnkit.config import DecoderConfig, EncoderConfig, EncoderDecoderConfig, ModelConfig, head_output
from attnkit.deprecation import warn_renamed
from attnkit.errors import ConfigError, InputError
from attnkit.interop.runtime_tokenizer import Framing, runtime_tokenizer
from attnkit.interop.targets import elsewhere
from attnkit.layers.kv_cache import KVCache, LayerCache
from attnkit.outputs import atomic_output, atomic_write, check_output
from attnkit.tasks import task_record
from attnkit.tasks.reading import frame_of
from attnkit.tasks.tag import WordPieces, word_pieces_of
from attnkit.tasks.translate import MAX_LENGTH_EXTRA, MAX_LENGTH_PER_SOURCE_TOKEN
from attnkit.tokenize import HF_FILE, Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

OPSET = 18
GRAPH_FILE = "model.onnx"
EXAMPLE_BATCH = 3  # the batch the graphs are traced on; the lengths are `_example_lengths`'s
_EXAMPLE_LENGTHS = (5, 6, 7)  # target, source, past: unlike each other and the batch
RUNTIME_FILE = "runtime.json"  # how to feed the graph from text: its inputs and outputs, the tokenizer's framing
_EXPORTER_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir")


@dataclass(frozen=True)
class ONNXExport:
    """What `export_onnx` wrote: the graph's kind (decoder, classify, tag, mlm, embeddings) and its names."""

    path: Path
    kind: str
    inputs: list[str]
    outputs: list[str]


@dataclass(frozen=True)
class Seq2SeqGraphFile:
    """One of an encoder-decoder's three graphs: its file (Optimum's name), its role (runtime.json's key), what it
    is, and its input and output names in the order the graph takes and gives them."""

    file: str
    role: str
    kind: str
    inputs: list[str]
    outputs: list[str]


@dataclass(frozen=True)
class ONNXFolder:
    """What `convert_to_onnx` wrote: the folder, its graphs (one; an encoder-decoder's three), and each file's name
    with what it holds (for the command's one line a file)."""

    path: Path
    graphs: list[ONNXExport]
    files: dict[str, str]

    @property
    def graph(self) -> ONNXExport:
        """The old name of `graphs[0]` (from before an encoder-decoder's three), with a DeprecationWarning."""
        warn_renamed("ONNXFolder.graph", "ONNXFolder.graphs[0]")
        return self.graphs[0]


class PastLayerCache(LayerCache):
    """One layer's cache as graph values: the past keys and values come in as tensors (B, Hkv, P, D) and `append`
    returns them joined with the new ones, the layer's present (B, Hkv, P + T, D); an encoder-decoder's layer also
    holds the encoder's keys and values (B, Hkv, S, D) once computed (`cross`). Nothing is written in place."""

    def __init__(self, keys: Tensor, values: Tensor, cross: tuple[Tensor, Tensor] | None = None) -> None:
        self.keys, self.values, self.cross = keys, values, cross
        self.length = keys.shape[2]

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        self.keys = torch.cat((self.keys, keys), dim=2)  # (B, Hkv, P + T, D)
        self.values = torch.cat((self.values, values), dim=2)
        self.length = self.keys.shape[2]
        return self.keys, self.values


class DecoderGraph(nn.Module):
    """A decoder as a function of (input_ids, attention_mask, past) -> (logits, present)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, past: list[tuple[Tensor, Tensor]]):
        cache = KVCache([PastLayerCache(keys, values) for keys, values in past])
        logits = self.model(input_ids, attention_mask=attention_mask, cache=cache).logits  # (B, T, V)
        return logits, [(layer.keys, layer.values) for layer in cache.layers]


class Seq2SeqEncoderGraph(nn.Module):
    """An encoder-decoder's encoder (Optimum's encoder_model): (input_ids, attention_mask) (B, S) -> last_hidden_state
    (B, S, C)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model.encode(input_ids, src_mask=attention_mask)  # (B, S, C)


class Seq2SeqDecoderGraph(nn.Module):
    """One decoding step of an encoder-decoder with its caches as graph values (Optimum's decoder_model, `first`,
    and decoder_with_past_model):

        first   (input_ids, encoder_attention_mask, encoder_hidden_states (B, S, C))
                -> logits, and per layer the present self-attention keys, values and the encoder's keys, values,
                   computed here once from encoder_hidden_states
        later   (input_ids, encoder_attention_mask, per layer (self keys, self values, encoder keys, encoder values))
                -> logits, and per layer the present self-attention keys, values
    """

    def __init__(self, model: nn.Module, config: ModelConfig, *, first: bool) -> None:
        super().__init__()
        self.model, self.first = model, first
        resolved = config.resolved
        self.n_kv_heads, self.head_dim, self.width = resolved.n_kv_heads, resolved.head_dim, config.d_model
        self.n_layers = resolved.n_decoder_layers

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor,
                state: Tensor | list[tuple[Tensor, Tensor, Tensor, Tensor]]) -> tuple[Tensor, ...]:
        """input_ids (B, T), encoder_attention_mask (B, S); `state`: first, encoder_hidden_states (B, S, C); later,
        per decoder layer (self keys, self values) (B, Hkv, P, D) and (encoder keys, encoder values) (B, Hkv, S, D).
        Returns logits (B, T, V), then each layer's presents in the order of the graph's output names."""
        if self.first:
            memory = state  # (B, S, C)
            empty = memory.new_zeros(memory.shape[0], self.n_kv_heads, 0, self.head_dim)  # (B, Hkv, 0, D)
            layers = [PastLayerCache(empty, empty) for _ in range(self.n_layers)]
        else:
            layers = [PastLayerCache(keys, values, cross=(cross_keys, cross_values))
                      for keys, values, cross_keys, cross_values in state]
            cross_keys = state[0][2]  # (B, Hkv, S, D)
            # decode reads only the memory's shape once the encoder's keys and values are cached: a stand-in
            memory = cross_keys.new_zeros(cross_keys.shape[0], cross_keys.shape[2], self.width)  # (B, S, C)
        cache = KVCache(layers)
        logits = self.model.decode(input_ids, memory, src_mask=encoder_attention_mask, cache=cache).logits  # (B, T, V)
        kept = [(layer.keys, layer.values, *layer.cross) if self.first else (layer.keys, layer.values)
                for layer in cache.layers]
        return logits, *(tensor for layer in kept for tensor in layer)


class EncoderGraph(nn.Module):
    """An encoder, or a decoder that labels positions (a tagger), as a function of (input_ids, attention_mask[,
    token_type_ids]) -> its head's outputs."""

    def __init__(self, model: nn.Module, head: str) -> None:
        super().__init__()
        self.model, self.head = model, head

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None):
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        out = self.model(input_ids, attention_mask=attention_mask, **types)
        if self.head == "none":
            return out.hidden_states, out.logits  # (B, T, C), pooled (B, C)
        return out.logits


def convert_to_onnx(run_dir: str | Path, out: str | Path, *, opset: int = OPSET, overwrite: bool = False
                    ) -> ONNXFolder:
    """Write the run as a folder a runtime needs nothing else to use (see the module docstring), whole or not at
    all; `overwrite` replaces such a folder there (one holding runtime.json), never other files. Raises
    ConfigError for a family with no ONNX form here (recurrent models), InputError for an existing
    `out` without `overwrite` (or holding other files) or an `out` named like a file."""
    run_dir, out = Path(run_dir), Path(out)
    if out.suffix == ".onnx":
        raise InputError(f"--to-onnx writes a folder ({GRAPH_FILE}, {HF_FILE}, {CONFIG_FILE}, {RUNTIME_FILE}, ...); "
                         f"give a directory name such as {out.with_suffix('')}/ instead of {out.name}")
    if overwrite and out.is_dir() and any(out.iterdir()) and not (out / RUNTIME_FILE).is_file():
        raise InputError(f"--to-onnx {out} holds files and no ONNX folder attnkit wrote ({RUNTIME_FILE}); --overwrite "
                         "replaces only such a folder: choose another --to-onnx")
    check_output(out, directory=True, overwrite=overwrite, flag="--to-onnx")
    model, config = load_model(run_dir)
    _check_family(config)
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR) if (run_dir / TOKENIZER_DIR).is_dir() else None
    text = _tokenizer_file(tokenizer, config, run_dir)
    labels = read_labels(run_dir)
    with atomic_output(out, directory=True, overwrite=overwrite, flag="--to-onnx") as partial:
        if isinstance(config, EncoderDecoderConfig):
            graphs = export_seq2seq_onnx(model, config, partial, opset=opset)
        else:
            graphs = [export_onnx(model, config, partial / GRAPH_FILE, opset=opset)]
        files = {graph.path.name: f"{graph.kind}; inputs {', '.join(graph.inputs[:3])}"
                                  f"{', ...' * (len(graph.inputs) > 3)}; outputs {', '.join(graph.outputs[:3])}"
                                  f"{', ...' * (len(graph.outputs) > 3)}" for graph in graphs}
        if text is not None:
            atomic_write(partial / HF_FILE, text[0].to_str(pretty=True))
            files[HF_FILE] = _described(text[1])
        atomic_write(partial / CONFIG_FILE, (run_dir / CONFIG_FILE).read_bytes())
        files[CONFIG_FILE] = f"the run's {config.family} config"
        if labels is not None:
            atomic_write(partial / LABELS_FILE, json.dumps({"labels": labels}, indent=2) + "\n")
            files[LABELS_FILE] = f"{len(labels)} labels, by class index"
        runtime = _runtime(graphs, config, _special_ids(tokenizer, run_dir, config), text[1] if text else None,
                           labels, word_pieces_of(task_record(run_dir), run_dir / TASK_FILE), tokenizer)
        atomic_write(partial / RUNTIME_FILE, json.dumps(runtime, indent=2, ensure_ascii=False) + "\n")
        files[RUNTIME_FILE] = f"how to feed the graph{'s' * (len(graphs) > 1)} from text"
    log.debug("wrote %s as ONNX (%s) to %s", run_dir, ", ".join(graph.kind for graph in graphs), out)
    return ONNXFolder(path=out, graphs=[replace(graph, path=out / graph.path.name) for graph in graphs], files=files)


def _tokenizer_file(tokenizer: Tokenizer | None, config: ModelConfig, run_dir: Path):
    """(tokenizers.Tokenizer, Framing) for the folder's tokenizer.json, or None, said, where the run has none that
    tokenizer.json can hold (no tokenizer/, or attnkit's `char` kind: the graph is still written)."""
    if tokenizer is None:
        log.warning("%s has no %s/ directory: the folder gets no %s", run_dir, TOKENIZER_DIR, HF_FILE)
        return None
    try:
        return runtime_tokenizer(tokenizer, config,
                                 own_frame=frame_of(task_record(run_dir), run_dir / TASK_FILE) == "own")
    except ConfigError as err:
        log.warning("the folder gets no %s: %s", HF_FILE, err)
        return None


def _described(framing: Framing) -> str:
    """What the folder's tokenizer.json does to a text, from what it adds and the cut and padding where it has them."""
    if framing.max_length is None:  # a next-token decoder's file: as it is, BOS too where it begins texts with it
        return "the run's tokenizer, as it is" + (f" (adds {' and '.join(framing.adds)})" if framing.adds else "")
    said = [f"adds {' and '.join(framing.adds)}" if framing.adds else "adds nothing",
            f"cut to {framing.max_length} ids"]
    if framing.pad_id is not None:
        said.append(f"padded with id {framing.pad_id}")
    return ", ".join(said)


def _special_ids(tokenizer: Tokenizer | None, run_dir: Path, config: ModelConfig) -> dict[str, int]:
    """runtime.json's special_ids: the tokenizer's BOS, EOS, PAD, CLS and SEP where the run has one, else a converted
    run's origin ids (hf_source.json: decoder_start_token_id, else bos_token_id, as BOS; eos_token_id; pad_token_id),
    those that are one token id of the model's vocabulary."""
    if tokenizer is not None:
        return {role: tokenizer.token_id(role) for role in ("bos", "eos", "pad", "cls", "sep")
                if tokenizer.token_id(role) is not None}
    origin = read_origin_ids(run_dir)
    vocab = getattr(config, "target_vocab_size", config.vocab_size)
    chosen = {"bos": origin.get("decoder_start_token_id", origin.get("bos_token_id")),
              "eos": origin.get("eos_token_id"), "pad": origin.get("pad_token_id")}
    return {role: i for role, i in chosen.items()
            if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab}


def _past(n_layers: int, config: ModelConfig) -> dict:
    """runtime.json's past: the shape of the key/value cache each of `n_layers` layers takes and gives."""
    resolved = config.resolved
    return {"n_layers": n_layers, "n_kv_heads": resolved.n_kv_heads, "head_dim": resolved.head_dim}


def _runtime(graphs: list[ONNXExport], config: ModelConfig, special_ids: dict[str, int], framing: Framing | None,
             labels: list[str] | None, word_pieces: WordPieces, tokenizer: Tokenizer | None) -> dict:
    """runtime.json: what a runtime does to run the graph from text with nothing but this folder (`word_pieces`: how
    a tagger's words become pieces, `attnkit.tasks.tag.align`)."""
    if isinstance(config, EncoderDecoderConfig):
        return _seq2seq_runtime(config, special_ids, framing)
    (graph,) = graphs
    runtime: dict = {"graph": GRAPH_FILE, "kind": graph.kind, "inputs": graph.inputs, "outputs": graph.outputs,
                     "tokenizer": HF_FILE if framing is not None else None,
                     "text": framing.as_json() if framing is not None else None,
                     "labels": LABELS_FILE if labels is not None else None,
                     "max_seq_len": config.max_seq_len}
    if special_ids:
        runtime["special_ids"] = special_ids
    if graph.kind == "decoder":
        past = _past(config.n_layers, config)
        runtime["past"] = {**past, "empty_shape": ["batch", past["n_kv_heads"], 0, past["head_dim"]]}
    elif "token_type_ids" in graph.inputs:
        runtime["token_type_ids"] = "the tokenizer's type ids (0 for one text)"
    per_position = head_output(config.family, _head(config)) == "position"
    if per_position and tokenizer is not None and word_pieces == "running" and tokenizer.space_starts_word:
        runtime["words"] = {"how": "encode the words joined by single spaces once (no special tokens), give each piece "
                                   "to the word its last character lies in (by its offsets; a space to the word after "
                                   "it), frame with text.adds; a word's label is the logits at its first piece"}
    elif per_position and tokenizer is not None:  # attnkit.tasks.tag.align: a label per word's first piece
        runtime["words"] = {"how": "encode each word alone (no special tokens), join them with between_ids, frame "
                                   "with text.adds; a word's label is the logits at its first piece",
                            "between_ids": tokenizer.encode(" ")}
    return runtime


def _seq2seq_runtime(config: EncoderDecoderConfig, special_ids: dict[str, int], framing: Framing | None) -> dict:
    """runtime.json of an encoder-decoder: its three graphs and how greedy translation runs through them, stopping
    where `attnkit translate` stops (`attnkit.generate.seq2seq.default_max_length`); its "how" names only the ids
    and files the folder holds."""
    layers = config.resolved.n_decoder_layers
    special_ids = {role: i for role, i in special_ids.items() if role in ("bos", "eos", "pad")}
    sources = ("encode the sources (tokenizer.json adds EOS and pads)" if framing is not None else
               "encode the sources, each `tokens EOS`, right-padded, with the tokenizer the model was trained with "
               "(none is in the folder)")
    bos = "BOS first (special_ids.bos)" if "bos" in special_ids else "the decoder's start token first"
    eos = "at EOS (special_ids.eos)" if "eos" in special_ids else "at the target's EOS"
    runtime: dict = {"kind": "translate",
                     "graphs": {graph.role: {"file": graph.file, "inputs": graph.inputs, "outputs": graph.outputs}
                                for graph in seq2seq_graphs(layers)},
                     "tokenizer": HF_FILE if framing is not None else None,
                     "text": framing.as_json() if framing is not None else None,
                     "max_seq_len": config.max_seq_len,
                     "max_length": {"rule": "min(max_seq_len, times_longest_source * longest_source + plus)",
                                    "max_seq_len": config.max_seq_len, "times_longest_source":
                                    MAX_LENGTH_PER_SOURCE_TOKEN, "plus": MAX_LENGTH_EXTRA,
                                    "longest_source": "the batch's longest source in ids, EOS included, padding not",
                                    "counts": "target tokens, EOS included"},
                     "past": _past(layers, config),
                     "how": f"{sources} with encoder; feed each row's target so far, {bos}, to decoder with the "
                            "encoder's output and mask; then one token a row to decoder_with_past with the decoder's "
                            "present.{i}.decoder.* of the step before and present.{i}.encoder.* of the first step as "
                            f"past_key_values; stop a row {eos}, and every row by max_length target tokens "
                            "(max_length.rule, as attnkit translate stops by default)"}
    if special_ids:
        runtime["special_ids"] = special_ids
    return runtime


def export_onnx(model: nn.Module, config: ModelConfig, out: Path, *, opset: int = OPSET, overwrite: bool = False
                ) -> ONNXExport:
    """Write `model` (of `config`, in fp32) as an ONNX graph at `out`, whole or not at all (see the module
    docstring); the graph of `convert_to_onnx`'s folder, and what the speed suite's onnxruntime peer runs. The
    exporter's own messages and warnings are kept out of the output (`quiet_exporter`)."""
    if isinstance(config, EncoderDecoderConfig):
        raise ConfigError("an encoder-decoder is three graphs (encoder, first decoding step, later steps): write them "
                          "with export_seq2seq_onnx(model, config, folder), or the whole folder with convert_to_onnx")
    graph, example, dynamic, inputs, outputs, kind = _graph(model.float().eval(), config)
    _write_graph(graph, example, dynamic, inputs, outputs, out, opset=opset, overwrite=overwrite)
    return ONNXExport(path=out, kind=kind, inputs=inputs, outputs=outputs)


def export_seq2seq_onnx(model: nn.Module, config: EncoderDecoderConfig, folder: Path, *, opset: int = OPSET
                        ) -> list[ONNXExport]:
    """Write an encoder-decoder (in fp32) as three graphs with Optimum's names in `folder` (see the module
    docstring): the encoder, the decoder's first step (which computes the encoder's keys and values once) and its
    later steps (which take them, and the self-attention past, as inputs). Each file whole or not at all."""
    model = model.float().eval()
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    source, past = torch.export.Dim("encoder_sequence"), torch.export.Dim("past_sequence")
    example_batch = EXAMPLE_BATCH
    example_length, example_source, example_past = _example_lengths(config)
    src = torch.randint(0, config.vocab_size, (example_batch, example_source))  # (B, S)
    src_mask = torch.ones_like(src)  # (B, S)
    tgt = torch.randint(0, config.target_vocab_size, (example_batch, example_length))  # (B, T)
    with torch.no_grad():
        memory = model.encode(src, src_mask=src_mask)  # (B, S, C)
        first = Seq2SeqDecoderGraph(model, config, first=True)
        earlier = torch.randint(0, config.target_vocab_size, (example_batch, example_past))  # (B, P)
        _, *present = first(earlier, src_mask, memory)  # an example past: the self-attention's
    layers = config.resolved.n_decoder_layers
    # per layer: self keys, self values (B, Hkv, P, D), encoder keys, encoder values (B, Hkv, S, D)
    state = [tuple(present[4 * i:4 * i + 4]) for i in range(layers)]
    masks = {"encoder_attention_mask": {0: batch, 1: source}}
    traced = [  # (module, example, dynamic shapes), in seq2seq_graphs' order: encoder, first step, later steps
        (Seq2SeqEncoderGraph(model), (src, src_mask),
         {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}}),
        (first, (tgt, src_mask, memory),
         {"input_ids": {0: batch, 1: sequence}, **masks, "state": {0: batch, 1: source}}),
        (Seq2SeqDecoderGraph(model, config, first=False), (tgt, src_mask, state),
         {"input_ids": {0: batch, 1: sequence}, **masks,
          "state": [({0: batch, 2: past}, {0: batch, 2: past}, {0: batch, 2: source}, {0: batch, 2: source})
                    for _ in range(layers)]}),
    ]
    written = []
    for spec, (graph, example, dynamic) in zip(seq2seq_graphs(layers), traced, strict=True):
        _write_graph(graph, example, dynamic, spec.inputs, spec.outputs, folder / spec.file, opset=opset)
        written.append(ONNXExport(path=folder / spec.file, kind=spec.kind, inputs=spec.inputs, outputs=spec.outputs))
    return written


def seq2seq_graphs(n_layers: int) -> list[Seq2SeqGraphFile]:
    """An encoder-decoder's three graphs for `n_layers` decoder layers, with Optimum's file, input and output names
    (see the module docstring)."""
    kept = ("decoder.key", "decoder.value", "encoder.key", "encoder.value")
    both = [f"{i}.{part}" for i in range(n_layers) for part in kept]
    own = [f"{i}.{part}" for i in range(n_layers) for part in kept[:2]]
    return [
        Seq2SeqGraphFile("encoder_model.onnx", "encoder", "encoder", ["input_ids", "attention_mask"],
                         ["last_hidden_state"]),
        Seq2SeqGraphFile("decoder_model.onnx", "decoder", "decoder, first step",
                         ["input_ids", "encoder_attention_mask", "encoder_hidden_states"],
                         ["logits", *(f"present.{name}" for name in both)]),
        Seq2SeqGraphFile("decoder_with_past_model.onnx", "decoder_with_past", "decoder, later steps",
                         ["input_ids", "encoder_attention_mask", *(f"past_key_values.{name}" for name in both)],
                         ["logits", *(f"present.{name}" for name in own)]),
    ]


def _write_graph(graph: nn.Module, example: tuple, dynamic: dict, inputs: list[str], outputs: list[str], out: Path, *,
                 opset: int, overwrite: bool = False) -> None:
    """`graph` traced by `torch.onnx.export` (dynamo) on `example` and saved at `out`, whole or not at all."""
    with torch.no_grad(), quiet_exporter():
        program = torch.onnx.export(graph.eval(), example, dynamo=True, dynamic_shapes=dynamic, input_names=inputs,
                                    output_names=outputs, opset_version=opset, external_data=False,
                                    verbose=False)
    with atomic_output(out, directory=False, overwrite=overwrite, flag="--to-onnx") as partial:
        program.save(str(partial), external_data=False)


@contextmanager
def quiet_exporter() -> Iterator[None]:
    """`torch.onnx.export`'s progress messages (onnxscript's optimizer, onnx_ir's passes, torch's registration of
    operators it cannot find) and warnings silenced for the block; the levels are put back after it. Errors still
    raise."""
    levels = {name: logging.getLogger(name).level for name in _EXPORTER_LOGGERS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def _graph(model: nn.Module, config: ModelConfig):
    """(module, example inputs, dynamic shapes, input names, output names, kind) for the model's family."""
    _check_family(config)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    example_batch, head = EXAMPLE_BATCH, _head(config)
    next_token = head_output(config.family, head) == "token" and isinstance(config, DecoderConfig)
    example_length, _, example_past = _example_lengths(config) if next_token else _EXAMPLE_LENGTHS
    ids = torch.randint(0, config.vocab_size, (example_batch, example_length))
    if next_token:  # the past
        past_sequence = torch.export.Dim("past_sequence", min=0)
        shape = (example_batch, config.resolved.n_kv_heads, example_past, config.resolved.head_dim)
        past = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.n_layers)]
        mask = torch.ones(example_batch, example_past + example_length, dtype=torch.long)
        cached = {0: batch, 2: past_sequence}
        dynamic = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: torch.export.Dim.AUTO},
                   "past": [(cached, cached) for _ in range(config.n_layers)]}
        names = [f"{i}.{part}" for i in range(config.n_layers) for part in ("key", "value")]
        return (DecoderGraph(model), (ids, mask, past), dynamic,
                ["input_ids", "attention_mask", *(f"past_key_values.{n}" for n in names)],
                ["logits", *(f"present.{n}" for n in names)], "decoder")
    mask = torch.ones(example_batch, example_length, dtype=torch.long)  # an encoder, or a decoder that labels
    dynamic = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    example: tuple = (ids, mask)
    inputs = ["input_ids", "attention_mask"]
    if config.type_vocab_size:
        example += (torch.zeros_like(ids),)
        dynamic["token_type_ids"] = {0: batch, 1: sequence}
        inputs.append("token_type_ids")
    outputs = ["last_hidden_state", "pooled"] if head == "none" else ["logits"]
    return (EncoderGraph(model, head), example, dynamic, inputs, outputs,
            "embeddings" if head == "none" else head)


def _example_lengths(config: ModelConfig) -> tuple[int, int, int]:
    """The (target, source, past) lengths a graph with a past is traced on: 5, 6 and 7 where a past and a target fit
    in max_seq_len together (a learned position table holds no more), else the smallest that do, each unlike the
    others, the batch and the model's own sizes (heads, head_dim, d_model), so that torch.export keeps every length
    axis dynamic. Raises ConfigError naming the least max_seq_len that leaves room."""
    target, source, past = _EXAMPLE_LENGTHS
    if past + target <= config.max_seq_len:
        return target, source, past
    resolved = config.resolved
    taken = {EXAMPLE_BATCH, resolved.n_kv_heads, resolved.head_dim, config.n_heads, config.d_model}

    def fitting(max_seq_len: int) -> list[int] | None:  # target, past, source; 0 and 1 would be taken as fixed
        free = [n for n in range(2, max_seq_len + 1) if n not in taken]
        return free[:3] if len(free) >= 3 and free[0] + free[1] <= max_seq_len else None

    if (found := fitting(config.max_seq_len)) is not None:
        target, past, source = found
        return target, source, past
    least = next(n for n in range(config.max_seq_len + 1, 2 * max(taken) + 8) if fitting(n) is not None)
    raise ConfigError(f"an ONNX export traces a past and a target of lengths unlike each other and the model's own "
                      f"sizes ({', '.join(map(str, sorted(taken)))} here), within max_seq_len together: "
                      f"max_seq_len={config.max_seq_len} leaves no room; it needs max_seq_len >= {least} for this "
                      "model")


def _head(config: ModelConfig) -> str:
    """The model's head: an encoder's `encoder_head`, a decoder's `decoder_head`."""
    return config.encoder_head if isinstance(config, EncoderConfig) else config.decoder_head


def _check_family(config: ModelConfig) -> None:
    if not isinstance(config, (DecoderConfig, EncoderConfig, EncoderDecoderConfig)):
        raise ConfigError(f"ONNX export writes decoders, encoders and encoder-decoders; this run is "
                          f"family={config.family!r}: {elsewhere(config, '--to-onnx')}")
