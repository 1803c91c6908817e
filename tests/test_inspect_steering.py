"""Activation addition (`inspect/steering.py`): adding the unembedding row of a token raises that token's logit by
exactly coeff * W_U u; KV-cached decoding under steering equals the uncached steered forward, a position steered once;
coefficient 0 and a finished context leave the logits to the bit; bad inputs are refused by name. The equality with
TransformerLens's run_with_hooks is in test_inspect_steering_transformer_lens.py."""

import pytest
import torch
from torch import nn

from attnkit.config import ModelConfig
from attnkit.errors import InputError
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.static_decode import StaticDecoding
from attnkit.inspect import trace
from attnkit.inspect.sae import SAEConfig, SparseAutoencoder
from attnkit.inspect.steering import contrast_vector, feature_direction, probe_direction, steering
from attnkit.models import build_model

PROMPT = torch.tensor([[3, 17, 5, 22, 9]])


def _model(**fields):
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=40, d_model=16, n_heads=4, d_ff=32, max_seq_len=32, n_layers=2,
                         **fields)
    return build_model(config).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits  # (B, T, V)


def test_adding_a_tokens_unembedding_raises_its_logit_by_the_predicted_amount():
    """Without a final norm the logits are linear in the last stream: W_U (x + c u) = W_U x + c W_U u."""
    model = _model(final_norm=False)
    token, coeff = 7, 3.0
    u = model.lm_head.weight[token].detach()  # (C,): the token's unembedding direction
    plain = _logits(model, PROMPT)
    with steering(model, "blocks.1.resid_post", u, coeff=coeff):
        steered = _logits(model, PROMPT)
    predicted = coeff * (model.lm_head.weight.detach() @ u)  # (V,)
    torch.testing.assert_close(steered - plain, predicted.expand_as(plain), rtol=1e-5, atol=1e-5)
    assert bool((steered[0, :, token] > plain[0, :, token]).all())
    with steering(model, "blocks.1.resid_post", u, coeff=40.0):  # far enough: the token becomes the likeliest
        assert bool((_logits(model, PROMPT)[0].argmax(-1) == token).all())


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_cached_steered_decoding_equals_the_uncached_steered_forward(position):
    """A (3, C) vector from position 4 spans the prompt's last position and the first two generated ones: each is
    steered once, when first computed, and the cached keys and values carry it on."""
    model = _model(position=position)
    generator = torch.Generator().manual_seed(1)
    vector = torch.randn(3, 16, generator=generator)
    with steering(model, "blocks.1.resid_pre", vector, coeff=4.0, start=4):
        tokens = generate_tokens(model, PROMPT.tolist(), max_new_tokens=6, context_len=32)[0]
        whole = torch.cat([PROMPT, torch.tensor([tokens])], dim=1)  # (1, 11)
        full = _logits(model, whole)  # one uncached forward over everything
        cache = model.allocate_cache(1, whole.shape[1])
        with torch.no_grad():
            stepped = [model(PROMPT, cache=cache).logits]
            stepped += [model(whole[:, t:t + 1], cache=cache).logits for t in range(PROMPT.shape[1], whole.shape[1])]
    torch.testing.assert_close(torch.cat(stepped, dim=1), full, rtol=1e-5, atol=1e-5)
    assert full[0, PROMPT.shape[1] - 1:-1].argmax(-1).tolist() == tokens  # greedy: each token the steered argmax
    unsteered = generate_tokens(model, PROMPT.tolist(), max_new_tokens=6, context_len=32)[0]
    assert tokens != unsteered  # the steering changed the text (and is gone after the context)


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_a_prompt_is_steered_alike_alone_and_in_a_left_padded_batch(position):
    """Positions are each row's own (its position_ids): a (3, C) vector from 0 lands on every prompt's first three
    tokens, not on a shorter prompt's padding."""
    model = _model(position=position)
    vector = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    prompts = [PROMPT[0].tolist(), [11, 4], [30, 2, 8, 6]]
    with steering(model, "blocks.0.resid_pre", vector, coeff=6.0):
        batched = generate_tokens(model, prompts, max_new_tokens=6, context_len=32)
        alone = [generate_tokens(model, [p], max_new_tokens=6, context_len=32)[0] for p in prompts]
    assert batched == alone
    assert alone != [generate_tokens(model, [p], max_new_tokens=6, context_len=32)[0] for p in prompts]


@pytest.mark.parametrize("vector_rows", [None, 3])
def test_a_static_cache_decodes_as_the_eager_cache_under_steering(vector_rows):
    """StaticDecoding's eager step (a StaticKVCache counts the position it writes as cached before the step runs)
    writes the steered text EagerDecoding writes."""
    model = _model()
    shape = (16,) if vector_rows is None else (vector_rows, 16)
    vector = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    with steering(model, "blocks.1.resid_pre", vector, coeff=5.0, start=4):
        eager = generate_tokens(model, PROMPT.tolist(), max_new_tokens=6, context_len=32)
        static = generate_tokens(model, PROMPT.tolist(), max_new_tokens=6, context_len=32,
                                 decoding=StaticDecoding(model, compile=False))
    assert static == eager
    assert eager != generate_tokens(model, PROMPT.tolist(), max_new_tokens=6, context_len=32)


