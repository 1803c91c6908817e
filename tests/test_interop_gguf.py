"""`attnkit convert RUN --to-gguf`: the file read back with the gguf package's reader (names, shapes, types,
hyperparameters, tokenizer), its weights read by transformers' own GGUF loader (an independent reading of the
layout: logits equal attnkit's), and, where llama-cpp-python is installed, run by llama.cpp itself."""

from __future__ import annotations

import json
import logging
import math
import re

import numpy as np
import pytest
import torch
from export_runs import LAYOUTS, random_run, source_text, tokenizer, trained_run

from attnkit.checkpoint import load_model
from attnkit.cli import main
from attnkit.errors import ConfigError, InputError
from attnkit.interop.gguf import GGUF_TYPES, convert_to_gguf, rope_pairs_adjacent

gguf = pytest.importorskip("gguf", reason="GGUF export needs the gguf package (pip install 'attnkit[export]')")

PROMPT = [40, 7, 300, 12, 99, 5, 250, 31]


def _fields(reader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _tensors(reader) -> dict:
    """name -> (numpy shape (rows, columns), GGML type name, values dequantized to f32)"""
    out = {}
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ggml's order: columns first
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        out[tensor.name] = (shape, tensor.tensor_type.name, values)
    return out


@pytest.mark.parametrize("type", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_default_model_reads_back_with_its_hyperparameters_tokenizer_and_types(tmp_path, type):
    run = random_run(tmp_path, LAYOUTS["default"])
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    convert_to_gguf(run, tmp_path / "model.gguf", type=type, chat_template=template)
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    fields, tensors = _fields(reader), _tensors(reader)
    config = load_model(run)[1]

    assert fields["general.architecture"] == "llama"
    assert fields["general.file_type"] == gguf.LlamaFileType[GGUF_TYPES[type][1]]
    expected = {"context_length": 64, "embedding_length": 64, "feed_forward_length": 192, "block_count": 2,
                "attention.head_count": 4, "attention.head_count_kv": 4, "rope.dimension_count": 16,
                "rope.freq_base": config.rope_theta, "attention.layer_norm_rms_epsilon": config.norm_eps}
    assert {key: pytest.approx(fields[f"llama.{key}"]) for key in expected} == expected

    vocab = tokenizer()
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    assert fields["tokenizer.ggml.tokens"] == [vocab.pieces([i])[0] for i in range(vocab.vocab_size)]
    control = [i for i, t in enumerate(fields["tokenizer.ggml.token_type"]) if t == gguf.TokenType.CONTROL]
    assert control == sorted(vocab.token_id(role) for role in ("pad", "bos", "eos", "unk"))
    assert [fields[f"tokenizer.ggml.{r}_token_id"] for r in ("bos", "eos")] == [vocab.bos_id, vocab.eos_id]
    assert len(fields["tokenizer.ggml.merges"]) == vocab.vocab_size - 256 - 4
    assert fields["tokenizer.chat_template"] == template.read_text()

    per_layer = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")
    names = {"token_embd.weight", "output_norm.weight"} | {f"blk.{i}.{p}.weight" for i in range(2) for p in per_layer}
    assert set(tensors) == names  # tied: llama.cpp reads token_embd as the output layer
    shapes = {"token_embd": (320, 64), "attn_q": (64, 64), "attn_k": (64, 64), "ffn_gate": (192, 64),
              "ffn_down": (64, 192), "attn_norm": (64,)}
    for name, (shape, qtype, _) in tensors.items():
        part = name.split(".")[-2]
        if part in shapes:
            assert shape == shapes[part], name
        assert qtype == ("F32" if len(shape) == 1 else GGUF_TYPES[type][0]), name

    # values: exact at f32, within each type's rounding otherwise
    model = load_model(run)[0]
    stored = tensors["blk.1.ffn_down.weight"][2]
    original = model.stack.blocks[1].mlp.down_proj.weight.detach().numpy()
    tolerance = {"f32": 0, "f16": 1e-3, "bf16": 8e-3, "q8_0": 1e-2, "q4_0": 0.2}[type]
    assert np.abs(stored - original).max() <= tolerance * np.abs(original).max()


@pytest.mark.parametrize("layout", ["gpt2", "llama-gqa-untied", "mistral-window"])
def test_each_layout_reads_back_with_its_names_and_shapes(tmp_path, layout):
    run = random_run(tmp_path, LAYOUTS[layout])
    written = convert_to_gguf(run, tmp_path / "model.gguf", type="q8_0")
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    fields, tensors = _fields(reader), _tensors(reader)
    arch = {"gpt2": "gpt2", "llama-gqa-untied": "llama", "mistral-window": "llama"}[layout]
    assert fields["general.architecture"] == written.architecture == arch
    if layout == "gpt2":  # one fused q/k/v, biases, learned positions kept f32, the tied output as its own copy
        assert tensors["blk.0.attn_qkv.weight"][0] == (192, 64) and tensors["blk.0.attn_qkv.bias"][0] == (192,)
        assert tensors["position_embd.weight"][1] == "F32"
        np.testing.assert_array_equal(tensors["output.weight"][2], tensors["token_embd.weight"][2])
        assert fields["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    else:  # grouped-query heads: k and v have 2 heads of 16
        assert tensors["blk.0.attn_k.weight"][0] == (32, 64) and tensors["blk.0.attn_v.weight"][0] == (32, 64)
        assert fields["llama.attention.head_count_kv"] == 2 and "output.weight" in tensors  # untied
    if layout == "mistral-window":  # llama.cpp attends to every key: the context written is the window
        assert fields["llama.context_length"] == written.context_length == 16


def test_weights_whose_rows_are_no_whole_number_of_blocks_are_kept_at_f16_in_one_line(tmp_path, caplog):
    run = random_run(tmp_path, {**LAYOUTS["llama-gqa-untied"], "d_model": 48, "d_ff": 96})  # rows of 48: 1.5 blocks
    export = convert_to_gguf(run, tmp_path / "model.gguf", type="q8_0")
    kept = sorted(name for name, stored in export.tensor_types.items() if stored == "F16")
    assert "token_embd.weight" in kept and "blk.0.ffn_down.weight" not in kept  # ffn_down's rows hold 96: 3 blocks
    assert export.tensor_types["blk.0.ffn_down.weight"] == "Q8_0"
    said = [record.getMessage() for record in caplog.records if "whole number" in record.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{len(kept)} of {len(export.tensor_types)} tensors (")


def test_q_and_k_rows_pair_as_llama_cpp_rotates():
    """llama.cpp's Llama turns adjacent pairs (2i, 2i + 1); attnkit (and transformers) turn (i, i + D/2). The
    permuted rows rotated llama.cpp's way give the same scores as the originals rotated attnkit's way."""
    heads, dim, width, position = 2, 8, 6, 5
    torch.manual_seed(0)
    wq, wk = torch.randn(heads * dim, width), torch.randn(heads * dim, width)
    x, y = torch.randn(width), torch.randn(width)
    angles = position * 10000.0 ** (-torch.arange(0, dim, 2).float() / dim)  # (D/2,)
    cos, sin = angles.cos(), angles.sin()

    def rotate_half(v):  # (H, D): pairs (i, i + D/2)
        a, b = v[:, : dim // 2], v[:, dim // 2:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=1)

    def rotate_adjacent(v):  # (H, D): pairs (2i, 2i + 1)
        a, b = v[:, 0::2], v[:, 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=2).reshape(heads, dim)

    ours = (rotate_half((wq @ x).view(heads, dim)) * rotate_half((wk @ y).view(heads, dim))).sum(-1)
    q, k = rope_pairs_adjacent(wq, heads), rope_pairs_adjacent(wk, heads)
    theirs = (rotate_adjacent((q @ x).view(heads, dim)) * rotate_adjacent((k @ y).view(heads, dim))).sum(-1)
    torch.testing.assert_close(theirs, ours)
    assert not torch.allclose(q, wq)  # the rows did move


@pytest.mark.parametrize("layout", ["default", "gpt2", "llama-gqa-untied", "mistral-window"])
def test_transformers_reads_the_file_to_attnkits_logits(tmp_path, layout):
    """transformers' GGUF loader (its own reading of llama.cpp's layout: q/k pairs, fused q/k/v) gives attnkit's
    logits from the f32 file, and close ones from q8_0."""
    transformers = pytest.importorskip("transformers", reason="compares against transformers' GGUF loader")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files with accelerate installed")
    run = random_run(tmp_path, LAYOUTS[layout])
    model = load_model(run)[0]
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        ours = model(ids).logits
    for type, tolerance in (("f32", 1e-4), ("q8_0", 0.05)):
        convert_to_gguf(run, tmp_path / f"{type}.gguf", type=type)
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, gguf_file=f"{type}.gguf", dtype=torch.float32).eval()
        with torch.no_grad():
            theirs = reference(ids).logits
        assert (theirs - ours).abs().max() <= tolerance * ours.abs().max(), type


def test_transformers_reads_the_tokenizer_back(tmp_path):
    transformers = pytest.importorskip("transformers", reason="compares against transformers' GGUF loader")
    run = random_run(tmp_path, LAYOUTS["default"])
    convert_to_gguf(run, tmp_path / "model.gguf", type="q8_0")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf")
    text = "def convert(run, out):\n    return {'é': 1, '日本': 2}  # ü\n"
    assert theirs(text, add_special_tokens=False)["input_ids"] == tokenizer().encode(text)
    assert theirs.eos_token_id == tokenizer().eos_id
    from attnkit.serve.chat import ChatTemplate  # the file's chat template, rendered by transformers, is serve's

    assert theirs.apply_chat_template(CHATS[2], tokenize=False, add_generation_prompt=True) == ChatTemplate(
        eos_token=theirs.eos_token).render(CHATS[2])  # EOS after each reply, as chat fine-tuning learns it


def test_refused_with_the_reason(tmp_path):
    from attnkit.tokenize import CharTokenizer

    layer_norm_rope = {**LAYOUTS["default"], "norm": "layer", "activation": "gelu", "bias": True}  # the old default
    with pytest.raises(ConfigError, match="llama.cpp runs a GPT-2, Llama or Mistral layout"):
        convert_to_gguf(random_run(tmp_path, layer_norm_rope, name="old"), tmp_path / "old.gguf")
    encoder = random_run(tmp_path, dict(family="encoder", d_model=32, n_heads=2, d_ff=64), name="encoder")
    with pytest.raises(ConfigError, match="GGUF export writes decoders"):
        convert_to_gguf(encoder, tmp_path / "encoder.gguf")
    tagger = random_run(tmp_path, {**LAYOUTS["default"], "decoder_head": "tag", "n_classes": 5}, name="tagger")
    with pytest.raises(ConfigError, match="predicts the next token .*head 'tag' gives a label per position: use "
                                          "--to-hf or --to-onnx for it"):
        convert_to_gguf(tagger, tmp_path / "tagger.gguf")
    run = random_run(tmp_path, LAYOUTS["default"])
    with pytest.raises(ConfigError, match="train the run with --tokenizer bpe"):
        chars = random_run(tmp_path, {**LAYOUTS["default"], "vocab_size": 40}, name="chars")
        CharTokenizer("abcdefghijklmnopqrstuvwxyz .\n").save(chars / "tokenizer")
        convert_to_gguf(chars, tmp_path / "chars.gguf")
    (tmp_path / "taken.gguf").write_bytes(b"")
    with pytest.raises(InputError, match="already exists"):
        convert_to_gguf(run, tmp_path / "taken.gguf")
    with pytest.raises(ConfigError, match="not a GGUF type"):
        convert_to_gguf(run, tmp_path / "new.gguf", type="q4_K")
    assert [path.name for path in tmp_path.iterdir() if path.is_file()] == ["taken.gguf"]  # nothing else written


@pytest.mark.parametrize("normalizer, said", [
    ({"type": "Lowercase"}, "(Lowercase)"),
    ({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}, "(Sequence of NFC, Lowercase)"),
    ({"type": "NFKC"}, "(NFKC)"),
    ({"type": "NFD"}, "(NFD)"),
    ({"type": "Replace", "pattern": {"String": "``"}, "content": '"'}, "(Replace)"),
    ({"type": "Sequence", "normalizers": []}, None),  # normalizes nothing: written
])
def test_a_tokenizer_that_normalizes_text_is_refused_as_llama_cpp_would_not(tmp_path, normalizer, said):
    """llama.cpp's gpt2 tokenizer has no normalizer: 'Hello' would be split as written, not as the model read it."""
    run = random_run(tmp_path, LAYOUTS["default"])
    path = run / "tokenizer" / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**spec, "normalizer": normalizer}), encoding="utf-8")
    if said is None:
        convert_to_gguf(run, tmp_path / "model.gguf")
        return
    with pytest.raises(ConfigError, match=f"normalizes text before it splits it {re.escape(said)}.*--to-hf or "
                                          "--to-onnx"):
        convert_to_gguf(run, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


@pytest.mark.parametrize("normalizer", [{"type": "NFC"}, {"type": "Sequence", "normalizers": [{"type": "NFC"}]}])
def test_a_tokenizer_that_only_composes_to_nfc_is_written_with_a_warning(tmp_path, caplog, normalizer):
    """NFC alone leaves text already composed (most text) as it is, and llama.cpp's own converter writes such a
    tokenizer: written, saying that text not in NFC may split differently in llama.cpp."""
    run = random_run(tmp_path, LAYOUTS["default"])
    path = run / "tokenizer" / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**spec, "normalizer": normalizer}), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        convert_to_gguf(run, tmp_path / "model.gguf")
    assert (tmp_path / "model.gguf").is_file()
    assert "normalizes text to NFC before it splits it" in caplog.text and "may split differently" in caplog.text


def test_a_gpt2_layout_with_an_activation_llama_cpp_lacks_is_refused_before_writing(tmp_path, caplog):
    for activation in ("relu", "silu"):  # llama.cpp's GPT-2 graph would run them as GELU
        run = random_run(tmp_path, {**LAYOUTS["gpt2"], "activation": activation}, name=activation)
        with pytest.raises(ConfigError, match=f"activation='{activation}' would run as GELU there; export it --to-hf"):
            convert_to_gguf(run, tmp_path / f"{activation}.gguf")
        assert not (tmp_path / f"{activation}.gguf").exists()
    exact = random_run(tmp_path, {**LAYOUTS["gpt2"], "activation": "gelu"}, name="gelu")
    convert_to_gguf(exact, tmp_path / "gelu.gguf", type="f32")
    assert "GELU in its tanh form; this model's exact GELU differs" in caplog.text


def test_command_line(tmp_path, capsys):
    run = random_run(tmp_path, LAYOUTS["default"])
    out = tmp_path / "model.gguf"
    assert main(["convert", str(run), "--to-gguf", str(out), "--type", "q4_0"]) == 0
    assert f"as llama.cpp's llama (q4_0) to {out}" in capsys.readouterr().out
    assert gguf.GGUFReader(out).get_tensor(1).tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert main(["convert", str(run), "--to-gguf", str(tmp_path / "b.gguf"), "--to-hf", str(tmp_path / "hf")]) == 2
    assert "give one of --to-hf DIR, --to-gguf OUT.gguf or --to-onnx DIR" in capsys.readouterr().err



def test_the_command_line_names_no_hidden_partial_file(tmp_path, caplog):
    """gguf's writer logs the file it writes, at INFO: the hidden one attnkit writes into before the rename. The user
    is told only where the file went."""
    run = random_run(tmp_path, LAYOUTS["default"])
    with caplog.at_level("INFO"):
        assert main(["convert", str(run), "--to-gguf", str(tmp_path / "model.gguf")]) == 0
    assert [r.getMessage() for r in caplog.records if r.name.startswith("gguf")] == []
    assert not [r.getMessage() for r in caplog.records if ".partial" in r.getMessage()]


CHATS = [[], [{"role": "user", "content": "Hello!"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi {{ there }}\n  you"},
          {"role": "assistant", "content": "Hi."}, {"role": "developer", "content": "Be brief."},
          {"role": "user", "content": "Who are you?"}]]


def test_the_chat_template_is_the_one_attnkit_serve_chats_in_unless_given(tmp_path, capsys):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from attnkit.serve.chat import ChatTemplate

    run = random_run(tmp_path, LAYOUTS["default"])
    out = tmp_path / "model.gguf"
    assert main(["convert", str(run), "--to-gguf", str(out), "--type", "f32"]) == 0
    assert "chat template: attnkit's own" in capsys.readouterr().out
    template = _fields(gguf.GGUFReader(out))["tokenizer.chat_template"]
    for trim in (True, False):  # transformers renders with trim_blocks and lstrip_blocks, llama.cpp without
        environment = ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=trim)
        for messages in CHATS:
            rendered = environment.from_string(template).render(messages=messages, add_generation_prompt=True)
            assert rendered == ChatTemplate().render(messages)

    given = tmp_path / "chatml.jinja"
    given.write_text("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor %}")
    assert main(["convert", str(run), "--to-gguf", str(out), "--type", "f32", "--chat-template", str(given),
                 "--overwrite"]) == 0
    assert f"chat template: {given}" in capsys.readouterr().out
    assert _fields(gguf.GGUFReader(out))["tokenizer.chat_template"] == given.read_text()
    (run / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "the run's own"}]}))
    convert_to_gguf(run, out, type="f32", overwrite=True)
    assert _fields(gguf.GGUFReader(out))["tokenizer.chat_template"] == "the run's own"

