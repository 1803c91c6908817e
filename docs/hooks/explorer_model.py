"""The in-browser explorer's model (docs/explorer/): a tiny decoder that attnkit's own command trains on the synthetic
reversal task (`abcd=dcba`), exported by attnkit's ONNX exporter, with what the page shows of each layer made outputs
of the graph: the queries, keys and values, the scores, the attention weights, the FFN's hidden activation and the
block's output (the residual stream).

    make explorer-model        (runs this file; about three minutes, on one core)

It writes two files, and nothing else (the run goes to a temporary folder):

    docs/explorer/model.onnx   the graph (a few hundred KB): input_ids, attention_mask, past_key_values.* ->
                               logits, present.{layer}.key / .value (batch, heads, sequence, head_dim: the keys
                               after RoPE, the values), query.{layer} (the same: the queries after RoPE),
                               scores.{layer} and attention.{layer} (batch, heads, sequence, sequence: before the
                               mask; the softmax's weights), hidden.{layer} (batch, sequence, d_ff),
                               residual.{layer} (batch, sequence, d_model)
    docs/explorer/model.json   the vocabulary by id, the graph's sizes and architecture (d_ff, norm and its
                               placement, position scheme: what the page's whole-model view draws), the command that
                               trained it, its validation loss, the share of held-out strings the graph reverses
                               exactly, and a text with the model's greedy completion

The exporter writes each layer's attention as scaled dot-product attention, softmax(q sqrt(s) @ k^T sqrt(s) + mask);
a tensor is exposed by giving it a name among the graph's outputs: the softmax's result (the weights), the MatMul's
(the scores before the mask) and the queries it scales. A block's output is the result of the last node the exporter
placed inside that block's module (each node's `namespace` metadata names the module it came from); the FFN's hidden
activation is the input of its down_proj. The file is written only after onnxruntime has run it and its logits and
every exposed tensor equal attnkit's own (`need_weights=True`, the reference path, for the weights; for the rest
`attnkit.inspect`'s hook points `attn.q`, `attn.k` (turned by RoPE), `attn.v`, `attn.scores`, `mlp.hidden` and
`resid_post`).

The model must reverse strings, not only draw attention: the graph completes `HELD_OUT` strings of the task's
lengths that the training never saw, greedily, as the page does, and nothing is written unless at least
`LEAST_EXACT` of them, and the page's first text, come out as the exact reversal. RoPE shortens the plateau
before the model finds the trick: the character to copy next lies 2k + 1 places back after k written, an offset
that rotary positions express wherever the line starts in the window. With GPT-2's learned absolute positions the
same command's validation loss is 2.09 at step 1,000 (RoPE: 1.42) and 1.96 at step 2,000, and 197 of 200 unseen
strings come out right at the end (RoPE: 200).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "explorer"
SEED = 0
TRAIN = ["train", "--data", "synthetic:reverse", "--preset", "gpt2-tiny", "--set", "max_seq_len=64", "position=rope",
         "--seq-len", "32", "--batch-size", "32", "--lr", "1e-3", "--max-steps", "5000", "--seed", str(SEED),
         "--no-progress"]
EXAMPLE = "abcdefgh="  # the page's first text: the model completes it with its reversal
HELD_OUT = 200  # strings the training never saw, drawn as the task draws them
LEAST_EXACT = 0.9  # the share of them the graph must reverse exactly, or nothing is written
BLOCK_SCOPE = re.compile(r"\.blocks\.(\d+): ")  # a node inside block L, in the exporter's `namespace` metadata
DOWN_PROJ_SCOPE = re.compile(r"\.blocks\.(\d+)\.mlp\.down_proj: ")  # a node inside block L's FFN output layer


def train(run: Path) -> None:
    """One thread: the sums' order, and so the trained model, is the same on any number of cores (seed 0 trained on
    two threads reached another, worse, model)."""
    subprocess.run([sys.executable, "-m", "attnkit", *TRAIN, "--out", str(run)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})


def expose(graph_path: Path, *, n_layers: int, n_heads: int, d_model: int, d_ff: int) -> dict[str, list[str]]:
    """Name, as outputs of the graph, what the page shows of each layer L: the attention weights `attention.L`
    (B, H, T, P + T), the queries after RoPE `query.L` (B, H, T, D), the scores before the mask `scores.L`
    (B, H, T, P + T), the FFN's hidden activation `hidden.L` (B, T, d_ff) and the block's output, the residual stream
    leaving it, `residual.L` (B, T, C); the keys (after RoPE) and values are the graph's `present.L.key` and
    `present.L.value` (B, H, P + T, D) already. Returns {kind: its names, one a layer}, those two kinds included.
    Raises RuntimeError where the graph holds another number of any of them, or attention of another form."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph_path))
    softmaxes = [node for node in model.graph.node if node.op_type == "Softmax"]
    if len(softmaxes) != n_layers:
        raise RuntimeError(f"{graph_path}: {len(softmaxes)} softmax nodes for {n_layers} layers of attention")
    blocks, hidden = block_outputs(model), scoped_inputs(model, DOWN_PROJ_SCOPE)
    if sorted(blocks) != list(range(n_layers)) or sorted(hidden) != list(range(n_layers)):
        raise RuntimeError(f"{graph_path}: nodes of blocks {sorted(blocks)} and FFNs {sorted(hidden)} for {n_layers} "
                           "layers")
    queries, scores = zip(*(queries_and_scores(model, softmax) for softmax in softmaxes), strict=True)
    exposed: dict[str, list[str]] = {}
    for kind, tensors, shape in (
        ("attention", [s.output[0] for s in softmaxes], ["batch", n_heads, "sequence", "total"]),
        ("query", queries, ["batch", n_heads, "sequence", d_model // n_heads]),
        ("scores", scores, ["batch", n_heads, "sequence", "total"]),
        ("hidden", [hidden[layer] for layer in range(n_layers)], ["batch", "sequence", d_ff]),
        ("residual", [blocks[layer] for layer in range(n_layers)], ["batch", "sequence", d_model]),
    ):
        for layer, tensor in enumerate(tensors):
            name = f"{kind}.{layer}"
            model.graph.node.append(helper.make_node("Identity", [tensor], [name], name=f"expose_{name}"))
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
            exposed.setdefault(kind, []).append(name)
    exposed["key"] = [f"present.{layer}.key" for layer in range(n_layers)]
    exposed["value"] = [f"present.{layer}.value" for layer in range(n_layers)]
    onnx.checker.check_model(model)
    onnx.save(model, str(graph_path))
    return exposed


def block_outputs(model) -> dict[int, str]:
    """{layer: the tensor block `layer` returns}: the result of the last node, in the graph's (topological) order,
    that the exporter placed inside the block's module (its `namespace` metadata names `....blocks.{layer}: `).
    `check` holds these tensors equal to attnkit's `blocks.{layer}.resid_post` before anything is written."""
    last: dict[int, str] = {}
    for node in model.graph.node:
        namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), "")
        inside = BLOCK_SCOPE.findall(namespace)
        if inside:
            last[int(inside[-1])] = node.output[0]
    return last


