"""The attention mask as one object per forward pass: each part (causal, prefix, window, padding) against a
brute-force definition, one object built per forward and handed to every layer, tensor forms built once and none
for a plain causal pass, prefix-LM masks (the prompt read both ways, cached equal to uncached), and the old
keywords still accepted with a warning."""

import pytest
import torch
from generate_models import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.errors import InputError
from attnkit.layers import masks
from attnkit.layers.attention import Attention
from attnkit.layers.masks import AttentionMask


def _expected(query: int, key: int, row: int, *, causal, window, prefix, real) -> bool:
    """Whether `query` may see `key` in batch row `row`, from the parts' definitions one pair at a time."""
    seen = True
    if causal:
        both_in_prefix = prefix is not None and query < prefix[row] and key < prefix[row]
        seen = key <= query or both_in_prefix
    if window is not None:
        seen = seen and abs(query - key) < window
    if real is not None:
        seen = seen and bool(real[row, key])
    return seen


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 7), start=st.integers(0, 5), causal=st.booleans(),
       window=st.one_of(st.none(), st.integers(1, 8)), prefix=st.one_of(st.none(), st.lists(st.integers(0, 12),
                                                                                              min_size=2, max_size=2)),
       padded=st.integers(0, 3), data=st.data())
def test_each_part_of_the_mask_matches_its_definition(length, start, causal, window, prefix, padded, data):
    keys = start + length
    real = torch.ones(2, keys, dtype=torch.bool)
    real[1, : min(padded, keys - 1)] = False  # left padding in row 1
    prefix_len = torch.tensor(prefix) if prefix is not None and causal else None
    shuffled = data.draw(st.booleans())  # keys out of order, as a rolling cache returns them
    key_positions = torch.randperm(keys, generator=torch.Generator().manual_seed(keys)) if shuffled else None
    mask = AttentionMask(length, start=start, causal=causal, attention_mask=real, prefix_len=prefix_len)
    allowed = mask.allowed(keys, window=window, key_positions=key_positions).expand(2, 1, length, keys)
    order = key_positions.tolist() if shuffled else list(range(keys))
    expected = torch.zeros(2, 1, length, keys, dtype=torch.bool)  # the brute-force grid
    for row in range(2):
        for t in range(length):
            for s, key in enumerate(order):
                want = _expected(start + t, key, row, causal=causal, window=window,
                                 prefix=prefix if causal else None, real=real)
                if length > 1 and key == start + t and (causal or window is not None):
                    want = want or not bool(real[row, key])  # a padded query row still sees itself
                expected[row, 0, t, s] = want
    assert torch.equal(allowed, expected)
    bias = mask.bias(keys, window=window, key_positions=key_positions).expand(2, 1, length, keys)
    assert torch.equal(bias == 0, expected) and torch.equal(bias.isneginf(), ~expected)


def test_a_plain_causal_square_or_single_newest_query_needs_no_tensor():
    assert AttentionMask(5, causal=True).is_causal_only(5)
    assert AttentionMask(1, start=9, causal=True).is_causal_only(10)
    assert AttentionMask(1, start=9, causal=True).is_causal_only(4, window=4)  # a rolling cache holds the window
    assert not AttentionMask(5, causal=True).is_causal_only(5, window=3)  # the window hides keys
    assert not AttentionMask(3, start=2, causal=True).is_causal_only(5)  # several queries after cached keys
    assert not AttentionMask(5, causal=True, attention_mask=torch.ones(1, 5, dtype=torch.bool)).is_causal_only(5)
    assert not AttentionMask(5, causal=True, prefix_len=2).is_causal_only(5)
    assert not AttentionMask(5).is_causal_only(5)


def _count_constructions(monkeypatch) -> list[AttentionMask]:
    built = []
    original = AttentionMask.__init__

    def counting(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(AttentionMask, "__init__", counting)
    return built


def _masks_seen(model) -> list[AttentionMask]:
    seen = []
    for module in model.modules():
        if isinstance(module, Attention):
            module.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs["mask"]), with_kwargs=True)
    return seen


@pytest.mark.parametrize("overrides", [{}, {"position": "alibi"}, {"position": "rope", "attention_window": 3,
                                                                     "global_every": 2}])
def test_a_decoder_builds_one_mask_per_forward_pass_and_every_layer_gets_it(monkeypatch, overrides):
    model, _ = tiny_model(n_layers=4, **overrides)
    ids = torch.tensor([[0, 0, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7]])
    padding = ids != 0
    built = _count_constructions(monkeypatch)
    seen = _masks_seen(model)
    cache = model.allocate_cache(2, 10)
    with torch.no_grad():
        model(ids, attention_mask=padding, cache=cache)  # prefill
        assert len(built) == 1 and len(seen) == 4 and all(mask is built[0] for mask in seen)
        model(ids[:, :1], attention_mask=torch.cat((padding, padding[:, :1]), dim=1), cache=cache)  # one step
        assert len(built) == 2 and all(mask is built[1] for mask in seen[4:])


def test_an_encoder_decoder_builds_one_mask_per_stack_and_kind(monkeypatch):
    model, _ = tiny_model("encoder-decoder", n_layers=3)
    built = _count_constructions(monkeypatch)
    seen = _masks_seen(model)
    with torch.no_grad():
        model(torch.tensor([[3, 4, 5, 0]]), torch.tensor([[1, 6, 7]]), src_mask=torch.tensor([[1, 1, 1, 0]]))
    assert len(built) == 3  # the encoder's, the decoder's self-attention and cross-attention masks
    assert len(seen) == 9 and len({id(mask) for mask in seen}) == 3


