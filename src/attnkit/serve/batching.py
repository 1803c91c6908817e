"""Continuous batching: concurrent generation requests share one forward pass per decoding step over one KV cache
(iteration-level scheduling, Yu et al. 2022, "Orca"). A request joins the batch between steps and leaves it when
it ends, so a short request never waits for a long one and a new one waits at most one step.

    step t     row 0   .  .  A  A  A  a1 a2        rows are left-padded, as in generate/decoder.py: each row's
               row 1   B  B  B  B  B  b1 b2        newest token sits in the last column
    C arrives: prefilled alone (decoder.prefill), its cache row placed right-aligned beside the others
    step t+1   row 0   .  .  A  A  A  a1 a2 a3
               row 1   B  B  B  B  B  b1 b2 b3
               row 2   .  .  .  C  C  C  C  c1     one forward pass (decoder.decode_one_token) for all three
    B ends:    its row is dropped, and leading columns that are padding in every row left go with it

Each request keeps its own sampling settings and its own seeded generator, and its rows are sampled together,
so a request's tokens do not depend on which others share its steps: the tokens equal those of
`Pipeline.generate` for the same prompt, settings and seed. The `n` choices of one request are `n` rows that
join and leave together (as `Pipeline.generate(num_samples=n)` keeps them).

Models whose cache cannot be merged row by row (a recurrent LM's state, a sliding window's ring buffer) run one
request at a time through the same loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnkit.errors import InputError
from attnkit.generate.decoder import EagerDecoding, Window, left_pad
from attnkit.generate.sampling import SamplingConfig, make_generator, select_next
from attnkit.layers.kv_cache import KVCache, LayerCache

log = logging.getLogger(__name__)

FinishReason = str  # "stop" (EOS, a stop token or string), "length" (max_tokens), "cancelled", "error"


class QueueFull(Exception):
    """The waiting queue is full; the caller should try again later."""


@dataclass(eq=False)
class GenerationJob:
    """One request: `n` rows continuing the same prompt. Callbacks run on the scheduler's thread.

    on_token(choice, token) -> True ends that choice (a stop string was reached); on_finish(reasons) is called
    once, with one reason per choice, when every choice has ended or the job was cancelled.
    """

    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    on_token: Callable[[int, int], bool]
    on_finish: Callable[[list[FinishReason]], None]
    n: int = 1
    seed: int | None = None
    stop_ids: frozenset[int] = frozenset()
    deadline: float | None = None  # time.monotonic() after which the job is cancelled
    cancelled: threading.Event = field(default_factory=threading.Event)
    # set by the scheduler
    generator: torch.Generator | None = None
    produced: int = 0  # decoding steps taken
    reasons: list[FinishReason | None] = field(default_factory=list)

    def cancel(self) -> None:
        """End the job at the next step (a client that went away, a timeout)."""
        self.cancelled.set()


class Batch:
    """The running rows: their window (ids and mask, (B, L)), their cache, and the job and choice of each row."""

    def __init__(self, window: Window, cache, rows: list[tuple[GenerationJob, int]]) -> None:
        self.window, self.cache, self.rows = window, cache, rows

    @property
    def jobs(self) -> list[GenerationJob]:
        return list(dict.fromkeys(job for job, _ in self.rows))


def mergeable(cache) -> bool:
    """Whether rows of `cache` can be moved between caches: plain KV caches (no ring buffer, no recurrent state)."""
    return isinstance(cache, KVCache) and all(type(layer) is LayerCache for layer in cache.layers)


def combine(parts: list[tuple[Batch, Tensor]], allocate: Callable[[int, int], KVCache], headroom: int) -> tuple[
        Window, KVCache]:
    """One window and cache holding the chosen rows (B_i,) of each part, in order, right-aligned.

    Columns that are padding in every chosen row are dropped; the cache gets room for `headroom` more positions.
    """
    # each part's longest row
    lengths = [int(batch.window.attention_mask[index].sum(dim=1).max()) for batch, index in parts]
    width = max(lengths)
    n_rows = sum(len(index) for _, index in parts)
    cache = allocate(n_rows, width + headroom)
    first = parts[0][0].window
    ids = torch.zeros((n_rows, width), dtype=first.ids.dtype, device=first.ids.device)
    mask = torch.zeros((n_rows, width), dtype=torch.bool, device=first.attention_mask.device)
    start = 0
    for (batch, index), length in zip(parts, lengths, strict=True):
        rows = slice(start, start + len(index))
        old = batch.cache.length
        for new_layer, old_layer in zip(cache.layers, batch.cache.layers, strict=True):
            new_layer.keys[rows, :, width - length:width] = old_layer.keys[index, :, old - length:old]
            new_layer.values[rows, :, width - length:width] = old_layer.values[index, :, old - length:old]
        ids[rows, width - length:] = batch.window.ids[index, -length:]
        mask[rows, width - length:] = batch.window.attention_mask[index, -length:]
        start += len(index)
    for layer in cache.layers:
        layer.length = width
    return Window.of(ids, mask), cache


class Scheduler:
    """Runs generation jobs with continuous batching on one thread (see the module docstring).

    max_rows: rows decoded together at most (a request of n choices takes n); max_waiting: jobs waiting to join,
    beyond which `submit` raises QueueFull.
    """

    def __init__(self, model, *, context_len: int, pad_id: int, max_rows: int = 32, max_waiting: int = 64) -> None:
        self.model = model
        self.decoding = EagerDecoding(model)
        self.context_len = context_len
        self.pad_id = pad_id
        self.max_rows = max_rows
        self.device = next(model.parameters()).device
        self.waiting: queue.Queue[GenerationJob] = queue.Queue(maxsize=max_waiting)
        self.batch: Batch | None = None
        self.logits: Tensor | None = None  # (B, V): the running rows' next-token logits
        self.steps = 0  # forward passes so far (prefills and decoding steps)
        self.tokens = 0  # tokens generated so far
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="attnkit-batching", daemon=True)
        self.lock = threading.Lock()  # held while the model runs: others using it (the explorer) take it too

    # The caller's side ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def submit(self, job: GenerationJob) -> None:
        """Queue `job`; raises QueueFull when the queue is, InputError when it can never fit."""
        if job.n > self.max_rows:
            raise InputError(f"n={job.n} is more than the server decodes at once ({self.max_rows}); ask for fewer")
        if len(job.prompt) + job.max_new_tokens > self.context_len:
            raise InputError(f"the prompt has {len(job.prompt)} tokens and max_tokens is {job.max_new_tokens}: "
                             f"together more than the model's context of {self.context_len}")
        try:
            self.waiting.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        self._wake.set()

    @property
    def running_rows(self) -> int:
        batch = self.batch
        return len(batch.rows) if batch is not None else 0

    @property
    def queue_length(self) -> int:
        return self.waiting.qsize()

    # The scheduler's thread -------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.batch is None and self.waiting.empty():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                with self.lock, torch.inference_mode():
                    self._iteration()
            except Exception:  # a failure ends the running jobs, never the server
                log.exception("generation failed; ending the running requests")
                self._end_all("error")

    def _iteration(self) -> None:
        """Admit waiting jobs, choose a token for every row, drop the rows that ended, and step the rest."""
        self._admit()
        if self.batch is None:
            return
        batch, logits = self.batch, self.logits
        chosen = torch.empty(len(batch.rows), dtype=torch.long, device=self.device)
        now = time.monotonic()
        for job in batch.jobs:
            rows = self._rows_of(job)
            if job.cancelled.is_set() or (job.deadline is not None and now > job.deadline):
                job.reasons = ["cancelled" if reason is None else reason for reason in job.reasons]
                chosen[rows] = self.pad_id
                continue
            tokens = select_next(logits[rows], job.sampling, generator=job.generator)  # (n,)
            chosen[rows] = tokens
            self._deliver(job, tokens.tolist())
        keep = [i for i, (job, _) in enumerate(batch.rows) if None in job.reasons]
        for job in batch.jobs:
            if None not in job.reasons:
                job.on_finish(list(job.reasons))
        if not keep:
            self.batch, self.logits = None, None
            return
        if len(keep) < len(batch.rows):
            self._shrink(keep, chosen)
        else:
            self.batch.window = batch.window.append(chosen)
        self.logits = self.decoding.step(self.batch.window, self.batch.cache)
        self.steps += 1

    def _deliver(self, job: GenerationJob, tokens: list[int]) -> None:
        """Pass each choice's token on, as `decode_n_tokens` does: a stop token ends a choice unreturned."""
        job.produced += 1
        for choice, token in enumerate(tokens):
            if job.reasons[choice] is not None:
                continue
            self.tokens += 1
            if token in job.stop_ids or job.on_token(choice, token):
                job.reasons[choice] = "stop"
            elif job.produced >= job.max_new_tokens:
                job.reasons[choice] = "length"

    def _rows_of(self, job: GenerationJob) -> list[int]:
        return [i for i, (owner, _) in enumerate(self.batch.rows) if owner is job]

    def _admit(self) -> None:
        """Prefill the waiting jobs that fit, in one forward pass, and merge them into the running batch."""
        joining: list[GenerationJob] = []
        rows = self.running_rows
        can_merge = self.batch is None or mergeable(self.batch.cache)
        while can_merge and not self.waiting.empty():
            job = self.waiting.queue[0]
            if rows + job.n > self.max_rows:
                break
            self.waiting.get_nowait()
            if job.cancelled.is_set():
                job.on_finish(["cancelled"] * job.n)
                continue
            joining.append(job)
            rows += job.n
            if self.batch is None and not self._merge_ok():
                break  # a model whose cache cannot merge takes one job at a time
        if not joining:
            return
        prompts = [job.prompt for job in joining for _ in range(job.n)]
        headroom = max(job.max_new_tokens for job in joining)
        window = left_pad(prompts, pad_id=self.pad_id, device=self.device)
        cache = self._allocate(len(prompts), window.ids.shape[1] + headroom)
        logits = self.decoding.prefill(window, cache)  # (n_new, V)
        self.steps += 1
        for job in joining:
            job.generator = make_generator(job.seed, self.device)
            job.reasons = [None] * job.n
        new = Batch(window, cache, [(job, choice) for job in joining for choice in range(job.n)])
        if self.batch is None:
            self.batch, self.logits = new, logits
            return
        everyone = torch.arange(len(self.batch.rows), device=self.device)
        fresh = torch.arange(len(new.rows), device=self.device)
        left = max(job.max_new_tokens - job.produced for job in self.batch.jobs)
        window, cache = combine([(self.batch, everyone), (new, fresh)], self._allocate, max(left, headroom))
        self.batch = Batch(window, cache, self.batch.rows + new.rows)
        self.logits = torch.cat((self.logits, logits))

    def _merge_ok(self) -> bool:
        """Whether this model's caches merge (checked once, on a cache of one position)."""
        if not hasattr(self, "_merges"):
            self._merges = mergeable(self._allocate(1, 1))
        return self._merges

    def _shrink(self, keep: list[int], chosen: Tensor) -> None:
        """Drop the rows that ended (only a merging cache holds several jobs); the kept ones take their token."""
        batch = self.batch
        index = torch.tensor(keep, device=self.device)
        rows = [batch.rows[i] for i in keep]
        left = max(job.max_new_tokens - job.produced for job in dict.fromkeys(job for job, _ in rows))
        window, cache = combine([(batch, index)], self._allocate, left)
        self.batch = Batch(window.append(chosen[index]), cache, rows)

    def _allocate(self, batch_size: int, positions: int):
        """A cache of `positions`; rows padded beside a longer prompt may need more than the context itself."""
        return self.model.allocate_cache(batch_size, positions)

    def _end_all(self, reason: FinishReason) -> None:
        jobs = self.batch.jobs if self.batch is not None else []
        while not self.waiting.empty():
            jobs.append(self.waiting.get_nowait())
        self.batch, self.logits = None, None
        for job in jobs:
            job.on_finish([reason if r is None else r for r in (job.reasons or [None] * job.n)])
