"""Padded, length-bucketed batches of variable-length sequences, shared by pairs and labelled text.

Bucketing, per epoch (a pure function of seed and epoch, so a resumed run sees the same batches):

    shuffle all examples  ->  cut into buckets of batch_size * bucket_batches examples
    sort each bucket by length  ->  cut into batches  ->  shuffle the order of all batches

so a batch holds sequences of similar length (little padding) while each epoch still mixes the data.

Batches by token count (`batch_tokens`, as the published translation setups batch, e.g. fairseq's --max-tokens):
each sorted bucket is cut where the next example would take the batch's real (non-padding) tokens past
`batch_tokens`, so short sentences come many to a batch and long ones few, and every step sees about the same
number of tokens. A bucket then holds `bucket_batches` batches' worth of tokens. An example longer than
`batch_tokens` gets a batch of its own. The count of batches varies a little from epoch to epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Generic, TypeVar

import numpy as np
import torch

from attnkit.errors import InputError

IGNORE_INDEX = -100  # targets equal to this (padding, unmasked MLM positions) add nothing to the loss (torch's default)

BatchT = TypeVar("BatchT")


def pad(
    seqs: Sequence[Sequence[int]], value: int, *, left: bool = False, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id sequences -> ids (B, T) int64 filled with `value` past each sequence, T the longest, and the
    mask (B, T) bool, True at real tokens. Sequences start at column 0 (batches, encoder sources); `left=True`
    puts the padding first, so every row ends at the last column (prompts that a decoder continues).
    Raises `InputError` for no sequences.
    """
    if len(seqs) == 0:
        raise InputError("no sequences to pad")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)  # (B,)
    width = int(lengths.max())
    columns = torch.arange(width)[None, :]  # (1, T)
    mask = columns >= width - lengths[:, None] if left else columns < lengths[:, None]  # (B, T)
    ids = torch.full((len(seqs), width), value, dtype=torch.int64)  # (B, T)
    ids[mask] = torch.from_numpy(np.concatenate([np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]))
    return ids.to(device), mask.to(device)


class BucketedData(Generic[BatchT]):
    """Examples served as bucketed batches. Subclasses keep their examples and implement `collate`.

    The batches of an epoch are `batch_order(epoch)`, a pure function of `(seed, epoch)`; a trainer resumes
    by remembering `(epoch, index)` and calling `iter_epoch(epoch, start=index)`.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        batch_size: int,
        seed: int = 0,
        bucket_batches: int = 50,
        batch_tokens: int | None = None,
        tokens: Sequence[int] | None = None,
    ) -> None:
        """`lengths` sort the buckets; `tokens` (default `lengths`) are what each example adds to a batch of
        `batch_tokens` (None: batches of `batch_size` examples; evaluation batches always hold `batch_size`)."""
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        if batch_tokens is not None and batch_tokens < 1:
            raise InputError(f"batch_tokens must be >= 1 (or unset for batches of batch_size), got {batch_tokens}")
        if len(lengths) == 0:
            raise InputError("no examples")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.tokens = self.lengths if tokens is None else np.asarray(tokens, dtype=np.int64)
        if len(self.tokens) != len(self.lengths):
            raise InputError(f"{len(self.tokens)} token counts for {len(self.lengths)} examples")
        self.batch_size = batch_size
        self.seed = seed
        self.bucket_batches = bucket_batches
        self.batch_tokens = batch_tokens
        self._order = lru_cache(maxsize=2)(self._batch_order)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def num_batches(self) -> int:
        """Batches per epoch: the same every epoch with `batch_size`; with `batch_tokens`, epoch 0's (others
        differ a little: `len(batch_order(epoch))`)."""
        if self.batch_tokens is not None:
            return len(self.batch_order(0))
        full, rest = divmod(len(self), self.batch_size * self.bucket_batches)
        return full * self.bucket_batches + -(-rest // self.batch_size)

    def batch_order(self, epoch: int) -> list[np.ndarray]:
        """The example indices of each batch of `epoch`, in order."""
        return self._order(epoch)

    def _batch_order(self, epoch: int) -> list[np.ndarray]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(self), generator=gen).numpy()
        batches = []
        for b in range(0, len(perm), self._bucket_size):
            chunk = perm[b : b + self._bucket_size]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(self._cut(chunk))
        return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]

    @property
    def _bucket_size(self) -> int:
        """Examples per bucket: `bucket_batches` batches' worth."""
        if self.batch_tokens is None:
            return self.batch_size * self.bucket_batches
        return self.bucket_batches * max(1, round(self.batch_tokens / float(self.tokens.mean())))

    def _cut(self, chunk: np.ndarray) -> list[np.ndarray]:
        """A length-sorted bucket cut into batches of `batch_size` examples or of at most `batch_tokens` tokens."""
        if self.batch_tokens is None:
            return [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        ends = np.cumsum(self.tokens[chunk])  # tokens up to and including each example
        batches, start, base = [], 0, 0
        for i in range(1, len(chunk)):
            if ends[i] - base > self.batch_tokens:  # example i would overfill the batch begun at `start`
                batches.append(chunk[start:i])
                start, base = i, ends[i - 1]
        batches.append(chunk[start:])
        return batches

    def batch(self, epoch: int, index: int) -> BatchT:
        """Batch `index` of `epoch`."""
        return self.collate(self.batch_order(epoch)[index])

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[BatchT]:
        """The batches of `epoch` from batch `start` on."""
        for indices in self.batch_order(epoch)[start:]:
            yield self.collate(indices)

    def eval_batches(self) -> Iterator[BatchT]:
        """Every example once, in batches of similar length, in a fixed order (no shuffling)."""
        order = np.argsort(self.lengths, kind="stable")
        for i in range(0, len(order), self.batch_size):
            yield self.collate(order[i : i + self.batch_size])

    def collate(self, indices: Sequence[int]) -> BatchT:
        raise NotImplementedError
