"""The in-browser explorer's model (docs/explorer/): a tiny decoder that attnkit's own command trains on the synthetic
reversal task (`abcd=dcba`), exported by attnkit's ONNX exporter, with each layer's attention weights made outputs
of the graph so that the page can draw them.

    make explorer-model        (runs this file; about a minute on two cores)

It writes two files, and nothing else (the run goes to a temporary folder):

    docs/explorer/model.onnx   the graph (a few hundred KB): input_ids, attention_mask, past_key_values.* ->
                               logits, present.*, attention.{layer} (batch, heads, sequence, sequence)
    docs/explorer/model.json   the vocabulary by id, the graph's sizes, the command that trained it, its validation
                               loss, and a text with the model's greedy completion

The exporter writes the attention as a softmax inside each layer's attention; the weights are exposed by giving
each of those softmax nodes' results a name among the graph's outputs, and the file is written only after
onnxruntime has run it and its logits and weights equal attnkit's own (`need_weights=True`, the reference path).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "explorer"
TRAIN = ["train", "--data", "synthetic:reverse", "--preset", "gpt2-tiny", "--set", "max_seq_len=64", "--seq-len", "32",
         "--batch-size", "16", "--lr", "3e-3", "--max-steps", "600", "--seed", "0", "--no-progress"]
EXAMPLE = "abcdefgh="  # the page's first text: the model completes it with its reversal


def train(run: Path) -> None:
    subprocess.run([sys.executable, "-m", "attnkit", *TRAIN, "--out", str(run)], check=True)


def expose_attention(graph_path: Path, n_layers: int, n_heads: int) -> list[str]:
    """Name each layer's attention weights (the graph's softmax nodes, in layer order) as outputs
    `attention.{layer}`; returns the names. Raises RuntimeError where the graph holds another number of them."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph_path))
    softmaxes = [node for node in model.graph.node if node.op_type == "Softmax"]
    if len(softmaxes) != n_layers:
        raise RuntimeError(f"{graph_path}: {len(softmaxes)} softmax nodes for {n_layers} layers of attention")
    names = []
    for layer, node in enumerate(softmaxes):
        name = f"attention.{layer}"
        model.graph.node.append(helper.make_node("Identity", [node.output[0]], [name], name=f"expose_{name}"))
        model.graph.output.append(helper.make_tensor_value_info(
            name, TensorProto.FLOAT, ["batch", n_heads, "sequence", "total"]))  # (B, H, T, P + T)
        names.append(name)
    onnx.checker.check_model(model)
    onnx.save(model, str(graph_path))
    return names


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


def check(session, model, config, ids: list[int], names: list[str]) -> None:
    """The graph's logits and attention weights equal attnkit's own for `ids`."""
    import numpy as np
    import torch

    got = session.run(["logits", *names], feeds(ids, **sizes(config)))
    with torch.no_grad():
        want = model(torch.tensor([ids]), need_weights=True)
    np.testing.assert_allclose(got[0], want.logits.numpy(), atol=1e-4, rtol=1e-4)
    for layer, weights in enumerate(got[1:]):
        np.testing.assert_allclose(weights, want.attentions[layer]["self"].numpy(), atol=1e-5, rtol=1e-4)


def main() -> None:
    import onnxruntime

    from attnkit.checkpoint import TOKENIZER_DIR, load_model
    from attnkit.interop.onnx import export_onnx
    from attnkit.outputs import atomic_write
    from attnkit.tokenize import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        train(run)
        model, config = load_model(run)
        model.eval()
        tokenizer = load_tokenizer(run / TOKENIZER_DIR)
        graph = Path(tmp) / "model.onnx"
        export_onnx(model, config, graph)
        names = expose_attention(graph, config.n_layers, config.n_heads)
        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        ids = tokenizer.encode(EXAMPLE)
        check(session, model, config, ids, names)
        eos = tokenizer.token_id("eos")
        completion = tokenizer.decode(greedy(session, ids, config, eos))
        val_loss = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                    if '"val_loss"' in line][-1]["val_loss"]
        described = {
            "pieces": tokenizer.pieces(range(tokenizer.vocab_size)),
            "eos": eos,
            **sizes(config), "n_heads": config.n_heads,
            "max_seq_len": config.max_seq_len, "d_model": config.d_model,
            "attention_outputs": names,
            "trained_by": "attnkit " + " ".join(TRAIN),
            "val_loss": round(val_loss, 4),
            "example": {"text": EXAMPLE, "greedy": completion},
        }
        atomic_write(OUT / "model.onnx", graph.read_bytes())
        atomic_write(OUT / "model.json", json.dumps(described, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {OUT / 'model.onnx'} ({(OUT / 'model.onnx').stat().st_size:,} bytes) and model.json; "
          f"{EXAMPLE} -> {completion}; val_loss {val_loss:.4f}")


if __name__ == "__main__":
    main()
