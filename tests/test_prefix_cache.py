"""The prefix cache's blocks: hashes chained over the prefix, look-ups that leave a token to compute, least recently
used blocks evicted first (a prefix's last blocks before its first), and kept keys written back where a left-padded
row needs them."""

from __future__ import annotations

import torch

from attnkit.layers.kv_cache import KVCache
from attnkit.layers.prefix_cache import PrefixCache, reuse

LAYERS, HEADS, DIM = 2, 2, 3


def filled(rows: int, positions: int, seed: int = 0) -> KVCache:
    """A cache whose every key and value is drawn, as if `positions` tokens of each row had been prefilled."""
    cache = KVCache.allocate(n_layers=LAYERS, batch_size=rows, n_kv_heads=HEADS, head_dim=DIM, max_len=positions)
    generator = torch.Generator().manual_seed(seed)
    for layer in cache.layers:
        layer.keys.normal_(generator=generator)
        layer.values.normal_(generator=generator)
    cache.hold(positions)
    return cache


def test_a_blocks_hash_names_its_whole_prefix():
    cache = PrefixCache(max_bytes=0, block_size=2)
    one, two = cache.hashes([1, 2, 3, 4, 5]), cache.hashes([9, 9, 3, 4])
    assert len(one) == 2  # the partial block [5] has none
    assert one[1] != two[1]  # the same tokens [3, 4] after another block
    assert cache.hashes([1, 2, 3, 4, 7]) == one and cache.hashes([1, 2, 3, 5])[0] == one[0]
    assert len(set(one + two)) == 4


def test_a_kept_prefix_is_found_block_by_block_leaving_a_token_to_compute():
    source = filled(1, 8)
    cache = PrefixCache(max_bytes=1 << 20, block_size=4)
    cache.keep([1, 2, 3, 4, 5, 6, 7, 8], source, row=0, start=0)
    assert len(cache.blocks) == 2 and cache.bytes == 2 * LAYERS * 2 * HEADS * 4 * DIM * 4
    found = cache.match([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(found) == 2
    torch.testing.assert_close(torch.cat(found, dim=3), source.read(0, 0, 8), rtol=0, atol=0)
    assert len(cache.match([1, 2, 3, 4, 5, 6, 7, 8])) == 1  # its last token is computed, for the next one's logits
    assert len(cache.match([1, 2, 3, 4, 5, 6, 0, 8, 9])) == 1 and cache.match([2, 1, 3, 4, 5]) == []


def test_least_recently_used_blocks_go_first_and_a_prefixs_last_blocks_before_its_first():
    block_bytes = LAYERS * 2 * HEADS * 2 * DIM * 4
    cache = PrefixCache(max_bytes=4 * block_bytes, block_size=2)
    source = filled(1, 6)
    cache.keep([1, 2, 3, 4, 5, 6], source, row=0, start=0)  # blocks a b c
    cache.keep([7, 8, 9, 10], source, row=0, start=0)  # blocks d e: over the limit by one
    assert cache.bytes == 4 * block_bytes
    assert len(cache.match([1, 2, 3, 4, 5, 6, 0])) == 2  # c went first: a prefix's last block
    cache.keep([11, 12], source, row=0, start=0)  # f pushes out e, now the least recently used
    assert len(cache.match([7, 8, 9, 10, 0])) == 1
    assert len(cache.match([1, 2, 3, 4, 0])) == 2


def test_reuse_writes_each_rows_kept_prefix_beside_its_padding_and_says_where_to_compute_from():
    source = filled(1, 8, seed=1)
    cache = PrefixCache(max_bytes=1 << 20, block_size=4)
    cache.keep(list(range(1, 9)), source, row=0, start=0)
    prompts = [list(range(1, 9)) + [20, 21], list(range(1, 5)) + [30]]  # 8 kept + 2 new; 4 kept + 1 new
    target = KVCache.allocate(n_layers=LAYERS, batch_size=2, n_kv_heads=HEADS, head_dim=DIM, max_len=10)
    start = reuse(cache, prompts, 10, target)
    assert start == 8 and target.length == 8  # row 1 starts at column 5: its kept 4 tokens end at column 9 > 8
    torch.testing.assert_close(target.read(0, 0, 8), source.read(0, 0, 8), rtol=0, atol=0)
    torch.testing.assert_close(target.read(1, 5, 8), source.read(0, 0, 3), rtol=0, atol=0)
    assert cache.hits == 8 + 3 and cache.queried == 15
    assert reuse(cache, [[40, 41, 42, 43, 44]], 5, target) == 0
