"""Mistral (MistralForCausalLM) both ways with a sliding window narrower than the prompt: the window read from and
written to config.json, logits equal to transformers', and greedy generation four windows long token for token.

The shared parity and round-trip tests (test_interop_hf_parity.py, test_interop_hf_roundtrip.py) cover a Mistral
whose window is wider than every sequence; here each query of a prompt already loses keys to the window.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from interop_models import PAD, VOCAB, batch, hf_model, mistral_config, transformers, word_tokenizer

from attnkit import ConfigError, build_model, presets
from attnkit.cli import main
from attnkit.generate import generate_tokens
from attnkit.interop import hf
from attnkit.tokenize import load_tokenizer

WINDOW = 4
EOS = 2  # </s> of interop_models' word tokenizer
PROMPTS = [[5, 17, 33, 8, 61, 4, 70], [42, 7, 90, 3, 3, 18], [9, 9, 80, 3, 11, 12, 13, 14, 15]]  # all > WINDOW


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """(directory, reference) of a tiny random Mistral whose window (4) is narrower than every prompt."""
    directory = tmp_path_factory.mktemp("mistral-narrow")
    reference = hf_model("mistral", directory, config=mistral_config(sliding_window=WINDOW))
    word_tokenizer(directory)
    return directory, reference


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def test_the_window_is_read_and_matters(narrow):
    directory, reference = narrow
    loaded = hf.load(directory)
    config = loaded.config
    assert (loaded.model_type, loaded.architecture) == ("mistral", "MistralForCausalLM")
    assert (config.attention_window, config.global_every, config.window_of(1)) == (WINDOW, 0, WINDOW)
    assert (config.resolved.n_kv_heads, config.bias, config.rope_theta, config.position) == (2, False, 500.0, "rope")
    # In transformers the window changes the logits of these batches, so the parity below tests the window.
    ids, mask = batch(0, length=12)
    windowed = _logits(reference, ids, mask)
    unwindowed = transformers.MistralForCausalLM(mistral_config(sliding_window=None)).eval()
    unwindowed.load_state_dict(reference.state_dict())
    assert not torch.allclose(windowed[0, WINDOW:], _logits(unwindowed, ids, mask)[0, WINDOW:], atol=1e-3)


def test_a_null_window_reads_as_none(tmp_path):
    hf_model("mistral", tmp_path, config=mistral_config(sliding_window=None))
    assert json.loads((tmp_path / "config.json").read_text())["sliding_window"] is None
    assert hf.load(tmp_path).config.attention_window is None


def test_a_window_longer_than_the_context_reads_as_none_with_the_same_logits(tmp_path):
    """A sliding_window beyond max_position_embeddings hides no key of any sequence the model reads: it loads as
    attention to every key (attnkit refuses a window longer than max_seq_len), and computes what transformers does."""
    reference = hf_model("mistral", tmp_path, config=mistral_config(sliding_window=200))
    loaded = hf.load(tmp_path)
    assert (loaded.config.attention_window, loaded.config.max_seq_len) == (None, 128)
    ids, mask = batch(1, length=12)
    real = mask.bool()
    torch.testing.assert_close(_logits(loaded.model, ids, mask)[real], _logits(reference, ids, mask)[real],
                               atol=1e-5, rtol=1e-5)


def test_fp32_logits_with_a_window_narrower_than_the_prompt(narrow):
    directory, reference = narrow
    model = hf.load(directory).model
    for seed in range(3):
        ids, mask = batch(seed, length=12)  # right-padded rows of 12, 10 and 8 or fewer tokens: all > WINDOW
        real = mask.bool()
        torch.testing.assert_close(_logits(model, ids, mask)[real], _logits(reference, ids, mask)[real],
                                   atol=1e-5, rtol=1e-5)


def test_greedy_generation_four_windows_long_equals_transformers(narrow):
    directory, reference = narrow
    loaded = hf.load(directory)
    new_tokens = 4 * WINDOW
    ours = generate_tokens(loaded.model, PROMPTS, max_new_tokens=new_tokens, context_len=loaded.config.max_seq_len,
                           pad_id=PAD)

    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in PROMPTS])  # left-padded, as generate wants
    mask = (ids != PAD).long()
    reference.generation_config.eos_token_id = None  # run every token, as attnkit does without stop ids
    with torch.no_grad():
        out = reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=PAD)
    assert out[:, width:].tolist() == ours
    assert len({tuple(row) for row in ours}) > 1  # the prompts lead to different continuations


def test_convert_both_ways_on_the_command_line(narrow, tmp_path, capsys):
    """--from-hf, then attnkit generate as a user runs it (the inference plan's kernels) four windows past a
    prompt longer than the window, then --to-hf, which transformers reads as the same Mistral."""
    directory, reference = narrow
    assert main(["convert", "--from-hf", str(directory), "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["attention_window"] == WINDOW
    prompt, new_tokens = PROMPTS[0], 4 * WINDOW
    words = " ".join(f"w{i}" for i in prompt)
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "run"), "--prompt", words, "--max-new-tokens", str(new_tokens),
                 "--temperature", "0", "--no-stream"]) == 0
    with torch.no_grad():
        out = reference.generate(input_ids=torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=PAD)
    new = out[0, len(prompt):].tolist()
    new = new[: new.index(EOS)] if EOS in new else new  # attnkit generate stops at the tokenizer's </s>
    assert len(new) > 2 * WINDOW
    expected = load_tokenizer(tmp_path / "run" / "tokenizer").decode(new)
    assert capsys.readouterr().out.strip() == words + expected
    assert main(["convert", str(tmp_path / "run"), "--to-hf", str(tmp_path / "back")]) == 0
    assert "as a MistralForCausalLM" in capsys.readouterr().out

    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (written["model_type"], written["architectures"], written["sliding_window"]) == (
        "mistral", ["MistralForCausalLM"], WINDOW)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(back) is transformers.MistralForCausalLM and back.config.sliding_window == WINDOW
    ids, mask = batch(1, length=12)
    torch.testing.assert_close(_logits(back, ids, mask), _logits(reference, ids, mask), atol=0, rtol=0)


def _windowed_attnkit_model():
    config = presets.get("llama2-tiny", vocab_size=VOCAB, attention_window=WINDOW)
    torch.manual_seed(1)
    model = build_model(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    return model, config


def test_an_attnkit_model_with_a_window_is_written_as_mistral(tmp_path):
    model, config = _windowed_attnkit_model()
    assert hf.save(model, tmp_path, config=config) == "MistralForCausalLM"
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["sliding_window"] == WINDOW and written["num_key_value_heads"] == config.resolved.n_kv_heads
    back = hf.load(tmp_path)
    assert dataclasses.replace(back.config, head_dim=None, final_norm=None) == config  # those two resolved
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.model.state_dict()[name], tensor), name
    windowed_and_global = dataclasses.replace(config, global_every=2)  # alternating local and global layers
    with pytest.raises(ConfigError, match="no Hugging Face layout.*global_every=2"):
        hf.save(build_model(windowed_and_global), tmp_path / "gemma-like", config=windowed_and_global)


def test_transformers_reads_an_attnkit_windowed_model_with_the_same_logits(tmp_path):
    model, config = _windowed_attnkit_model()
    hf.save(model, tmp_path, config=config)
    reference = transformers.MistralForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = batch(2, length=12)
    real = mask.bool()
    torch.testing.assert_close(_logits(model, ids, mask)[real], _logits(reference, ids, mask)[real],
                               atol=1e-5, rtol=1e-5)
