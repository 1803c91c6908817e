"""`kv_bytes_per_position`, the one estimate of a KV cache's size (beam search's and speculative decoding's memory
checks and the gqa-memory experiment read it): the bytes of every layer's keys and values at one position, as
allocated, for GQA, sliding windows and a cache dtype other than fp32."""

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.layers.kv_cache import kv_bytes_per_position
from attnkit.models import build_model


@pytest.mark.parametrize(("n_kv_heads", "window", "dtype"),
                         [(4, None, torch.float32), (2, None, torch.float32), (1, 4, torch.bfloat16)])
def test_kv_bytes_per_position_counts_keys_and_values_of_every_layer(n_kv_heads, window, dtype):
    config = ModelConfig(family="decoder", vocab_size=16, d_model=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=3,
                         d_ff=64, max_seq_len=32, attention_window=window)
    model = build_model(config).to(dtype)
    element = torch.empty((), dtype=dtype).element_size()
    by_hand = 2 * config.n_layers * n_kv_heads * (32 // 4) * element  # keys and values, every layer, (Hkv, D) each
    assert kv_bytes_per_position(model) == by_hand
    assert kv_bytes_per_position(model, batch_size=3) == 3 * by_hand
    # every position kept: a sliding window's rolling cache would hold only `window` positions of a long text
    assert model.allocate_cache(2, 20, rolling=False).nbytes == 20 * kv_bytes_per_position(model, 2)
    # counted, never allocated: a memory check asking about 10**12 rows gets their size, not an allocation failure
    assert kv_bytes_per_position(model, batch_size=10**12) == 10**12 * by_hand
