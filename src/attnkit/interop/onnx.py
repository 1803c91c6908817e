"""A run as an ONNX graph for onnxruntime, through `torch.onnx.export` (the dynamo exporter, `torch.export`).

    convert_to_onnx(run_dir, out)    -> out.onnx, batch and lengths dynamic

Decoders (next-token models, with the KV cache as explicit inputs and outputs, the layout `transformers` models
export to):

    inputs   input_ids (batch, sequence)                    int64
             attention_mask (batch, total)                  int64, 1 at real tokens; total = past_sequence + sequence
             past_key_values.{i}.key / .value               (batch, n_kv_heads, past_sequence, head_dim), each layer i
    outputs  logits (batch, sequence, vocab)
             present.{i}.key / .value                       (batch, n_kv_heads, past_sequence + sequence, head_dim)

The prompt goes in with an empty past (past_sequence 0); each later step feeds one token and the presents back as
the next past. Positions continue after the past ones, as in attnkit's own decoding.

Encoders (input_ids and attention_mask (batch, sequence), plus token_type_ids where the model has token types):

    encoder_head  classify   logits (batch, n_classes)
                  tag        logits (batch, sequence, n_classes)
                  mlm        logits (batch, sequence, vocab)
                  none       last_hidden_state (batch, sequence, d_model), pooled (batch, d_model): embeddings

The value checks the models make on their inputs (ids within the vocabulary) read tensor values and are left out
of the graph; ids outside the vocabulary are the caller's to prevent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.checkpoint import load_model
from attnkit.config import DecoderConfig, EncoderConfig, ModelConfig
from attnkit.errors import ConfigError, InputError
from attnkit.interop.targets import elsewhere
from attnkit.layers.kv_cache import KVCache, LayerCache
from attnkit.outputs import atomic_output

log = logging.getLogger(__name__)

OPSET = 18


@dataclass(frozen=True)
class ONNXExport:
    """What `convert_to_onnx` wrote: the graph's kind (decoder, classify, tag, mlm, embeddings) and its names."""

    path: Path
    kind: str
    inputs: list[str]
    outputs: list[str]


class PastLayerCache(LayerCache):
    """One layer's cache as graph values: the past keys and values come in as tensors (B, Hkv, P, D) and `append`
    returns them joined with the new ones, the layer's present (B, Hkv, P + T, D). Nothing is written in place."""

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.keys, self.values, self.cross = keys, values, None
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


class EncoderGraph(nn.Module):
    """An encoder as a function of (input_ids, attention_mask[, token_type_ids]) -> its head's outputs."""

    def __init__(self, model: nn.Module, head: str) -> None:
        super().__init__()
        self.model, self.head = model, head

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None):
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        if self.head == "none":
            return out.hidden_states, out.logits  # (B, T, C), pooled (B, C)
        return out.logits


def convert_to_onnx(run_dir: str | Path, out: str | Path, *, opset: int = OPSET, overwrite: bool = False
                    ) -> ONNXExport:
    """Write the run's model as an ONNX graph with dynamic batch and length axes (`overwrite` replaces an existing
    `out`). Raises ConfigError for a family with no ONNX form here (encoder-decoders, recurrent models), InputError
    for an existing `out` without `overwrite`."""
    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists; choose another file name, or add --overwrite to replace it")
    if out.suffix != ".onnx":
        raise InputError(f"{out} should end in .onnx")
    model, config = load_model(run_dir)
    export = export_onnx(model, config, out, opset=opset, overwrite=overwrite)
    log.info("wrote %s as ONNX (%s) to %s", run_dir, export.kind, out)
    return export


def export_onnx(model: nn.Module, config: ModelConfig, out: Path, *, opset: int = OPSET, overwrite: bool = False
                ) -> ONNXExport:
    """Write `model` (of `config`, in fp32) as an ONNX graph at `out`, whole or not at all (see the module
    docstring); what `convert_to_onnx` does after reading the run, and what the speed suite's onnxruntime peer
    runs."""
    graph, example, dynamic, inputs, outputs, kind = _graph(model.float().eval(), config)
    with torch.no_grad():
        program = torch.onnx.export(graph, example, dynamo=True, dynamic_shapes=dynamic, input_names=inputs,
                                    output_names=outputs, opset_version=opset, external_data=False,
                                    verbose=False)
    with atomic_output(out, directory=False, overwrite=overwrite, flag="--to-onnx") as partial:
        program.save(str(partial), external_data=False)
    return ONNXExport(path=out, kind=kind, inputs=inputs, outputs=outputs)


def _graph(model: nn.Module, config: ModelConfig):
    """(module, example inputs, dynamic shapes, input names, output names, kind) for the model's family."""
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    # example sizes all differ (and differ from the model's own sizes), so no dynamic axis is taken for a fixed one
    example_batch, example_length = 3, 5
    ids = torch.randint(0, config.vocab_size, (example_batch, example_length))
    if isinstance(config, DecoderConfig):
        past_sequence = torch.export.Dim("past_sequence", min=0)
        example_past = 7
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
    if isinstance(config, EncoderConfig):
        head = config.encoder_head
        mask = torch.ones(example_batch, example_length, dtype=torch.long)
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
    raise ConfigError(f"ONNX export writes decoders and encoders; this run is family={config.family!r}: "
                      f"{elsewhere(config, '--to-onnx')}")
