"""The position slot: every score function composes with every position scheme, the fused path equals the
reference path, weights are distributions that never look ahead, and schemes own their initialisation and decay."""

from typing import get_args

import pytest
import torch

from attnkit import ModelConfig, build_model
from attnkit.config import Position, Score
from attnkit.layers.attention import Attention
from attnkit.layers.masks import AttentionMask
from attnkit.layers.positions import LearnedPositions, PositionScheme, RelativePositions
from attnkit.train.optim import param_groups

SCHEMES = get_args(Position)
SCORES = get_args(Score)


def _model(score: str, position: str, family: str = "decoder"):
    config = ModelConfig(family=family, vocab_size=17, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32,
                         max_seq_len=12, score=score, position=position, relative_max_distance=3)
    torch.manual_seed(0)
    model = build_model(config)
    with torch.no_grad():  # large weights, so that every position term moves the output
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
    return model.double().eval()


@pytest.mark.parametrize("position", SCHEMES)
@pytest.mark.parametrize("score", SCORES)
def test_every_score_with_every_position_scheme_matches_the_reference_path(score, position):
    model = _model(score, position)
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    real = torch.ones(2, 9, dtype=torch.bool)
    real[0, :3] = False  # left padding
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    assert attentions and all((a.relative is not None) == (position in ("rope", "relative", "alibi"))
                              for a in attentions)
    for attention in attentions:
        for mask in (AttentionMask(9, causal=True), AttentionMask(9, causal=True, attention_mask=real),
                     AttentionMask(9)):
            fast, none = attention(x, mask=mask)
            reference, weights = attention(x, mask=mask, need_weights=True)
            assert none is None
            torch.testing.assert_close(fast, reference, atol=1e-10, rtol=1e-10)
            torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]))
            if mask.causal:
                future = torch.ones(9, 9, dtype=torch.bool).triu(1)
                assert torch.all(weights[..., future] == 0)
            if mask.attention_mask is not None:
                assert torch.all(weights[1:][..., ~real[1]] == 0) and torch.all(weights[0, :, 3:, :3] == 0)