def queries_and_scores(model, softmax) -> tuple[str, str]:
    """The tensors a layer's attention softmax is computed from, as the exporter writes scaled dot-product attention:
    softmax(MatMul(q * sqrt(s), k^T * sqrt(s)) + mask bias). Returns (q, the queries after RoPE (B, H, T, D); the
    MatMul's result, the scores before the mask (B, H, T, S)). Raises RuntimeError where the nodes differ."""
    producer = {output: node for node in model.graph.node for output in node.output}
    constants = {init.name for init in model.graph.initializer}

    def made_by(tensor: str, op_type: str):
        node = producer.get(tensor)
        if node is None or node.op_type != op_type:
            raise RuntimeError(f"the attention softmax {softmax.output[0]} is not computed as scaled dot-product "
                               f"attention: {tensor} is not the result of a {op_type} node")
        return node

    bias_sum = made_by(softmax.input[0], "Add")
    matmul = next((producer[t] for t in bias_sum.input if t in producer and producer[t].op_type == "MatMul"), None)
    if matmul is None:
        raise RuntimeError(f"the attention softmax {softmax.output[0]} adds no MatMul's scores to its bias")
    scaled_query = made_by(matmul.input[0], "Mul")
    query = [t for t in scaled_query.input
             if t not in constants and getattr(producer.get(t), "op_type", "") != "Constant"]
    if len(query) != 1:
        raise RuntimeError(f"the attention softmax {softmax.output[0]}: the queries' scaling multiplies {query}")
    return query[0], matmul.output[0]


def scoped_inputs(model, scope: re.Pattern) -> dict[int, str]:
    """{layer: the input of the first MatMul the exporter placed inside a module `scope` matches (its `namespace`
    metadata; group 1 the layer)}: `DOWN_PROJ_SCOPE` finds the FFN's hidden activation, down_proj's input."""
    found: dict[int, str] = {}
    for node in model.graph.node:
        namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), "")
        inside = scope.findall(namespace)
        if inside and node.op_type == "MatMul":
            found.setdefault(int(inside[-1]), node.input[0])
    return found


