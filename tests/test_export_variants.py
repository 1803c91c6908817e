"""Variants attnkit trains that a format cannot hold (ALiBi, Shaw's relative positions, soft-capped scores, post-norm,
a GPT-2 layout with an activation llama.cpp's GPT-2 graph lacks) are refused before anything is written, naming the
field and what the nearest layout has instead, and pointing at the export that holds them: ONNX, whose graph gives
attnkit's logits for each, through its past keys and values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from export_runs import LAYOUTS, random_run

from attnkit.checkpoint import load_model
from attnkit.errors import ConfigError
from attnkit.interop.hf import convert_to_hf

LLAMA = {**LAYOUTS["llama-gqa-untied"], "d_model": 32, "d_ff": 64}
# variant -> (its fields, what the refusal names)
VARIANTS = {
    "alibi": ({**LLAMA, "position": "alibi"}, "position='alibi' (a LlamaForCausalLM has 'rope')"),
    "shaw": ({**LLAMA, "position": "relative"}, "position='relative' (a LlamaForCausalLM has 'rope')"),
    "softcap": ({**LLAMA, "attn_softcap": 30.0}, "attn_softcap=30.0 (a LlamaForCausalLM has None)"),
    "post-norm": ({**LLAMA, "norm_position": "post"}, "norm_position='post' (a LlamaForCausalLM has 'pre')"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_hugging_face_and_gguf_refuse_before_writing_naming_the_field_and_onnx(tmp_path, variant):
    pytest.importorskip("gguf", reason="GGUF export needs the gguf package (pip install 'attnkit[export]')")
    from attnkit.interop.gguf import convert_to_gguf

    fields, said = VARIANTS[variant]
    run = random_run(tmp_path, fields)
    for convert, out in ((convert_to_hf, tmp_path / "hf"), (convert_to_gguf, tmp_path / "model.gguf")):
        with pytest.raises(ConfigError) as refused:
            convert(run, out)
        message = str(refused.value)
        assert said in message and message.endswith("or use --to-onnx for it")  # GGUF needs the layout HF lacks
        assert "rope_theta" not in message and "relative_max_distance" not in message  # they follow from position
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# one graph takes ALiBi, soft-capping and post-norm together (an export costs seconds); Shaw's positions another
ONNX_CASES = {"alibi-softcap-post-norm": {**LLAMA, "position": "alibi", "attn_softcap": 30.0, "norm_position": "post"},
              "shaw": VARIANTS["shaw"][0]}


@pytest.mark.parametrize("case", [pytest.param(name, marks=pytest.mark.slow if name == "shaw" else ())
                                  for name in ONNX_CASES])
def test_onnx_holds_them_with_attnkits_logits(tmp_path, case):
    ort = pytest.importorskip("onnxruntime", reason="runs the graph in onnxruntime (pip install 'attnkit[export]')")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript (attnkit[export])")
    from attnkit.interop.onnx import convert_to_onnx

    run = random_run(tmp_path, {**ONNX_CASES[case], "n_layers": 1})
    folder = convert_to_onnx(run, tmp_path / "onnx")
    model, config = load_model(run)
    session = ort.InferenceSession(str(folder.graphs[0].path), providers=["CPUExecutionProvider"])
    ids = torch.randint(0, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    empty = np.zeros((2, config.resolved.n_kv_heads, 0, config.resolved.head_dim), dtype=np.float32)
    names = ("past_key_values.0.key", "past_key_values.0.value")
    logits, *present = session.run(None, {"input_ids": ids[:, :6].numpy(), "attention_mask": np.ones((2, 6), np.int64),
                                          **dict.fromkeys(names, empty)})
    step, *_ = session.run(None, {"input_ids": ids[:, 6:].numpy(), "attention_mask": np.ones((2, 7), np.int64),
                                  **dict(zip(names, present, strict=True))})
    with torch.no_grad():
        ours = model(ids).logits.numpy()  # (B, T, V)
    theirs = np.concatenate((logits, step), axis=1)
    assert np.abs(theirs - ours).max() <= 1e-4 * np.abs(ours).max()