@pytest.mark.parametrize("position", SCHEMES)
@pytest.mark.parametrize("score", SCORES)
def test_no_position_scheme_lets_a_token_see_the_future(score, position):
    model = _model(score, position)
    ids = torch.randint(0, 17, (2, 10), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 17
    before, after = model(ids).logits, model(changed).logits
    torch.testing.assert_close(after[:, :6], before[:, :6], atol=0, rtol=0)
    assert not torch.allclose(after[:, 6:], before[:, 6:])


@pytest.mark.parametrize("position", SCHEMES)
def test_relative_schemes_see_only_differences_of_positions(position):
    """Shifting every position by the same amount changes nothing for relative schemes (and none); it changes the
    output of absolute ones."""
    model = _model("scaled_dot", position, family="encoder")
    ids = torch.randint(0, 17, (2, 5), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(5)[None]
    plain, _ = model.stack(ids, position_ids=positions)
    shifted, _ = model.stack(ids, position_ids=positions + 4)
    if position in ("sinusoidal", "learned"):
        assert not torch.allclose(shifted, plain)
    else:
        torch.testing.assert_close(shifted, plain, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("position", SCHEMES)
@pytest.mark.parametrize("family", ["encoder", "encoder-decoder"])
def test_every_scheme_builds_and_runs_in_every_family(family, position):
    model = _model("scaled_dot", position, family=family)
    ids = torch.randint(0, 17, (2, 6), generator=torch.Generator().manual_seed(4))
    logits = model(ids).logits if family == "encoder" else model(ids, ids[:, :4]).logits
    assert torch.isfinite(logits).all()


def _reference_shaw(attention: Attention, x: torch.Tensor) -> torch.Tensor:
    """Shaw's attention written out per query and key in float64, as `RelativePositions` documents it for each score:
    e_ij = score(q_i, k_j + a^K_ij) for dot and bilinear, score(q_i, k_j) + score(q_i, a^K_ij) for additive."""
    table = attention.relative
    length, heads, dim = x.shape[1], attention.n_heads, attention.head_dim
    q = attention.q_proj(x)[0].view(length, heads, dim)
    k = attention.k_proj(x)[0].view(length, heads, dim)
    v = attention.v_proj(x)[0].view(length, heads, dim)
    out = torch.zeros(length, heads, dim, dtype=x.dtype)
    for h in range(heads):
        for i in range(length):
            scores, rel_v = [], []
            for j in range(length):
                index = max(-table.max_distance, min(table.max_distance, j - i)) + table.max_distance
                a_k, a_v = table.key[index], table.value[index]
                if attention.score_kind == "additive":
                    s = attention.score
                    e = (s.out(torch.tanh(s.query_proj(q[i, h]) + s.key_proj(k[j, h])))
                         + s.out(torch.tanh(s.query_proj(q[i, h]) + s.key_proj(a_k))))[0]
                elif attention.score_kind == "bilinear":
                    e = q[i, h] @ attention.score.weight(k[j, h] + a_k)
                else:
                    e = q[i, h] @ (k[j, h] + a_k) * attention.score.scale
                scores.append(e)
                rel_v.append(v[j, h] + a_v)
            alpha = torch.softmax(torch.stack(scores), dim=0)
            out[i, h] = (alpha[:, None] * torch.stack(rel_v)).sum(0)
    return attention.o_proj(out.reshape(1, length, heads * dim))


@pytest.mark.parametrize("score", SCORES)
def test_shaw_terms_for_every_score_match_the_written_out_formula(score):
    torch.manual_seed(5)
    attention = Attention(16, 2, score=score, relative=RelativePositions(2, 8)).double()
    with torch.no_grad():
        attention.relative.key.normal_()
        attention.relative.value.normal_()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(attention(x)[0], _reference_shaw(attention, x), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("position", SCHEMES)
def test_position_parameters_come_initialised_from_their_scheme_and_take_no_weight_decay(position):
    model = build_model(ModelConfig(vocab_size=17, d_model=16, n_layers=2, n_heads=4, d_ff=32, max_seq_len=12,
                                    position=position))
    schemes = [m for m in model.modules() if isinstance(m, PositionScheme)]
    assert schemes or position == "none"
    decay, plain = param_groups(model, weight_decay=0.1)
    decayed = {id(p) for p in decay["params"]}
    for scheme in schemes:
        for parameter in scheme.parameters():
            assert id(parameter) not in decayed and any(parameter is p for p in plain["params"])
            assert 0.01 < parameter.std().item() < 0.03  # init_weights ran: N(0, 0.02), not the zeros of __init__


def test_a_scheme_that_asks_for_weight_decay_gets_it():
    """The optimizer reads the scheme's own answer, not a list of classes."""

    class DecayedTable(LearnedPositions):
        weight_decay = True

    model = build_model(ModelConfig(vocab_size=17, d_model=16, n_layers=1, n_heads=4, d_ff=32, max_seq_len=12))
    model.stack.embeddings.positions = DecayedTable(12, 16)
    decay, plain = param_groups(model, weight_decay=0.1)
    assert "stack.embeddings.positions.weight" in decay["names"]
    assert "stack.embeddings.positions.weight" not in plain["names"]


@pytest.mark.parametrize("position", ["alibi", "relative", "rope"])
def test_bf16_on_cpu_takes_the_math_kernel_with_position_biases_and_agrees_with_float64(position):
    """The float32 math kernel folds grouped query heads into rows; a bias per head (ALiBi) must fold the same way."""
    model = _model("scaled_dot", position)
    attention = next(m for m in model.modules() if isinstance(m, Attention))
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    real = torch.ones(2, 9, dtype=torch.bool)
    real[0, :3] = False
    for mask in (AttentionMask(9, causal=True), AttentionMask(9, causal=True, attention_mask=real)):
        exact, _ = attention(x, mask=mask)
        half, _ = attention.to(torch.bfloat16)(x.bfloat16(), mask=mask)
        attention.double()
        torch.testing.assert_close(half.double(), exact, atol=0.1, rtol=0.05)