def feeds(ids: list[int], *, n_layers: int, n_kv_heads: int, head_dim: int) -> dict:
    """The graph's inputs for one text and no past (numpy arrays), as the page builds them."""
    import numpy as np

    empty = np.zeros((1, n_kv_heads, 0, head_dim), dtype=np.float32)
    inputs = {"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
    for layer in range(n_layers):
        inputs[f"past_key_values.{layer}.key"] = inputs[f"past_key_values.{layer}.value"] = empty
    return inputs


def sizes(config) -> dict[str, int]:
    """The sizes `feeds` needs, from the model's config."""
    return {"n_layers": config.n_layers, "n_kv_heads": config.resolved.n_kv_heads, "head_dim": config.resolved.head_dim}


def greedy(session, ids: list[int], config, eos: int, most: int = 16) -> list[int]:
    """The graph's greedy continuation of `ids`, to EOS or `most` tokens (each step runs the whole text again, as
    the page does)."""
    out: list[int] = []
    while len(out) < most:
        logits = session.run(["logits"], feeds(ids + out, **sizes(config)))[0]
        token = int(logits[0, -1].argmax())
        if token == eos:
            break
        out.append(token)
    return out


def training_examples() -> list:
    """The reversal task's examples as the training run draws them (`attnkit.data.make_task`, the run's seed)."""
    from attnkit.data import make_task
    from attnkit.tasks.common import SYNTHETIC_SIZES

    return make_task("reverse", SYNTHETIC_SIZES[0], SEED).examples


def held_out(n: int, seen: list) -> list:
    """`n` examples of the reversal task (the same lengths and symbols) whose strings are not among `seen`, the
    training run's examples."""
    from attnkit.data import make_task

    trained = {example.source for example in seen}
    return [example for example in make_task("reverse", 20 * n, SEED + 1).examples
            if example.source not in trained][:n]


def symbols(examples: list) -> list[str]:
    """The characters the examples' strings are made of, in order."""
    return sorted({char for example in examples for char in example.source})


def exact_share(session, config, tokenizer, examples: list) -> float:
    """The share of `examples` whose prompt (`abc=`) the graph completes greedily with exactly the target (`cba`)."""
    eos = tokenizer.token_id("eos")
    right = sum(tokenizer.decode(greedy(session, tokenizer.encode(e.prompt), config, eos)) == e.target
                for e in examples)
    return right / len(examples)


def check(session, model, config, ids: list[int], exposed: dict[str, list[str]]) -> None:
    """The graph's logits and exposed tensors (`expose`) equal attnkit's own for `ids`: the weights from the reference
    path (`need_weights=True`); the rest from `attnkit.inspect`'s hook points: `blocks.L.resid_post`, `attn.scores`,
    `mlp.hidden`, `attn.v`, and `attn.q`, `attn.k` turned by the layer's own position scheme (`rotate`) as its
    attention turns them before scoring."""
    import numpy as np
    import torch

    from attnkit.inspect import trace

    kinds = ["attention", "query", "key", "value", "scores", "hidden", "residual"]
    got = session.run(["logits", *(name for kind in kinds for name in exposed[kind])], feeds(ids, **sizes(config)))
    graph = {kind: got[1 + i * config.n_layers:1 + (i + 1) * config.n_layers] for i, kind in enumerate(kinds)}
    points = [f"blocks.{layer}.{point}" for layer in range(config.n_layers)
              for point in ("attn.q", "attn.k", "attn.v", "attn.scores", "mlp.hidden", "resid_post")]
    want = trace(model, torch.tensor([ids]), need_weights=True, names=points)
    np.testing.assert_allclose(got[0], want.output.logits.numpy(), atol=1e-4, rtol=1e-4)
    blocks = model.stack.blocks
    for layer in range(config.n_layers):
        point = f"blocks.{layer}."
        attention = blocks[layer].self_attn
        # (B, T, H, D) -> (B, H, T, D)
        heads_first = {name: want[point + f"attn.{name}"].transpose(1, 2) for name in "qkv"}
        query, key = attention.relative.rotate(heads_first["q"], heads_first["k"],
                                               attention.relative.prepare(torch.arange(len(ids))[None]))
        expected = {"attention": want.output.attentions[layer]["self"], "query": query, "key": key,
                    "value": heads_first["v"], "scores": want[point + "attn.scores"],
                    "hidden": want[point + "mlp.hidden"], "residual": want[point + "resid_post"]}
        for kind, tensor in expected.items():
            np.testing.assert_allclose(graph[kind][layer], tensor.detach().numpy(), atol=1e-4, rtol=1e-4,
                                       err_msg=f"{exposed[kind][layer]} is not attnkit's")


def trained_config(vocab_size: int):
    """The model config that `TRAIN` builds (its preset and `--set` assignments) for a vocabulary of `vocab_size`."""
    from attnkit import presets
    from attnkit.options import assignments

    preset = TRAIN[TRAIN.index("--preset") + 1]
    start = TRAIN.index("--set") + 1
    settings = TRAIN[start:next(i for i in range(start, len(TRAIN)) if TRAIN[i].startswith("--"))]
    return presets.get(preset, **assignments(settings), vocab_size=vocab_size)


def architecture(config) -> dict:
    """What the page's whole-model view draws besides the sizes in `sizes`: the feed-forward width, the norm and where
    it sits, the position scheme, the activation, whether the output layer reuses the embedding table."""
    resolved = config.resolved
    return {"d_ff": resolved.d_ff, "vocab_size": resolved.vocab_size, "norm": resolved.norm,
            "norm_position": resolved.norm_position, "final_norm": resolved.final_norm,
            "position": resolved.position, "activation": resolved.activation,
            "tie_embeddings": resolved.tie_embeddings}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        train(run)
        build(run, Path(tmp))


def build(run: Path, tmp: Path) -> None:
    """Export the run `train` wrote, expose and check the graph's outputs, measure it on the held-out strings and, only
    when it reverses them, write model.onnx and model.json (`tmp`: a folder for the graph while it is checked)."""
    import onnxruntime

    from attnkit import count_parameters
    from attnkit.checkpoint import TOKENIZER_DIR, load_model
    from attnkit.interop.onnx import export_onnx
    from attnkit.outputs import atomic_write
    from attnkit.tokenize import load_tokenizer

    model, config = load_model(run)
    model.eval()
    tokenizer = load_tokenizer(run / TOKENIZER_DIR)
    graph = tmp / "model.onnx"
    export_onnx(model, config, graph)
    exposed = expose(graph, n_layers=config.n_layers, n_heads=config.n_heads, d_model=config.d_model,
                     d_ff=config.resolved.d_ff)
    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    ids = tokenizer.encode(EXAMPLE)
    check(session, model, config, ids, exposed)
    eos = tokenizer.token_id("eos")
    completion = tokenizer.decode(greedy(session, ids, config, eos))
    trained = training_examples()
    examples = held_out(HELD_OUT, trained)
    share = exact_share(session, config, tokenizer, examples)
    if share < LEAST_EXACT or completion != EXAMPLE[:-1][::-1]:
        raise SystemExit(f"the trained model reverses {share:.0%} of {len(examples)} held-out strings exactly "
                         f"(at least {LEAST_EXACT:.0%} needed) and completes {EXAMPLE} with {completion!r}: "
                         f"nothing written; train longer (TRAIN in {Path(__file__).relative_to(ROOT)})")
    val_loss = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                if '"val_loss"' in line][-1]["val_loss"]
    described = {
        "pieces": tokenizer.pieces(range(tokenizer.vocab_size)),
        "eos": eos,
        **sizes(config), "n_heads": config.n_heads,
        "max_seq_len": config.max_seq_len, "d_model": config.d_model, "parameters": count_parameters(model),
        **architecture(config),
        **{f"{kind}_outputs": names for kind, names in exposed.items()},
        "trained_by": "attnkit " + " ".join(TRAIN),
        "val_loss": round(val_loss, 4),
        "held_out": {"strings": len(examples), "exact_share": share,
                     "lengths": [min(len(e.source) for e in examples), max(len(e.source) for e in examples)]},
        "example": {"text": EXAMPLE, "greedy": completion},
        "task_symbols": symbols(trained),  # what the strings were made of: the rest of `pieces` it never saw
    }
    atomic_write(OUT / "model.onnx", graph.read_bytes())
    atomic_write(OUT / "model.json", json.dumps(described, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {OUT / 'model.onnx'} ({(OUT / 'model.onnx').stat().st_size:,} bytes) and model.json; "
          f"{EXAMPLE} -> {completion}; val_loss {val_loss:.4f}; {share:.1%} of {len(examples)} held-out strings "
          "reversed exactly")


if __name__ == "__main__":
    main()
