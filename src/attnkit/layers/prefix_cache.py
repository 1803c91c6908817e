"""Prefix caching (vLLM's automatic prefix caching): the keys and values of recently seen prompt prefixes, kept so
that a request whose prompt starts as an earlier one's did (a system prompt, few-shot examples, the conversation so
far) computes only the rest.

A prompt is cut into blocks of `block_size` tokens. A block is known by a hash of its tokens chained with its
parent's (the block before it), so one hash names the whole prefix up to the block's end, as in vLLM's
`kv_cache_utils.hash_block_tokens`:

    tokens   [ t0 .. t15 ]   [ t16 .. t31 ]   [ t32 .. t40 ]
    hash     h0 = H(-, b0)   h1 = H(h0, b1)   a partial block: never kept

A prefix's keys and values depend on its tokens alone: attention is causal and a row's positions count from its
first real token (`generate/decoder.py`), so a block's keys and values serve any later prompt that starts with the
same tokens, in whatever row, beside whatever padding. The hash is SHA-256, so two prefixes that differ never
share a block.

Blocks are evicted least recently used first once they take more than `max_bytes`. A look-up refreshes a prefix's
blocks from its last to its first, so the first blocks, which every longer prefix needs, are evicted last.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.layers.kv_cache import KVCache

BLOCK_SIZE = 16  # tokens in a block (vLLM's default)


class PrefixCache:
    """Blocks of keys and values (L, 2, Hkv, block_size, D) by the hash of the prefix they end (see the module
    docstring). `queried` and `hits` count prompt tokens looked up and tokens whose keys were reused."""

    def __init__(self, *, max_bytes: int, block_size: int = BLOCK_SIZE) -> None:
        if max_bytes < 0 or block_size < 1:
            raise ValueError(f"max_bytes={max_bytes} must be >= 0 and block_size={block_size} >= 1")
        self.max_bytes, self.block_size = max_bytes, block_size
        self.blocks: OrderedDict[bytes, Tensor] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.queried = 0
        self.hits = 0

    @property
    def hit_rate(self) -> float:
        """The share of looked-up prompt tokens whose keys and values were reused (0 before any look-up)."""
        return self.hits / self.queried if self.queried else 0.0

    def hashes(self, tokens: Sequence[int]) -> list[bytes]:
        """The chained hash of each whole block of `tokens`, in order."""
        hashes, parent = [], b""
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            block = array("q", tokens[start : start + self.block_size]).tobytes()
            parent = hashlib.sha256(parent + block).digest()
            hashes.append(parent)
        return hashes

    def match(self, tokens: Sequence[int]) -> list[Tensor]:
        """The kept blocks of the longest prefix of `tokens` that leaves at least one token to compute (its logits
        are the next token's), first block first; each (L, 2, Hkv, block_size, D). Refreshes them (see the module
        docstring)."""
        found = []
        for digest in self.hashes(tokens[:-1]):
            if digest not in self.blocks:
                break
            found.append(digest)
        for digest in reversed(found):
            self.blocks.move_to_end(digest)
        return [self.blocks[digest] for digest in found]

    def count(self, queried: int, hits: int) -> None:
        """Count a look-up of `queried` prompt tokens of which `hits` were reused."""
        self.queried += queried
        self.hits += hits

    def keep(self, tokens: Sequence[int], cache: KVCache, row: int, start: int) -> None:
        """Keep the whole blocks of `tokens`, whose keys and values sit in `cache`'s row `row` from position `start`
        on; blocks already kept are refreshed. Then evict down to `max_bytes`."""
        hashes = self.hashes(tokens)
        for index in reversed(range(len(hashes))):  # first blocks last: the most recently used
            digest = hashes[index]
            if digest in self.blocks:
                self.blocks.move_to_end(digest)
                continue
            begin = start + index * self.block_size
            block = cache.read(row, begin, begin + self.block_size)  # (L, 2, Hkv, block_size, D)
            self.blocks[digest] = block
            self.bytes += block.nbytes
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self.blocks:
            _, block = self.blocks.popitem(last=False)
            self.bytes -= block.nbytes


def reuse(prefix_cache: PrefixCache, prompts: Sequence[Sequence[int]], width: int, cache: KVCache) -> int:
    """Write the kept prefixes of left-padded `prompts` (each right-aligned in `width` columns) into the empty
    `cache` and return the column c from which the rows must still be computed: every row's prefix before c is
    kept (or padding), so the prefill runs over columns [c, width) only.

        row 0   .  .  .  [ kept  ][ kept  ] q  q      c: the earliest column where some row's kept prefix
        row 1   [ kept  ][ kept  ][ kept  ] q  q  q      ends; row 1's third block is computed again there
        row 2   .  .  .  .  .  .  .  .  .  q  q  q  q
                                         ^ c
    """
    found = [prefix_cache.match(prompt) for prompt in prompts]
    offsets = [width - len(prompt) for prompt in prompts]  # each row's first real column
    start = min(offset + len(blocks) * prefix_cache.block_size for offset, blocks in zip(offsets, found, strict=True))
    for row, (prompt, offset, blocks) in enumerate(zip(prompts, offsets, found, strict=True)):
        reused = max(0, start - offset)
        prefix_cache.count(len(prompt), reused)
        if reused:
            cache.write(row, offset, torch.cat(blocks, dim=3)[:, :, :, :reused])  # (L, 2, Hkv, reused, D)
    if start > 0:
        cache.hold(start)
    return start
