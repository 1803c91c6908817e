"""ALiBi (Press et al. 2022): the paper's slopes and BLOOM's bias in `transformers`, a whole BLOOM forward on the
same weights, sequences past the training length, the fused path with a float bias, the KV cache."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BloomConfig, BloomForCausalLM
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from attnkit import InputError, ModelConfig, build_model
from attnkit.layers import kernels
from attnkit.layers.attention import Attention
from attnkit.layers.masks import AttentionMask
from attnkit.layers.positions import ALiBi, alibi_slopes


@pytest.mark.parametrize("n_heads", [1, 2, 4, 5, 6, 8, 12, 16, 20])
def test_bias_matches_bloom_for_every_head_count(n_heads):
    """BLOOM adds m_h * j; ALiBi's -m_h * (i - j) differs from it by a constant per row (-m_h * i), which the
    softmax ignores: so each row, less its value at the diagonal, equals BLOOM's, row by row."""
    length = 9
    bloom = build_alibi_tensor(torch.ones(1, length), n_heads, torch.float32).view(n_heads, length)  # (H, S)
    ours = ALiBi(n_heads).score_bias(torch.zeros(1), AttentionMask(length), length, score=None)  # (H, T, S)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for i in range(length):
        expected = bloom - bloom[:, i : i + 1]  # (H, S)
        got = ours[:, i] - ours[:, i, i : i + 1]
        torch.testing.assert_close(got[:, causal[i]], expected[:, causal[i]])
    torch.testing.assert_close(alibi_slopes(n_heads), bloom[:, 1])


@settings(max_examples=15, deadline=None)
@given(n_heads=st.integers(1, 12), start=st.integers(0, 50), length=st.integers(1, 6), extra=st.integers(0, 6),
       causal=st.booleans())
def test_bias_is_linear_in_distance_with_one_slope_per_head(n_heads, start, length, extra, causal):
    """Every head's bias is -m_h |i - j|: 0 on the diagonal, falling by m_h per position of distance whichever side
    the key is on, the same at any absolute position (queries at start .. start + T - 1, keys 0 .. S - 1)."""
    key_len = start + length + (0 if causal else extra)
    mask = AttentionMask(length, start=start, causal=causal)
    bias = ALiBi(n_heads).score_bias(torch.zeros(1, n_heads, length, 4), mask, key_len, None)  # (H, T, S)
    distance = (torch.arange(start, start + length)[:, None] - torch.arange(key_len)[None, :]).abs()  # (T, S)
    slopes = alibi_slopes(n_heads)
    for head in range(n_heads):
        torch.testing.assert_close(bias[head], -slopes[head] * distance.float())
    if key_len > 1:  # one step further away costs m_h, wherever the step is taken
        steps = bias[:, :, :-1] - bias[:, :, 1:]  # (H, T, S - 1)
        torch.testing.assert_close(steps.abs(), slopes[:, None, None].expand_as(steps))


def test_slopes_are_the_papers():
    """8 heads: 1/2, 1/4, ..., 1/256; 12 heads: the 8-head slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5."""
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    extra = torch.tensor([2.0 ** -(k + 0.5) for k in range(4)])
    torch.testing.assert_close(alibi_slopes(12), torch.cat([alibi_slopes(8), extra]))


def _bloom_pair(n_heads: int = 6, hidden: int = 48):
    """A tiny random BLOOM and an attnkit decoder with ALiBi holding the same weights."""
    torch.manual_seed(0)
    reference = BloomForCausalLM(BloomConfig(vocab_size=50, hidden_size=hidden, n_layer=2, n_head=n_heads,
                                             layer_norm_epsilon=1e-5)).eval()
    with torch.no_grad():
        for parameter in reference.parameters():  # norms and biases away from 1 and 0 as well
            parameter.add_(0.05 * torch.randn_like(parameter))
    config = ModelConfig(family="decoder", vocab_size=50, d_model=hidden, n_layers=2, n_heads=n_heads,
                         d_ff=4 * hidden, position="alibi", activation="gelu_tanh", embedding_norm=True,
                         norm_eps=1e-5, max_seq_len=16)
    model = build_model(config).eval()
    head_dim = hidden // n_heads
    source = reference.state_dict()
    mapped = {
        "stack.embeddings.token.weight": source["transformer.word_embeddings.weight"],
        "stack.embeddings.norm.weight": source["transformer.word_embeddings_layernorm.weight"],
        "stack.embeddings.norm.bias": source["transformer.word_embeddings_layernorm.bias"],
        "stack.final_norm.weight": source["transformer.ln_f.weight"],
        "stack.final_norm.bias": source["transformer.ln_f.bias"],
    }
    for i in range(2):
        ours, theirs = f"stack.blocks.{i}.", f"transformer.h.{i}."
        for our_name, their_name in (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"),
                                     ("self_attn.o_proj", "self_attention.dense"),
                                     ("mlp.up_proj", "mlp.dense_h_to_4h"), ("mlp.down_proj", "mlp.dense_4h_to_h")):
            for kind in ("weight", "bias"):
                mapped[f"{ours}{our_name}.{kind}"] = source[f"{theirs}{their_name}.{kind}"]
        # BLOOM's fused query_key_value is laid out head by head: (H, 3, D) rows of q, k, v
        weight = source[f"{theirs}self_attention.query_key_value.weight"].view(n_heads, 3, head_dim, hidden)
        bias = source[f"{theirs}self_attention.query_key_value.bias"].view(n_heads, 3, head_dim)
        for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
            mapped[f"{ours}self_attn.{name}.weight"] = weight[:, index].reshape(hidden, hidden)
            mapped[f"{ours}self_attn.{name}.bias"] = bias[:, index].reshape(hidden)
    loaded = model.load_state_dict(mapped, strict=False)
    assert not loaded.unexpected_keys and set(loaded.missing_keys) <= {"lm_head.weight"}  # tied to the token table
    return reference, model