def test_a_padded_pass_builds_each_tensor_form_once_and_a_plain_causal_pass_none(monkeypatch):
    model, _ = tiny_model(n_layers=4)
    biases = []
    as_bias = masks.as_bias

    def counting(mask, dtype):
        biases.append(mask)
        return as_bias(mask, dtype)

    monkeypatch.setattr(masks, "as_bias", counting)
    ids = torch.tensor([[0, 3, 4, 5], [1, 2, 3, 4]])
    with torch.no_grad():
        padded = model(ids, attention_mask=ids != 0).logits
        assert len(biases) == 1  # four layers, one bias
        model(ids)
        assert len(biases) == 1  # causality alone: SDPA's is_causal, no tensor
    torch.testing.assert_close(padded[1], model(ids[1:]).logits[0])


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "relative"])
def test_a_prompt_token_sees_later_prompt_tokens_and_never_generated_ones(position):
    model, _ = tiny_model(position=position)
    ids = torch.tensor([[1, 5, 2, 7, 3, 9, 4]])
    prefix = 4  # the prompt: positions 0-3; generated: 4-6
    with torch.no_grad():
        weights = model(ids, prefix_len=prefix, need_weights=True).attentions
    for layer in weights:
        w = layer["self"][0]  # (H, T, S)
        assert torch.all(w[:, :prefix, :prefix] > 0)  # the prompt reads itself both ways
        assert torch.all(w[:, :prefix, prefix:] == 0)  # never a generated token
        assert torch.all(w[:, prefix:].triu(prefix + 1) == 0)  # generated tokens: causal
    with torch.no_grad():
        plain = model(ids).logits
        prefixed = model(ids, prefix_len=prefix).logits
    assert not torch.allclose(prefixed[0, :prefix - 1], plain[0, :prefix - 1])  # earlier prompt tokens see later ones
    torch.testing.assert_close(model(ids, prefix_len=0).logits, plain)  # an empty prefix: causal


@pytest.mark.parametrize("overrides", [{}, {"position": "rope"}, {"position": "alibi"},
                                       {"position": "rope", "attention_window": 3},
                                       {"position": "alibi", "attention_window": 3},
                                       {"position": "relative", "attention_window": 3}])
def test_prefix_lm_decoding_through_the_cache_equals_the_whole_sequence(overrides):
    model, _ = tiny_model(max_seq_len=32, **overrides)
    prompts = torch.tensor([[0, 0, 5, 2, 7, 3], [1, 5, 2, 7, 3, 9]])  # row 0 left-padded
    padding = prompts != 0
    prefix = torch.tensor([6, 6])  # the prompt's columns: each row's whole prompt
    cache = model.allocate_cache(2, 12)
    with torch.no_grad():
        steps = [model(prompts, attention_mask=padding, prefix_len=prefix, cache=cache).logits]
        ids, mask = prompts, padding
        for _ in range(5):
            token = steps[-1][:, -1].argmax(-1, keepdim=True)  # (B, 1)
            ids, mask = torch.cat((ids, token), dim=1), torch.cat((mask, torch.ones_like(token, dtype=torch.bool)), 1)
            steps.append(model(token, attention_mask=mask, cache=cache).logits)
        whole = model(ids, attention_mask=mask, prefix_len=prefix).logits
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-10, rtol=1e-10)
    assert cache.length == ids.shape[1] == 11


def test_a_prefix_is_checked_at_the_edge():
    model, _ = tiny_model()
    ids = torch.tensor([[1, 2, 3]])
    for bad in (-1, 1.5, True, torch.tensor([1, 2]), torch.tensor([1.0])):
        with pytest.raises(InputError, match="prefix_len"):
            model(ids, prefix_len=bad)
    encoder, _ = tiny_model("encoder")
    with pytest.raises(InputError, match="reads both ways"):
        encoder.stack(ids, prefix_len=2)


def test_the_old_mask_keywords_still_work_with_a_deprecation_warning():
    torch.manual_seed(0)
    attention = Attention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    real = torch.tensor([[True] * 5, [False, True, True, True, True]])
    with pytest.warns(DeprecationWarning, match="mask=AttentionMask") as record:
        old, _ = attention(x, causal=True, key_is_real=real)
    assert record[0].filename == __file__  # the caller's line, past torch's Module.__call__, where filters show it
    new, _ = attention(x, mask=AttentionMask(5, causal=True, attention_mask=real))
    torch.testing.assert_close(old, new)
    model, _ = tiny_model(n_layers=1)
    block = model.stack.blocks[0]
    with pytest.warns(DeprecationWarning, match="key_is_real"):
        old, _ = block(x.double().repeat(1, 1, 2), key_is_real=real)
    new, _ = block(x.double().repeat(1, 1, 2), mask=AttentionMask(5, causal=True, attention_mask=real))
    torch.testing.assert_close(old, new)
    with pytest.raises(ValueError, match="causal=True"):
        block(x.double().repeat(1, 1, 2), mask=AttentionMask(5))  # a decoder block given a bidirectional mask


def test_an_old_block_keyword_beside_its_new_one_is_refused():
    model, _ = tiny_model(n_layers=1)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    real = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(TypeError, match="mask= and key_is_real="):
        model.stack.blocks[0](x, key_is_real=real, mask=AttentionMask(5, causal=True))
