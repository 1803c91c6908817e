"""Model options that published checkpoints need: each off by default, each changing exactly what it names."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnkit import ConfigError, InputError, ModelConfig, build_model, presets
from attnkit.layers.feedforward import FeedForward
from attnkit.layers.positions import SinusoidalPositions
from attnkit.models.encoder import pool


def _encoder(**kw):
    base = dict(family="encoder", vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16,
                norm_position="post")
    torch.manual_seed(0)
    return build_model(ModelConfig(**{**base, **kw})).eval()


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "llama2-tiny", "vaswani-tiny"])
def test_defaults_add_no_parameters(name):
    names = set(build_model(presets.get(name)).state_dict())
    assert not {n for n in names if "token_types" in n or "embeddings.norm" in n or "pooler" in n}
    assert "lm_head.bias" not in names


def test_silu_feedforward_is_x_sigmoid_x():
    torch.manual_seed(0)
    ffn = FeedForward(8, 16, activation="silu")
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    ffn = ffn.double()
    hidden = ffn.up_proj(x)
    torch.testing.assert_close(ffn(x), ffn.down_proj(hidden * torch.sigmoid(hidden)))


def test_sinusoidal_halves_put_sines_first_then_cosines():
    d_model = 8
    positions = torch.arange(5).unsqueeze(0)
    halves = SinusoidalPositions(d_model, layout="halves")(positions)[0]  # (T, C)
    interleaved = SinusoidalPositions(d_model)(positions)[0]
    for pos in range(5):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert halves[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert halves[pos, d_model // 2 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)
    torch.testing.assert_close(halves[:, : d_model // 2], interleaved[:, 0::2])
    torch.testing.assert_close(halves[:, d_model // 2 :], interleaved[:, 1::2])


def test_token_types_change_the_output_and_default_to_zero():
    model = _encoder(type_vocab_size=2, encoder_head="none")
    ids = torch.randint(0, 40, (2, 6))
    zeros, ones = torch.zeros_like(ids), torch.ones_like(ids)
    default = model(ids).hidden_states
    torch.testing.assert_close(default, model(ids, token_type_ids=zeros).hidden_states)
    assert not torch.allclose(default, model(ids, token_type_ids=ones).hidden_states)


def test_token_types_are_checked_at_the_edge():
    with_types = _encoder(type_vocab_size=2)
    ids = torch.randint(0, 40, (2, 6))
    with pytest.raises(InputError, match="token_type_ids holds token id 2"):
        with_types(ids, token_type_ids=torch.full_like(ids, 2))
    with pytest.raises(InputError, match="type_vocab_size=0"):
        _encoder()(ids, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ConfigError, match="type_vocab_size"):
        ModelConfig(type_vocab_size=-1)


def test_embedding_norm_normalises_each_token():
    model = _encoder(embedding_norm=True, norm_eps=1e-12)
    embeddings = model.stack.embeddings
    x = embeddings(torch.randint(0, 40, (2, 6)), torch.arange(6).unsqueeze(0))
    torch.testing.assert_close(x.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(x.var(-1, unbiased=False), torch.ones(2, 6), atol=1e-3, rtol=0)


def test_pooler_is_dense_tanh_before_the_classifier():
    model = _encoder(pooler=True, n_classes=3)
    ids = torch.randint(0, 40, (2, 6))
    out = model(ids)
    expected = model.classifier(torch.tanh(model.pooler.dense(out.hidden_states[:, 0])))
    torch.testing.assert_close(out.logits, expected)
    with pytest.raises(ConfigError, match="pooler=True applies to family='encoder'"):
        ModelConfig(family="decoder", pooler=True)


def test_bare_encoder_returns_states_and_pooled_vector():
    model = _encoder(encoder_head="none", pooling="mean")
    ids = torch.randint(0, 40, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    out = model(ids, attention_mask=mask)
    assert out.hidden_states.shape == (2, 6, 16) and out.logits.shape == (2, 16)
    torch.testing.assert_close(out.logits[1], out.hidden_states[1, :3].mean(0))
    torch.testing.assert_close(out.logits, pool(out.hidden_states, mask.bool(), "mean"))


def test_lm_head_bias_is_added_and_the_weight_stays_tied():
    torch.manual_seed(0)
    config = presets.get("gpt2-tiny", lm_head_bias=True)
    model = build_model(config).eval()
    assert model.lm_head.weight is model.stack.embeddings.token.weight
    ids = torch.randint(0, config.vocab_size, (1, 5))
    before = model(ids).logits
    with torch.no_grad():
        model.lm_head.bias.fill_(0.5)
    torch.testing.assert_close(model(ids).logits, before + 0.5)


def test_new_activation_and_layout_are_validated():
    with pytest.raises(ConfigError, match="sinusoidal_layout='spiral' is not a known choice"):
        ModelConfig(sinusoidal_layout="spiral")
    assert ModelConfig(activation="silu").activation == "silu"
    x = torch.randn(4)
    torch.testing.assert_close(F.silu(x), x * torch.sigmoid(x))


def test_mlm_transform_is_dense_activation_norm_before_the_output_layer():
    model = _encoder(encoder_head="mlm", mlm_transform=True, activation="gelu_tanh", lm_head_bias=True)
    ids = torch.randint(0, 40, (2, 6))
    out = model(ids)
    transform = model.transform
    hidden = F.layer_norm(F.gelu(transform.dense(out.hidden_states), approximate="tanh"), (16,),
                          transform.norm.weight, transform.norm.bias, transform.norm.eps)
    torch.testing.assert_close(out.logits, model.lm_head(hidden))
    assert model.lm_head.weight is model.stack.embeddings.token.weight and model.lm_head.bias is not None
    with pytest.raises(ConfigError, match="mlm_transform=True applies to family='encoder' with encoder_head='mlm'"):
        ModelConfig(family="encoder", mlm_transform=True)
    with pytest.raises(ConfigError, match="not the gated swiglu"):
        ModelConfig(family="encoder", encoder_head="mlm", mlm_transform=True, activation="swiglu")
