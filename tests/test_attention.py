"""Attention: score functions, the lecture's worked example, masks, heads, the fast path, PyTorch parity."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from attention_paths import spy_on_attention
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.layers.attention import (
    AdditiveScore,
    Attention,
    BilinearScore,
    DotScore,
    attention_weights,
    make_score,
)
from attnkit.layers.kernels import MathKernel, grouped_attention, use_math_kernel
from attnkit.layers.masks import AttentionMask, as_bias
from attnkit.layers.positions import ALiBi, RelativePositions
from attnkit.machine import AttentionKernelLimits


def _qk(seed=0, batch=2, heads=3, tq=4, tk=5, dim=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, heads, tq, dim, generator=g), torch.randn(batch, heads, tk, dim, generator=g)


def test_dot_and_scaled_dot_against_float64():
    q, k = _qk()
    q64, k64 = q.double(), k.double()
    expected = torch.einsum("bhtd,bhsd->bhts", q64, k64)
    torch.testing.assert_close(make_score("dot", 8)(q, k).double(), expected, atol=1e-5, rtol=1e-5)
    scaled = make_score("scaled_dot", 8)(q, k).double()
    torch.testing.assert_close(scaled, expected / math.sqrt(8), atol=1e-5, rtol=1e-5)


def test_bilinear_against_float64():
    q, k = _qk(1)
    score = BilinearScore(8)
    w = score.weight.weight.detach().double()  # k -> W k
    expected = torch.einsum("bhtd,de,bhse->bhts", q.double(), w, k.double())
    torch.testing.assert_close(score(q, k).double(), expected, atol=1e-5, rtol=1e-5)


def test_additive_against_float64():
    q, k = _qk(2)
    score = AdditiveScore(8, 6)
    w1 = score.query_proj.weight.detach().double()
    w2, b2 = score.key_proj.weight.detach().double(), score.key_proj.bias.detach().double()
    v = score.out.weight.detach().double()[0]
    expected = torch.empty(2, 3, 4, 5, dtype=torch.float64)
    for b in range(2):
        for h in range(3):
            for i in range(4):
                for j in range(5):
                    hidden = torch.tanh(w1 @ q[b, h, i].double() + w2 @ k[b, h, j].double() + b2)
                    expected[b, h, i, j] = v @ hidden
    torch.testing.assert_close(score(q, k).double(), expected, atol=1e-5, rtol=1e-5)


def test_lecture_worked_example():
    """Keys A A B A (A=[1,0], B=[0,1]) and query B: scores [0,0,1,0]; x10 query makes weights nearly one-hot."""
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    keys = torch.stack([a, a, b, a])[None, None]  # (1, 1, 4, 2)
    query = b[None, None, None]  # (1, 1, 1, 2)
    scores = DotScore()(query, keys)
    assert scores.flatten().tolist() == [0.0, 0.0, 1.0, 0.0]
    weights = attention_weights(scores, None).flatten()
    e = math.e
    torch.testing.assert_close(weights, torch.tensor([1, 1, e, 1]) / (3 + e))
    output = weights @ keys[0, 0]  # the weighted sum of the values (= keys here)
    torch.testing.assert_close(output, torch.tensor([3 / (3 + e), e / (3 + e)]))
    sharp = attention_weights(DotScore()(10 * query, keys), None).flatten()
    torch.testing.assert_close(sharp[2], torch.tensor(math.exp(10) / (math.exp(10) + 3)))
    assert sharp[2] > 0.9998 and sharp.argmax() == 2


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(["dot", "scaled_dot", "bilinear", "additive"]),
    tq=st.integers(1, 6),
    tk=st.integers(1, 6),
)
def test_rows_sum_to_one_and_outputs_lie_in_the_hull_of_values(seed, kind, tq, tk):
    torch.manual_seed(seed)
    q, k = _qk(seed, batch=1, heads=2, tq=tq, tk=tk, dim=4)
    values = torch.randn(1, 2, tk, 4)
    weights = attention_weights(make_score(kind, 4)(q, k), None)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, tq))
    assert (weights >= 0).all()
    out = weights @ values  # (1, 2, tq, 4): convex combinations of the value rows
    low, high = values.min(dim=2, keepdim=True).values, values.max(dim=2, keepdim=True).values
    assert (out >= low - 1e-5).all() and (out <= high + 1e-5).all()


def _attention(score="scaled_dot", n_kv_heads=None, d_model=32, n_heads=4, **kw):
    torch.manual_seed(0)
    return Attention(d_model, n_heads, n_kv_heads=n_kv_heads, score=score, **kw).eval()


def test_causal_attention_leaks_nothing_from_the_future():
    attention = _attention()
    x = torch.randn(2, 7, 32)
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 3, 32)
    out, weights = attention(x, mask=AttentionMask(7, causal=True), need_weights=True)
    out2, _ = attention(changed, mask=AttentionMask(7, causal=True))
    torch.testing.assert_close(out[:, :4], out2[:, :4])
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_padded_keys_get_zero_weight_and_change_nothing():
    attention = _attention()
    x = torch.randn(2, 6, 32)
    real = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    out, weights = attention(x, mask=AttentionMask(6, attention_mask=real), need_weights=True)
    assert torch.all(weights[0, :, :, 4:] == 0)
    garbage = x.clone()
    garbage[0, 4:] = 100 * torch.randn(2, 32)
    out2, _ = attention(garbage, mask=AttentionMask(6, attention_mask=real))
    torch.testing.assert_close(out[0, :4], out2[0, :4])


def test_gqa_with_all_kv_heads_equals_mha_and_mqa_runs():
    mha = _attention(n_kv_heads=None)
    gqa = _attention(n_kv_heads=4)
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 5, 32)
    causal = AttentionMask(5, causal=True)
    torch.testing.assert_close(gqa(x, mask=causal)[0], mha(x, mask=causal)[0])
    mqa = _attention(n_kv_heads=1)
    assert mqa.k_proj.out_features == 8
    out, weights = mqa(x, mask=causal, need_weights=True)
    assert out.shape == (2, 5, 32) and weights.shape == (2, 4, 5, 5)


@settings(max_examples=10, deadline=None)
@given(n_kv_heads=st.sampled_from([1, 2, 4, 8]), causal=st.booleans(), need_weights=st.booleans(),
       seed=st.integers(0, 100))
def test_grouped_heads_equal_multi_head_attention_with_each_kv_head_repeated(n_kv_heads, causal, need_weights, seed):
    """GQA with G key/value heads is MHA whose key/value projections repeat each of those heads over its H / G query
    heads: G = H is MHA itself, G = 1 is multi-query attention (Ainslie et al. 2023, figure 2)."""
    torch.manual_seed(seed)
    grouped = Attention(32, 8, n_kv_heads=n_kv_heads).eval()
    mha = Attention(32, 8).eval()
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).load_state_dict(getattr(grouped, name).state_dict())
        for name in ("k_proj", "v_proj"):  # (Hkv * D, C) -> (H * D, C): kv head j serves query heads j*H/G ..
            for kind in ("weight", "bias"):
                rows = getattr(getattr(grouped, name), kind).unflatten(0, (n_kv_heads, 4))  # (Hkv, D, ...)
                getattr(getattr(mha, name), kind).copy_(rows.repeat_interleave(8 // n_kv_heads, dim=0).flatten(0, 1))
    x = torch.randn(2, 6, 32)
    mask = AttentionMask(6, causal=causal)
    with torch.no_grad():
        ours, theirs = grouped(x, mask=mask, need_weights=need_weights), mha(x, mask=mask, need_weights=need_weights)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-5)
    if need_weights:  # per query head, (B, H, T, S): each head's weights over its group's shared keys
        assert ours[1].shape == (2, 8, 6, 6)
        torch.testing.assert_close(ours[1], theirs[1], atol=1e-5, rtol=1e-5)
    else:
        assert ours[1] is None and theirs[1] is None
    assert grouped.k_proj.out_features == n_kv_heads * 4


@pytest.mark.parametrize(("sizes", "said"), [
    (dict(d_model=32, n_heads=0), "n_heads=0"),
    (dict(d_model=30, n_heads=4), "d_model=30"),  # head_dim 7 would have dropped 2 of 30 dimensions silently
    (dict(d_model=32, n_heads=4, window=0), "window=0"),
    (dict(d_model=32, n_heads=4, softcap=-1.0), "softcap=-1.0"),
])
def test_the_layer_refuses_sizes_that_build_no_attention_or_another_one(sizes, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        Attention(**sizes)
    assert Attention(30, 4, head_dim=8).q_proj.out_features == 32  # an explicit head_dim may differ from C / H


def test_gqa_shares_each_kv_head_with_its_group():
    """With 2 kv heads and 4 query heads, query heads 0,1 use kv head 0 and heads 2,3 kv head 1."""
    attention = _attention(n_kv_heads=2)
    with torch.no_grad():
        attention.q_proj.weight[8:16] = attention.q_proj.weight[0:8]  # query head 1 := query head 0
        attention.q_proj.bias[8:16] = attention.q_proj.bias[0:8]
    _, weights = attention(torch.randn(1, 5, 32), need_weights=True)
    torch.testing.assert_close(weights[:, 0], weights[:, 1])
    assert not torch.allclose(weights[:, 0], weights[:, 2])


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_sdpa_fast_path_equals_explicit_path(n_kv_heads):
    attention = _attention(n_kv_heads=n_kv_heads)
    x = torch.randn(3, 6, 32)
    real = torch.ones(3, 6, dtype=torch.bool)
    real[1, :2] = False  # left padding
    for mask in (None, AttentionMask(6, causal=True), AttentionMask(6, attention_mask=real),
                 AttentionMask(6, causal=True, attention_mask=real)):
        fast, none = attention(x, mask=mask)
        slow, weights = attention(x, mask=mask, need_weights=True)
        assert none is None and weights is not None
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_cross_attention_attends_to_the_context():
    attention = _attention()
    x, context = torch.randn(2, 3, 32), torch.randn(2, 7, 32)
    out, weights = attention(x, context=context, need_weights=True)
    assert out.shape == (2, 3, 32) and weights.shape == (2, 4, 3, 7)


def test_matches_torch_multihead_attention():
    attention = _attention(n_heads=4)
    reference = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(
            torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
        )
        reference.in_proj_bias.copy_(torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias]))
        reference.out_proj.weight.copy_(attention.o_proj.weight)
        reference.out_proj.bias.copy_(attention.o_proj.bias)
    x, context = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, 4:] = True  # torch: True = ignore
    expected, expected_weights = reference(x, context, context, key_padding_mask=padding, average_attn_weights=False)
    ours, weights = attention(x, context=context, mask=AttentionMask(5, attention_mask=~padding), need_weights=True)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
    future = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)  # torch: True = may not attend
    expected, _ = reference(x, x, x, attn_mask=future)
    ours, _ = attention(x, mask=AttentionMask(5, causal=True))
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("query_len", [1, 6])
def test_grouped_math_kernel_equals_fused_kernel(n_kv_heads, query_len):
    """The plain-matmul kernel (chosen for bf16 on CPU) against SDPA, with every mask kind and for gradients."""
    batch, n_heads, key_len, dim = 3, 4, 6, 8
    kv = n_kv_heads or n_heads
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, n_heads, query_len, dim, generator=g, requires_grad=True)
    k = torch.randn(batch, kv, key_len, dim, generator=g, requires_grad=True)
    v = torch.randn(batch, kv, key_len, dim, generator=g, requires_grad=True)
    real = torch.ones(batch, key_len, dtype=torch.bool)
    real[1, 1:3] = False  # key 0 stays visible so that no causal row is empty
    start = key_len - query_len  # the queries are the newest positions
    masks = [None] + [AttentionMask(query_len, start=start, **parts).allowed(key_len) for parts in (
        {"causal": True}, {"attention_mask": real}, {"causal": True, "attention_mask": real})]
    for mask in masks:
        ours = grouped_attention(q, k, v, None if mask is None else as_bias(mask))
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv != n_heads)
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
        grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
        reference_grads = torch.autograd.grad(reference.square().sum(), (q, k, v))
        for grad, reference_grad in zip(grads, reference_grads, strict=True):
            torch.testing.assert_close(grad, reference_grad, atol=1e-4, rtol=1e-4)


def test_math_kernel_covers_only_its_dtype_device_and_key_lengths():
    kernel = MathKernel("cpu", torch.bfloat16, AttentionKernelLimits(decode_keys=512, pass_keys=128))
    q = torch.zeros(2, 4, 6, 8, dtype=torch.bfloat16)
    assert kernel.covers(q, 6) and kernel.covers(q, 128) and not kernel.covers(q, 129)
    assert not kernel.covers(q.float(), 6)
    one_query = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    assert kernel.covers(one_query, 512) and not kernel.covers(one_query, 513)
    assert not MathKernel("cuda", torch.bfloat16, kernel.limits).covers(q, 6)


def test_bf16_attention_agrees_with_fp32_through_either_kernel():
    attention = _attention(n_kv_heads=2)
    x = torch.randn(2, 6, 32)
    real = torch.ones(2, 6, dtype=torch.bool)
    real[0, :3] = False
    math = MathKernel("cpu", torch.bfloat16, AttentionKernelLimits(decode_keys=512, pass_keys=128))
    for kernel in (None, math):
        for mask in (AttentionMask(6, causal=True), AttentionMask(6, causal=True, attention_mask=real)):
            full, _ = use_math_kernel(attention.float(), None)(x, mask=mask)
            half, _ = use_math_kernel(attention.to(torch.bfloat16), kernel)(x.bfloat16(), mask=mask)
            torch.testing.assert_close(half.float(), full, atol=3e-2, rtol=3e-2)
    assert attention.math_kernel is math


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_fused_qkv_projection_gives_the_same_outputs(n_kv_heads):
    attention = _attention(n_kv_heads=n_kv_heads)
    x = torch.randn(2, 6, 32)
    real = torch.ones(2, 6, dtype=torch.bool)
    real[0, :2] = False
    calls = ({"mask": AttentionMask(6, causal=True)}, {"mask": AttentionMask(6, causal=True, attention_mask=real)},
             {"need_weights": True})
    expected = [attention(x, **kwargs)[0] for kwargs in calls]
    attention.fuse_qkv()
    assert {"q_proj", "k_proj", "v_proj"}.isdisjoint(dict(attention.named_children()))
    assert attention.qkv_proj.out_features == (4 + 2 * (n_kv_heads or 4)) * 8
    for kwargs, want in zip(calls, expected, strict=True):
        torch.testing.assert_close(attention(x, **kwargs)[0], want, atol=1e-6, rtol=1e-5)


EXPLAINED = {  # rule -> (Attention keywords, the mask's keywords, forward's and kernel_path's keywords)
    "score": ({"score": "additive"}, {"causal": True}, {}),
    "weights": ({}, {"causal": True}, {"need_weights": True}),
    "value term": ({"relative": RelativePositions(4, 8)}, {"causal": True}, {}),
    "causal": ({}, {"causal": True}, {}),
    "flex": ({"relative": ALiBi(4)}, {"causal": True}, {"flex": True}),
    "soft-cap": ({"softcap": 30.0}, {"causal": True}, {}),
    "visible": ({}, {}, {}),
    "bias": ({"relative": ALiBi(4)}, {"causal": True}, {}),
}


@pytest.mark.parametrize("rule", list(EXPLAINED))
def test_every_kernel_rule_is_explained_and_is_the_kernel_forward_takes(rule, monkeypatch):
    """kernel_path names a rule, explain_kernel words it for the same kernel, and forward calls that kernel
    (FlexAttention's forward is held to the reference path in test_flex_attention)."""
    layer_keywords, mask_keywords, how = EXPLAINED[rule]
    torch.manual_seed(0)
    layer = Attention(32, 4, **layer_keywords).eval()
    mask = AttentionMask(6, **mask_keywords)
    path = layer.kernel_path(mask, 6, **how)
    kernel, why = layer.explain_kernel(mask, 6, **how)
    assert (path.rule, kernel) == (rule, path.kernel) and why and "{" not in why
    if rule != "flex":
        taken = spy_on_attention(monkeypatch)
        layer(torch.randn(2, 6, 32), mask=mask, need_weights=how.get("need_weights", False))
        assert [kernel for kernel, _ in taken] == [path.kernel]