# llama.cpp itself ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'attnkit[bench]')")


def _llama(path, n_ctx: int):
    import llama_cpp
    from llama_cpp import Llama

    f32 = llama_cpp.GGML_TYPE_F32  # the KV cache in f32 too (llama.cpp's default is f16)
    return Llama(model_path=str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=1, type_k=f32, type_v=f32)


@pytest.mark.parametrize("layout", ["default", "gpt2", "llama-gqa-untied", "llama-bias"])
def test_llama_cpp_logits_and_greedy_tokens_equal_attnkits_at_f32(tmp_path, llama_cpp, layout):
    run = random_run(tmp_path, LAYOUTS[layout])
    convert_to_gguf(run, tmp_path / "model.gguf", type="f32")
    model = load_model(run)[0]
    llm = _llama(tmp_path / "model.gguf", n_ctx=64)
    llm.eval(PROMPT)
    theirs = np.asarray(llm.scores[: len(PROMPT)])  # (T, V)
    with torch.no_grad():
        ours = model(torch.tensor([PROMPT])).logits[0].numpy()
    assert np.abs(theirs - ours).max() <= 2e-3 * np.abs(ours).max()

    new_tokens = 24
    llm.reset()
    greedy = []
    for token in llm.generate(PROMPT, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        greedy.append(token)
        if len(greedy) == new_tokens:
            break
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        for _ in range(new_tokens):
            ids = torch.cat((ids, model(ids).logits[:, -1:].argmax(-1)), dim=1)
    assert greedy == ids[0, len(PROMPT):].tolist()


def test_llama_cpp_tokenizes_and_detokenizes_as_attnkit_does(tmp_path, llama_cpp):
    from llama_cpp import Llama

    convert_to_gguf(random_run(tmp_path, LAYOUTS["default"]), tmp_path / "model.gguf", type="f32")
    llm = Llama(model_path=str(tmp_path / "model.gguf"), vocab_only=True, verbose=False)
    for text in ["def f(x):\n    return x  # ok", "Ünïcödé café naïve", "日本語のテキスト", "  two  spaces\n\n\ttab",
                 "a <eos> b <pad>", "it's we'll I'm", "🙂 emoji 123456"]:  # special tokens' text is text to both
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert ids == tokenizer().encode(text)
        assert llm.detokenize(ids).decode() == text


@pytest.mark.parametrize("type", ["f16", "bf16", "q8_0"])
def test_llama_cpp_logits_at_a_smaller_type_are_within_what_the_type_costs_attnkit(tmp_path, llama_cpp, type):
    """The tolerance is the type's own: attnkit's logits moved by taking the file's weight values (each 2-D weight
    through the gguf package's quantizer and back); llama.cpp also rounds its activations, hence the factor."""
    run = random_run(tmp_path, LAYOUTS["default"])
    convert_to_gguf(run, tmp_path / "model.gguf", type=type)
    model = load_model(run)[0]
    qtype = gguf.GGMLQuantizationType[type.upper()]
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        ours = model(prompt).logits[0].numpy()  # (T, V)
        for parameter in model.parameters():
            if parameter.dim() == 2:
                stored = gguf.quants.quantize(parameter.numpy(), qtype)
                parameter.copy_(torch.from_numpy(gguf.quants.dequantize(stored, qtype).reshape(parameter.shape)))
        rounded = model(prompt).logits[0].numpy()
    llm = _llama(tmp_path / "model.gguf", n_ctx=64)
    llm.eval(PROMPT)
    theirs = np.asarray(llm.scores[: len(PROMPT)])
    cost = np.abs(rounded - ours).max()
    assert 0 < cost < 0.1 * np.abs(ours).max()
    assert np.abs(theirs - ours).max() <= 4 * cost


def test_llama_cpp_perplexity_at_q8_0_within_one_percent(tmp_path, llama_cpp):
    run = trained_run(tmp_path)
    model = load_model(run)[0]
    ids = tokenizer().encode(source_text())[: 8 * 64]
    windows = [ids[i:i + 64] for i in range(0, len(ids), 64)]

    def perplexity(logits_of) -> float:
        total, count = 0.0, 0
        for window in windows:
            logits = torch.as_tensor(logits_of(window))[:-1]  # (T - 1, V)
            total += torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum").item()
            count += len(window) - 1
        return math.exp(total / count)

    with torch.no_grad():
        ours = perplexity(lambda w: model(torch.tensor([w])).logits[0])
    convert_to_gguf(run, tmp_path / "q8_0.gguf", type="q8_0")
    llm = _llama(tmp_path / "q8_0.gguf", n_ctx=64)

    def llama_logits(window):
        llm.reset()
        llm.eval(window)
        return np.asarray(llm.scores[: len(window)], dtype=np.float32)

    theirs = perplexity(llama_logits)
    assert ours < 0.5 * tokenizer().vocab_size  # trained: far from a uniform guess
    assert abs(theirs - ours) <= 0.01 * ours, (ours, theirs)
