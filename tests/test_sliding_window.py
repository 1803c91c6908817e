"""Sliding-window attention (Longformer, Mistral): no key outside a query's window gets weight, the windowed model
decoded through its rolling cache equals the model run on the whole sequence, and the cache stays the window's size
however long generation runs."""

import pytest
import torch
from generate_models import greedy_without_cache, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import ModelConfig
from attnkit.blocks import TransformerBlock
from attnkit.errors import ConfigError
from attnkit.generate import generate_tokens
from attnkit.generate.static_decode import StaticDecoding
from attnkit.layers.attention import Attention
from attnkit.layers.kv_cache import RollingLayerCache
from attnkit.layers.masks import AttentionMask


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, 12), window=st.integers(1, 14), causal=st.booleans(), padded=st.integers(0, 3))
def test_no_key_outside_the_window_gets_weight(length, window, causal, padded):
    torch.manual_seed(length * 31 + window)
    attention = Attention(16, 4, n_kv_heads=2, window=window).double().eval()
    x = torch.randn(2, length, 16, dtype=torch.float64)
    real = torch.ones(2, length, dtype=torch.bool)
    real[1, : min(padded, length - 1)] = False  # left padding in the second row
    _, weights = attention(x, mask=AttentionMask(length, causal=causal, attention_mask=real), need_weights=True)
    query = torch.arange(length)[:, None]
    key = torch.arange(length)[None, :]
    outside = (query - key >= window) | (key > query) if causal else (query - key).abs() >= window
    if outside.any():
        assert weights[:, :, outside].abs().max().item() == 0
    torch.testing.assert_close(weights[0].sum(dim=-1), torch.ones(4, length, dtype=torch.float64))
    if not real[1].all():  # real queries give padded keys no weight
        assert weights[1][:, real[1]][:, :, ~real[1]].abs().max().item() == 0


def test_fused_windowed_attention_equals_the_reference_path():
    torch.manual_seed(0)
    attention = Attention(32, 4, n_kv_heads=2, window=3).eval()
    x = torch.randn(2, 9, 32)
    real = torch.ones(2, 9, dtype=torch.bool)
    real[1, :2] = False
    for mask in (AttentionMask(9, causal=True), AttentionMask(9), AttentionMask(9, causal=True, attention_mask=real)):
        fast, _ = attention(x, mask=mask)
        slow, _ = attention(x, mask=mask, need_weights=True)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [3, 5, 40])  # smaller than the prompt, between, larger than everything
def test_cached_decoding_equals_the_whole_sequence_for_windows_small_and_large(window):
    model, config = tiny_model(position="rope", attention_window=window, max_seq_len=64)
    prompt = [1, 5, 2, 7, 3, 9, 4]
    tokens = generate_tokens(model, [prompt], max_new_tokens=20, context_len=64)[0]
    assert tokens == greedy_without_cache(model, prompt, 20)


@pytest.mark.parametrize("kv_heads", [4, 2])  # multi-head and grouped-query
def test_blocks_compiled_whole_for_any_length_decode_through_the_rolling_cache(kv_heads):
    """fullgraph=True turns a graph break into an error: the kernels' enable_gqa was a comparison of head counts read
    from the shapes, a symbolic bool under dynamic=True that SDPA rejected on the rolling cache's decode step."""
    model, _ = tiny_model(position="rope", attention_window=4, n_kv_heads=kv_heads, max_seq_len=64)
    prompt = [1, 5, 2, 7, 3, 9]
    eager = generate_tokens(model, [prompt], max_new_tokens=5, context_len=64)
    for block in model.modules():
        if isinstance(block, TransformerBlock):
            block.compile(fullgraph=True, backend="eager", dynamic=True)
    assert generate_tokens(model, [prompt], max_new_tokens=5, context_len=64) == eager


@pytest.mark.parametrize("position", ["alibi", "relative"])
def test_alibi_and_shaw_read_the_distances_of_the_keys_a_rolling_cache_holds(position):
    """ALiBi's and Shaw's terms read each key's distance from the query, and a windowed layer's ring buffer holds its
    keys out of order: they read the positions it says each key holds. Decoding a token at a time or in chunks gives
    the logits of the whole pass, and in one layer a token further back than the window changes no later logit."""
    model, config = tiny_model(position=position, attention_window=3, n_layers=1)
    ids = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        for chunks in ([1] * 12, [5, 2, 5]):
            cache, start, steps = model.allocate_cache(2, 12), 0, []
            for size in chunks:
                steps.append(model(ids[:, start : start + size], cache=cache).logits)
                start += size
            torch.testing.assert_close(torch.cat(steps, dim=1), full)
        changed = ids.clone()
        changed[:, 0] = (changed[:, 0] + 1) % config.vocab_size
        moved = model(changed).logits
    torch.testing.assert_close(moved[:, 3:], full[:, 3:])  # position 3 sees 1, 2, 3 only
    assert not torch.allclose(moved[:, :3], full[:, :3])


def test_generating_four_windows_keeps_the_cache_at_the_windows_size():
    window = 4
    model, _ = tiny_model(position="rope", attention_window=window, max_seq_len=64)
    ids = torch.tensor([[1, 5, 2, 7, 3, 9]])
    cache = model.allocate_cache(1, 64)
    assert all(isinstance(layer, RollingLayerCache) for layer in cache.layers)
    with torch.no_grad():
        logits = model(ids, cache=cache).logits[0, -1]
        sequence = ids[0].tolist()
        for _ in range(4 * window):
            token = int(logits.argmax())
            sequence.append(token)
            logits = model(torch.tensor([[token]]), cache=cache).logits[0, -1]
            whole = model(torch.tensor([sequence])).logits[0, -1]
            torch.testing.assert_close(logits, whole, atol=1e-10, rtol=1e-10)
            assert all(layer.keys.shape[2] == window for layer in cache.layers)
    assert cache.length == len(sequence) > 4 * window


def test_global_every_alternates_windowed_and_global_layers():
    model, config = tiny_model(position="rope", attention_window=3, global_every=2, n_layers=4, max_seq_len=64)
    windows = [block.self_attn.window for block in model.stack.blocks]
    assert windows == [3, None, 3, None] == [config.window_of(i) for i in range(4)]
    cache = model.allocate_cache(1, 64)
    assert [isinstance(layer, RollingLayerCache) for layer in cache.layers] == [True, False, True, False]
    prompt = [1, 5, 2, 7, 3, 9, 4, 8]
    assert generate_tokens(model, [prompt], max_new_tokens=12, context_len=64)[0] == greedy_without_cache(
        model, prompt, 12)


def test_windowed_models_decode_eagerly_and_bad_windows_fail_at_construction():
    model, _ = tiny_model(position="rope", attention_window=4)
    assert not StaticDecoding.supports(model)
    with pytest.raises(ConfigError, match="needs attention_window"):
        ModelConfig(global_every=2)