@pytest.mark.parametrize("n_heads", [4, 6])
def test_whole_model_matches_bloom_on_the_same_weights(n_heads):
    reference, model = _bloom_pair(n_heads=n_heads)
    ids = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0  # left padding: BLOOM counts positions over real tokens, ALiBi needs only their distances
    with torch.no_grad():
        expected = reference(ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1, 4:], expected[1, 4:], atol=1e-5, rtol=1e-4)


@pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")  # transformers 5 renames it `cache`
def test_cached_decoding_steps_match_bloom_cached_steps():
    """A prefill, then one token at a time through both caches: each step's logits equal BLOOM's."""
    reference, model = _bloom_pair(n_heads=4)
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    cache = model.allocate_cache(2, 10)
    with torch.no_grad():
        theirs = reference(ids[:, :3], use_cache=True)
        torch.testing.assert_close(model(ids[:, :3], cache=cache).logits, theirs.logits, atol=1e-5, rtol=1e-4)
        for t in range(3, 10):
            theirs = reference(ids[:, t : t + 1], past_key_values=theirs.past_key_values, use_cache=True)
            got = model(ids[:, t : t + 1], cache=cache).logits
            torch.testing.assert_close(got, theirs.logits, atol=1e-5, rtol=1e-4)


def _model(**overrides):
    settings = dict(family="decoder", vocab_size=17, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=8,
                    position="alibi")
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**settings, **overrides}))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
    return model.double().eval()


def test_runs_past_the_training_length_where_learned_positions_cannot():
    ids = torch.randint(0, 17, (1, 40), generator=torch.Generator().manual_seed(2))  # 5x max_seq_len
    logits = _model()(ids).logits
    assert logits.shape == (1, 40, 17) and torch.isfinite(logits).all()
    with pytest.raises(InputError, match="max_seq_len=8"):
        _model(position="learned")(ids)


def test_a_token_far_back_weighs_less_than_the_same_token_nearby():
    """ALiBi's inductive bias: with equal keys, attention falls off with distance, more steeply for larger slopes."""
    attention = Attention(8, 2, relative=ALiBi(2)).double()
    x = torch.ones(1, 30, 8, dtype=torch.float64)
    _, weights = attention(x, mask=AttentionMask(30, causal=True), need_weights=True)  # (1, H, T, S), keys alike
    last = weights[0, :, -1]  # (H, S): the last query's weights
    assert torch.all(last[:, 1:] > last[:, :-1])  # nearer keys weigh more
    assert last[1, -1] < last[0, -1]  # head 1's slope (1/16) is gentler than head 0's (1/4)


def test_kv_cache_decoding_equals_the_full_forward_past_the_training_length():
    model = _model(n_kv_heads=2)
    ids = torch.randint(0, 17, (2, 20), generator=torch.Generator().manual_seed(3))
    full = model(ids).logits  # (B, T, V)
    cache = model.allocate_cache(2, 20)
    steps = [model(ids[:, :5], cache=cache).logits]
    steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=1e-10)


def test_fused_path_takes_sdpa_with_a_float_bias_and_equals_the_reference(monkeypatch):
    attention = Attention(32, 4, n_kv_heads=2, relative=ALiBi(4)).eval()
    x = torch.randn(2, 7, 32)
    real = torch.ones(2, 7, dtype=torch.bool)
    real[0, :2] = False
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs["attn_mask"])
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", recording)
    for mask in (AttentionMask(7, causal=True), AttentionMask(7, causal=True, attention_mask=real), AttentionMask(7)):
        calls.clear()
        fast, _ = attention(x, mask=mask)
        assert len(calls) == 1 and calls[0].is_floating_point() and calls[0].shape[-3:] == (4, 7, 7)
        reference, _ = attention(x, mask=mask, need_weights=True)
        torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)
