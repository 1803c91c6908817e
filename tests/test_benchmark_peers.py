"""The speed suite's peers run the same model: llama.cpp reads the weights attnkit wrote to GGUF and gives its logits;
onnxruntime decodes attnkit's greedy tokens from its ONNX export; nanoGPT's training step updates its model; a
missing peer is named with the way to install it."""

import importlib.util

import pytest
import torch

from benchmarks import peers
from benchmarks.speed import Case, attnkit_config

TINY = Case("generate-tiny", "generate", "decoder", 2, 64, 2, 300, 6, 2, new_tokens=5)


def _tiny_decoder():
    from attnkit import build_model

    torch.manual_seed(0)
    return build_model(attnkit_config(TINY)).eval()


@pytest.mark.parametrize(("impl", "dtype", "tolerance"), [("llama.cpp", "fp32", 1e-3), ("llama.cpp", "bf16", 1.5e-2),
                                                         ("llama.cpp-q8_0", "bf16", 3e-2),
                                                         ("llama.cpp-q4_0", "bf16", 0.2)])
def test_llama_cpp_reads_the_same_weights(impl, dtype, tolerance):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'attnkit[bench]')")
    pytest.importorskip("gguf", reason="gguf is not installed (pip install 'attnkit[bench]')")
    model = _tiny_decoder()
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(2, TINY.vocab_size, (TINY.batch_size, TINY.seq_len), generator=generator)
    run, difference = peers.llama_cpp_generate(model, impl, dtype, prompt, TINY.new_tokens, threads=1)
    with torch.no_grad():
        scale = model(prompt[:1]).logits[0, -1].abs().max().item()
    # f32 differs only by llama.cpp's f16 key/value cache; bf16, q8_0 and q4_0 by rounding the weights as well (4-bit
    # weights in blocks of 32: 10% of the largest logit here, as int4's own test allows 15% of fp32's logits' norm)
    assert difference <= tolerance * scale
    run()  # decodes the batch to the end


@pytest.mark.slow  # the ONNX export's own tests (test_interop_onnx.py) hold its decoding to attnkit's
def test_onnxruntime_decodes_attnkits_greedy_tokens_from_its_onnx_export():
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'attnkit[export]')")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (pip install 'attnkit[export]')")
    from attnkit.generate import generate_tokens

    model = _tiny_decoder()
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(2, TINY.vocab_size, (TINY.batch_size, TINY.seq_len), generator=generator)
    run, difference = peers.onnxruntime_generate(model, attnkit_config(TINY), prompt, TINY.new_tokens, threads=1)
    assert difference <= 1e-4
    expected = generate_tokens(model, prompt.tolist(), max_new_tokens=TINY.new_tokens, context_len=64)
    assert run().tolist() == expected


def test_gguf_vocabulary_has_distinct_tokens_and_the_newline_byte_first():
    tokens = peers.byte_vocabulary(300)
    assert len(set(tokens)) == 300 and tokens[0] == "\u010a"  # byte 10 in GPT-2's byte-level alphabet


def test_nanogpt_step_updates_every_parameter():
    case = Case("train-tiny", "train", "decoder", 2, 32, 2, 50, 8, 2)
    model, step = peers.nanogpt_train_step(case, "bf16", compiled=False, device="cpu")
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_compiled_nanogpt_row_compiles_the_loss_with_the_model(monkeypatch):
    """train.py's `logits, loss = model(X, Y)` under `torch.compile(model)`: the cross-entropy is in the compiled
    graph (a backend that records what Dynamo hands it), not computed in eager on the logits it returns."""
    graphs, compile = [], torch.compile

    def recording(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr(torch, "compile", lambda model: compile(model, backend=recording))
    case = Case("train-tiny", "train", "decoder", 2, 32, 2, 50, 8, 2)
    _, step = peers.nanogpt_train_step(case, "fp32", compiled=True, device="cpu")
    step()
    assert len(graphs) == 1
    assert torch.nn.functional.cross_entropy in [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]


def test_a_missing_peer_is_named_with_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "llama_cpp" else real(name))
    assert "pip install 'attnkit[bench]'" in peers.unavailable("llama.cpp-q8_0")
    assert peers.unavailable("nanogpt") is None


def test_llama_cpp_logits_at_every_position_are_attnkits(tmp_path):
    """What `python -m benchmarks int8` scores llama.cpp's quality with: the logits of a whole window."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'attnkit[bench]')")
    pytest.importorskip("gguf", reason="gguf is not installed (pip install 'attnkit[bench]')")
    model = _tiny_decoder()
    window = torch.randint(2, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    peers.write_gguf(model, tmp_path / "model.gguf", "F32")
    runner = peers.LlamaCpp(tmp_path / "model.gguf", batch_size=1, prompt_len=12, new_tokens=0, threads=1)
    with torch.no_grad():
        expected = model(window).logits[0]  # (T, V)
    got = torch.from_numpy(runner.sequence_logits(window[0].tolist()))
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-3 * expected.abs().max()  # llama.cpp's f16 key/value cache
