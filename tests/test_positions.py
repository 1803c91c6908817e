"""Positions: RoPE's relative-position property, Shaw's relative attention, sinusoidal values."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.layers.attention import Attention, DotScore
from attnkit.layers.masks import AttentionMask
from attnkit.layers.positions import (
    RelativePositions,
    RotaryEmbedding,
    SinusoidalPositions,
    apply_rotary,
)


def _rotate(x, position, rope):
    cos, sin = rope(torch.tensor([position]))
    return apply_rotary(x.view(1, 1, 1, -1), cos, sin).flatten()


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 500), seed=st.integers(0, 1000))
def test_rope_scores_depend_only_on_relative_position(m, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    rope = RotaryEmbedding(16).double()
    score = _rotate(q.float(), m, rope) @ _rotate(k.float(), n, rope)
    shifted = _rotate(q.float(), m + shift, rope) @ _rotate(k.float(), n + shift, rope)
    torch.testing.assert_close(score, shifted, atol=1e-3, rtol=1e-4)


@settings(max_examples=30, deadline=None)
@given(position=st.integers(0, 4096), seed=st.integers(0, 1000))
def test_rope_preserves_norms(position, seed):
    x = torch.randn(32, generator=torch.Generator().manual_seed(seed))
    rotated = _rotate(x, position, RotaryEmbedding(32, theta=500000.0))
    torch.testing.assert_close(rotated.norm(), x.norm())


def test_rope_at_position_zero_is_identity_and_differs_elsewhere():
    x = torch.randn(8)
    rope = RotaryEmbedding(8)
    torch.testing.assert_close(_rotate(x, 0, rope), x)
    assert not torch.allclose(_rotate(x, 3, rope), x)


def _lecture_rope(x: torch.Tensor, m: int, theta: float = 10000.0) -> torch.Tensor:
    """The lecture's R_{Theta,m} x: consecutive pairs (x_{2i-1}, x_{2i}) turned by m theta_i, theta_i =
    theta^(-2(i-1)/d): x * cos + (-x_2, x_1, -x_4, x_3, ..) * sin (Su et al. 2021, equation 34)."""
    d = x.shape[-1]
    angles = m * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    cos, sin = angles.cos().repeat_interleave(2), angles.sin().repeat_interleave(2)  # (d,)
    swapped = torch.stack((-x[1::2], x[0::2]), dim=-1).flatten()  # (-x2, x1, -x4, x3, ...)
    return x * cos + swapped * sin


@settings(max_examples=20, deadline=None)
@given(m=st.integers(0, 300), dim=st.sampled_from([2, 8, 16]), seed=st.integers(0, 1000))
def test_rope_is_the_lectures_rotation_with_its_pairs_laid_out_in_halves(m, dim, seed):
    """attnkit pairs dimension i with i + D/2 (the layout of Hugging Face's Llama checkpoints), the lecture pairs
    2i with 2i + 1: the same rotation once the dimensions are reordered (0, D/2, 1, D/2 + 1, ...)."""
    x = torch.randn(dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    interleaved = torch.stack((torch.arange(dim // 2), torch.arange(dim // 2, dim)), dim=-1).flatten()
    ours = _rotate(x, m, RotaryEmbedding(dim).double())
    torch.testing.assert_close(ours[interleaved], _lecture_rope(x[interleaved], m), atol=1e-5, rtol=1e-5)


@settings(max_examples=10, deadline=None)
@given(k=st.integers(1, 40), layout=st.sampled_from(["interleaved", "halves"]))
def test_sinusoidal_encoding_at_pos_plus_k_is_a_linear_function_of_pos(k, layout):
    """The lecture's motivation for sinusoids: PE(pos + k) = M_k PE(pos) for one matrix M_k and every pos. M_k is
    fitted on every third position up to 3000 (long enough for the slowest frequency to turn) and must map the
    positions in between as well."""
    encode = SinusoidalPositions(8, layout=layout).double()
    pe = encode(torch.arange(3000 + k)[None])[0]  # (3000 + k, C)
    seen, unseen = torch.arange(0, 3000, 3), torch.arange(1, 3000, 3)
    shift = torch.linalg.lstsq(pe[seen], pe[seen + k]).solution  # (C, C): PE(pos) @ shift = PE(pos + k)
    torch.testing.assert_close(pe[unseen] @ shift, pe[unseen + k], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(pe[unseen], pe[unseen + k], atol=1e-2)  # the shift is no identity


def test_sinusoidal_matches_the_paper_formula():
    d_model = 16
    pe = SinusoidalPositions(d_model)(torch.arange(50)[None])[0]
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-5)
            assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-5)


def test_relative_attention_with_zero_embeddings_equals_plain_attention():
    torch.manual_seed(0)
    plain = Attention(32, 4)
    relative = Attention(32, 4, relative=RelativePositions(3, 8))
    relative.load_state_dict(plain.state_dict(), strict=False)  # relative tables start at zero
    x = torch.randn(2, 6, 32)
    causal = AttentionMask(6, causal=True)
    torch.testing.assert_close(relative(x, mask=causal)[0], plain(x, mask=causal)[0], atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        relative.relative.key.normal_()
    assert not torch.allclose(relative(x, mask=causal)[0], plain(x, mask=causal)[0])


@pytest.mark.parametrize("start", [0, 5])
def test_relative_distances_beyond_the_clip_share_one_embedding(start):
    """Shaw's a^K_ij and a^V_ij, as the score bias and the value term read them, are the rows of the clipped distance
    j - i: row 0 for j - i <= -2, row 4 for j - i >= 2 (k = 2), for queries at any offset of the keys."""
    table = RelativePositions(2, 4)
    with torch.no_grad():
        table.key.copy_(torch.arange(5.0)[:, None].expand(5, 4))  # row r holds r in every dimension
        table.value.copy_(10 * torch.arange(5.0)[:, None].expand(5, 4))
    mask, key_len = AttentionMask(3, start=start), start + 3
    q = torch.ones(1, 1, 3, 4)  # a dot score of 1 . a^K_ij = 4 * row
    row_k = table.score_bias(q, mask, key_len, DotScore(1.0))[0, 0] / 4  # (T, S)
    weights = torch.eye(key_len)[start:][None, None]  # each query's weight on one key at a time: its own
    row_v = table.value_term(torch.ones(1, 1, 3, key_len), mask, key_len)[0, 0, :, 0] / 10  # sum over keys
    distance = torch.arange(key_len)[None, :] - torch.arange(start, start + 3)[:, None]  # (T, S)
    assert torch.equal(row_k, (distance.clamp(-2, 2) + 2).float())
    assert torch.equal(row_v, (distance.clamp(-2, 2) + 2).float().sum(dim=1))
    assert torch.equal(table.value_term(weights, mask, key_len)[0, 0, :, 0] / 10, torch.full((3,), 2.0))


def test_relative_attention_is_shift_invariant_without_absolute_positions():
    """Shaw attention sees only distances: the same window at another offset of the cache gives the same output."""
    torch.manual_seed(1)
    attention = Attention(16, 2, relative=RelativePositions(4, 8))
    with torch.no_grad():
        attention.relative.key.normal_()
        attention.relative.value.normal_()
    x = torch.randn(1, 5, 16)
    out, _ = attention(x)
    padded = torch.cat([torch.randn(1, 3, 16), x], dim=1)
    real = torch.tensor([[False] * 3 + [True] * 5])
    out_padded, _ = attention(padded, mask=AttentionMask(8, attention_mask=real))
    torch.testing.assert_close(out_padded[:, 3:], out, atol=1e-5, rtol=1e-5)
