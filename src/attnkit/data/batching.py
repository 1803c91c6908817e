"""Padded, length-bucketed batches of variable-length sequences, shared by pairs and labelled text.

Bucketing, per epoch (a pure function of seed and epoch, so a resumed run sees the same batches):

    shuffle all examples  ->  cut into buckets of batch_size * bucket_batches examples
    sort each bucket by length  ->  cut into batches  ->  shuffle the order of all batches

so a batch holds sequences of similar length (little padding) while each epoch still mixes the data.
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

    def __init__(self, lengths: Sequence[int], *, batch_size: int, seed: int = 0, bucket_batches: int = 50) -> None:
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        if len(lengths) == 0:
            raise InputError("no examples")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size = batch_size
        self.seed = seed
        self.bucket_batches = bucket_batches
        self._order = lru_cache(maxsize=2)(self._batch_order)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def num_batches(self) -> int:
        """Batches per epoch (the same every epoch)."""
        full, rest = divmod(len(self), self.batch_size * self.bucket_batches)
        return full * self.bucket_batches + -(-rest // self.batch_size)

    def batch_order(self, epoch: int) -> list[np.ndarray]:
        """The example indices of each batch of `epoch`, in order."""
        return self._order(epoch)

    def _batch_order(self, epoch: int) -> list[np.ndarray]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(self), generator=gen).numpy()
        batches = []
        bucket = self.batch_size * self.bucket_batches
        for b in range(0, len(perm), bucket):
            chunk = perm[b : b + bucket]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size))
        return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]

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
