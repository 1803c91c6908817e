"""Attention weights recomputed from the fast model equal the reference path's (need_weights=True), for every score
function, position scheme and family; the capture changes no output and leaves no hook behind."""

import itertools
from typing import get_args

import pytest
import torch
from torch.testing import assert_close

from attnkit.config import ModelConfig, Position, Score
from attnkit.models import build_model
from attnkit.models.attention_capture import attention_sites, capture_attention, transformer_blocks
from attnkit.models.recurrent import recurrent_seq2seq


def _configs():
    for family, score, position in itertools.product(
        ("decoder", "encoder", "encoder-decoder"), get_args(Score), get_args(Position)
    ):
        head = {"encoder_head": "none"} if family == "encoder" else {}
        config = ModelConfig(family=family, score=score, position=position, vocab_size=50, d_model=32, n_heads=4,
                             n_kv_heads=2 if score == "scaled_dot" else None, d_ff=64, max_seq_len=32, **head)
        yield pytest.param(config, id=f"{family}-{score}-{position}")


def _run(model, config, need_weights):
    torch.manual_seed(1)
    src = torch.randint(0, config.vocab_size, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False  # padding in the second row
    if config.family == "encoder-decoder":
        tgt = torch.randint(0, config.vocab_size, (2, 7))
        return model(src, tgt, src_mask=mask, need_weights=need_weights)
    return model(src, attention_mask=mask, need_weights=need_weights)


@pytest.mark.parametrize("config", list(_configs()))
def test_recomputed_weights_equal_the_reference_path(config):
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        reference = _run(model, config, need_weights=True)
        with capture_attention(model) as captured:
            fast = _run(model, config, need_weights=False)
    assert_close(fast.logits, reference.logits, rtol=1e-5, atol=1e-5)
    expected = {}
    for stack, layers in (("encoder", reference.encoder_attentions), ("decoder", reference.attentions)):
        for layer, weights in enumerate(layers or ()):
            for kind, tensor in weights.items():
                expected[(stack, layer, kind)] = tensor
    sites = attention_sites(model)
    assert len(captured) == len(sites) == len(expected)
    for site in sites:
        stack = "decoder" if site.stack in ("stack", "decoder") else "encoder"
        kind = "self" if site.kind in ("self", "causal") else "cross"
        (weights,) = captured[site]
        assert_close(weights, expected[(stack, site.layer, kind)], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        _run(model, config, need_weights=False)
    assert [len(v) for v in captured.values()] == [1] * len(sites)  # the hooks left with the context


def test_site_kinds_follow_the_blocks():
    config = ModelConfig(family="encoder-decoder", n_layers=2, n_decoder_layers=3, d_model=32, n_heads=4, d_ff=64)
    sites = attention_sites(build_model(config))
    assert [s.name for s in sites] == [
        "encoder.self.0", "encoder.self.1",
        "decoder.causal.0", "decoder.cross.0", "decoder.causal.1", "decoder.cross.1",
        "decoder.causal.2", "decoder.cross.2",
    ]
    assert [b.name for b in transformer_blocks(build_model(ModelConfig(n_layers=2)))] == ["stack.0", "stack.1"]


@pytest.mark.parametrize("attention", ["bahdanau", "luong-dot", "luong-general"])
def test_recurrent_attention_per_decoding_step(attention):
    torch.manual_seed(0)
    model = recurrent_seq2seq(src_vocab_size=30, tgt_vocab_size=30, embedding_dim=16, hidden=16, encoder_hidden=8,
                              n_layers=1, cell="gru", attention=attention, bidirectional=True).eval()
    src, tgt = torch.randint(0, 30, (2, 6)), torch.randint(0, 30, (2, 5))
    with torch.no_grad():
        reference = model(src, tgt, need_weights=True).attentions[0]["cross"]  # (B, 1, T, S)
        with capture_attention(model) as captured:
            model(src, tgt)
    (site,) = attention_sites(model)
    assert site.kind == "cross"
    assert_close(torch.cat(captured[site], dim=2), reference)


def test_decoding_steps_through_a_cache_are_left_out():
    model = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=4, d_ff=64)).eval()
    cache = model.allocate_cache(1, 8)
    with torch.no_grad(), capture_attention(model) as captured:
        model(torch.tensor([[1, 2, 3]]), cache=cache)
    assert not captured and cache.length == 3