def test_a_sliding_window_cache_counts_absolute_positions():
    """A rolling cache keeps `window` positions; steering from position 6 on still starts at position 6."""
    model = _model(attention_window=4)
    vector = torch.randn(16, generator=torch.Generator().manual_seed(4))
    with steering(model, "blocks.1.resid_pre", vector, coeff=5.0, start=6):
        tokens = generate_tokens(model, PROMPT.tolist(), max_new_tokens=8, context_len=32)[0]
        full = _logits(model, torch.cat([PROMPT, torch.tensor([tokens])], dim=1))
    assert full[0, PROMPT.shape[1] - 1:-1].argmax(-1).tolist() == tokens


def test_nested_contexts_add_and_an_error_inside_leaves_nothing_attached():
    model = _model(final_norm=False)
    u, w = (model.lm_head.weight[t].detach() for t in (7, 9))  # (C,) each
    plain = _logits(model, PROMPT)
    with steering(model, "blocks.1.resid_post", u, coeff=2.0), steering(model, "blocks.1.resid_post", w, coeff=-1.0):
        both = _logits(model, PROMPT)
    predicted = model.lm_head.weight.detach() @ (2.0 * u - w)  # (V,)
    torch.testing.assert_close(both - plain, predicted.expand_as(plain), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="inside"), steering(model, "blocks.0.resid_pre", u, coeff=3.0):
        raise RuntimeError("an error inside the with")
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    assert torch.equal(_logits(model, PROMPT), plain)


def test_coefficient_zero_and_a_finished_context_leave_the_logits_exact():
    model = _model()
    plain = _logits(model, PROMPT)
    vector = torch.randn(16)
    with steering(model, "blocks.0.resid_pre", vector, coeff=0.0):
        assert torch.equal(_logits(model, PROMPT), plain)
    with steering(model, "blocks.0.resid_pre", vector, coeff=2.0):
        assert not torch.equal(_logits(model, PROMPT), plain)
    assert torch.equal(_logits(model, PROMPT), plain)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())  # nothing left attached


def test_a_vector_from_position_on_leaves_the_positions_before_it():
    model = _model()
    plain = _logits(model, PROMPT)
    with steering(model, "blocks.1.resid_pre", torch.randn(16), coeff=5.0, start=3):
        steered = _logits(model, PROMPT)
    assert torch.equal(steered[:, :3], plain[:, :3])  # a causal model: nothing before position 3 moves
    assert not torch.allclose(steered[:, 3:], plain[:, 3:])


def test_the_contrast_vector_is_the_difference_of_the_points_activations():
    model = _model()
    positive, negative = torch.tensor([4, 8, 15]), torch.tensor([16, 23, 8])
    point = "blocks.1.resid_pre"
    read = [trace(model, ids[None], names=[point])[point][0] for ids in (positive, negative)]  # (T, C) each
    torch.testing.assert_close(contrast_vector(model, point, positive, negative), read[0] - read[1])
    torch.testing.assert_close(contrast_vector(model, point, positive, negative[:2], aligned=False),
                               read[0].mean(0) - trace(model, negative[None, :2], names=[point])[point][0].mean(0))


def test_a_probe_direction_is_its_unit_row_difference_and_a_feature_direction_its_decoder_row():
    probe = nn.Linear(16, 3)
    direction = probe_direction(probe, toward=2, against=0)
    expected = (probe.weight[2] - probe.weight[0]).detach()
    torch.testing.assert_close(direction, expected / expected.norm())
    x = torch.randn(16)  # adding c * the direction moves the probe's margin of 2 over 0 by c * |W2 - W0|
    with torch.no_grad():
        margin = probe(x + 2.0 * direction) - probe(x)
    assert float(margin[2] - margin[0]) == pytest.approx(2.0 * float(expected.norm()), rel=1e-5)
    sae = SparseAutoencoder(SAEConfig(d_in=16, d_sae=32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(feature_direction(sae, 5), sae.W_dec[5].detach())


def _steered_run(model, point, vector):
    with steering(model, point, vector):
        model(PROMPT)


@pytest.mark.parametrize(("call", "says"), [
    (lambda m: steering(m, "blocks.2.resid_pre", torch.randn(16)).__enter__(), "no hook point 'blocks.2.resid_pre'"),
    (lambda m: contrast_vector(m, "blocks.0.resid_pre", torch.tensor([1, 2, 3]), torch.tensor([4, 5])),
     "pad the shorter prompt"),
    (lambda m: contrast_vector(m, "blocks.0.resid_pre", torch.tensor([], dtype=torch.long), torch.tensor([4])),
     "has no tokens"),
    (lambda m: _steered_run(m, "blocks.0.resid_pre", torch.randn(8)), "width 16"),
    (lambda m: _steered_run(m, "blocks.0.attn.z", torch.randn(4)), "steer a \\(B, T, C\\) point"),
    (lambda m: steering(m, "embed", torch.randn(16)).__enter__(), "not inside a block"),
    (lambda m: steering(m, "blocks.0.resid_pre", torch.randn(16), coeff=float("nan")).__enter__(), "finite"),
    (lambda m: steering(m, "blocks.0.resid_pre", torch.randn(16), start=-1).__enter__(), "start=-1"),
    (lambda m: probe_direction(nn.Linear(16, 2), toward=2), "toward=2 is no class"),
])
def test_bad_input_is_refused_by_name(call, says):
    with pytest.raises(InputError, match=says):
        call(_model())
