"""Continuous batching: concurrent generation requests share one forward pass per decoding step over one KV cache
(iteration-level scheduling, Yu et al. 2022, "Orca"). A request joins the batch between steps and leaves it when
it ends, so a short request never waits for a long one.

The running rows live in buffers with room to spare (`Batch`: R rows, P positions), written in place, so joining
and leaving copy no other row's cache:

    step t     row 0   .  .  A  A  A  a1 a2  .  .      rows are left-padded, as in generate/decoder.py: every
               row 1   B  B  B  B  B  b1 b2  .  .      row's newest token sits in the same column
    C arrives: prefilled (with the others that came within a step), its keys written into the next unused row,
               right-aligned beside the others
    step t+1   row 0   .  .  A  A  A  a1 a2 a3  .
               row 1   B  B  B  B  B  b1 b2 b3  .
               row 2   .  .  .  C  C  C  C  c1  .      one forward pass (decoder.decode_one_token) over the rows in
                                                       use, from the first column one of them uses
    A ends:    the last row (C) moves into A's place: one row is copied
    no column left (or too few rows, or a prompt wider than the rows): the batch moves into new buffers, leaving
               behind the columns that are padding in every row: a copy of the whole cache, once in many steps

The buffers hold at most max_rows rows and twice the context's positions: the rows in use never span more than the
context, and the spare room lets the buffers move less often (a model with a sliding window: the context, since a
longer buffer would be a ring buffer, whose rows cannot merge).

Admission: a job arriving while the batch is running waits until it has waited one decoding step, or joins at
once when the waiting jobs fill the free rows, so jobs that arrive within a step of each other are prefilled in one
forward pass; the running rows keep stepping meanwhile, and a job arriving at an idle scheduler starts at once.
Jobs join first come first served within a request, and requests take turns (`serve/waiting.py`: a request of many
prompts does not hold one that came after it until all its prompts have run): an iteration looks at the jobs it
admits and the cancelled ones it meets before them, which end ("cancelled") there.

Each request keeps its own sampling settings and a seeded generator per choice (choice i's seed is the request's
seed + i, as vLLM seeds the n samples of one request), and its rows are sampled together, so a request's tokens do
not depend on which others share its steps: the tokens equal those of `Pipeline.generate` for the same prompt,
settings and seed, and choice i's those of a request of one choice with seed + i. The `n` choices of one request
are `n` rows that join and leave together (as `Pipeline.generate(num_samples=n)` keeps them), at most max_rows - 1
of them (`most_choices`; the one row where max_rows is 1): a row is left for the requests that come after it. The
prompts of one request are held to the same bound together: while they hold most_choices rows, the request's next
prompt waits for one of them to end, and the requests after it take the free row. A
request held to a grammar (structured output) has a matcher per choice: its rows' logits are masked before they are
sampled, beside free rows in the same step, and a choice ends ("stop") where its grammar is complete
(`generate/constrained.py`).

A job that fails fails alone: its settings sampling to nothing, a callback that raises, a prefill that fails (the
jobs prefilled with it are prefilled again one by one) end that job with "error" and the exception in its
`failure`, while the others go on; a job taken from the queue always gets its `on_finish`. Only a decoding step
that fails, shared by every running row, ends the running jobs; the waiting ones still run after it.

With a prefix cache (`layers/prefix_cache.py`, vLLM's automatic prefix caching), a prefill first writes the kept
keys and values of its prompts' prefixes into the new rows and computes only the columns after them; then it keeps
the prompts' whole blocks, and a row that ends keeps those of its whole sequence (prompt and reply: a conversation's
next turn starts with both). Keys and values depend only on the tokens before them, so a request's tokens are those
it gets without the cache, whichever rows and requests the prefix came from.

Models whose cache cannot be merged row by row (a recurrent LM's state, a sliding window's ring buffer) run one
request at a time through the same loop.

With a draft model (`attnkit serve --draft`), the scheduler owns a second one, `speculative`
(`serve/speculative.SpeculativeScheduler`: its own queue and batch, and the draft's batch beside it). The second has
no thread and is never started or submitted to: `submit` hands it the jobs it `takes`, and this scheduler's thread,
under this scheduler's lock, runs a step of its own rows and then a round of the speculative ones (`parts`). Each
batch holds at most max_rows rows and admits by its own; a step that fails ends that batch's jobs alone; a close ends
both; the counts the server reports are both parts' together.

A fixed-shape decoding step (`generate/static_decode.StaticDecoding`: torch.compile's step, or the step captured
ahead of time, `captured_step.CapturedDecoding`, whose one package serves every batch size from 2 and every cache
length) steps the rows over a static view of the same buffers (`Batch.static_cache`): every column, padding masked
by the attention mask, the new token written at column `length`. Prefills stay eager, as they are there.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnkit.errors import AttnkitError, InputError
from attnkit.generate.constrained import GrammarMask
from attnkit.generate.decoder import EagerDecoding, Window, left_pad, prefill
from attnkit.generate.sampling import (
    SamplingConfig,
    check_drawn,
    choice_seed,
    hold_back,
    hold_back_in_rows,
    make_generator,
    select_next_in_groups,
    token_logprobs,
    unwritable_ids,
)
from attnkit.generate.static_decode import StaticDecoding
from attnkit.layers.kv_cache import KVCache, LayerCache, StaticKVCache
from attnkit.layers.prefix_cache import PrefixCache, reuse
from attnkit.serve.errors import SHUTTING_DOWN, STOPPED
from attnkit.serve.waiting import WaitingQueue

log = logging.getLogger(__name__)

FinishReason = str  # "stop" (EOS, a stop token or string), "length" (max_tokens), "cancelled", "error"
Row = tuple["GenerationJob", int]  # a row's job and which of its choices the row is


class Unfit(InputError):
    """A job the scheduler can never run (too many choices, too long a text); `param` names the request's field to
    change (the server's 400 names it)."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class Closed(Exception):
    """The scheduler takes no job, and a job it ended unfinished failed with this: the server is shutting down
    (`SHUTTING_DOWN`), or the scheduler's thread has ended (`STOPPED`)."""


@dataclass(eq=False)
class GenerationJob:
    """One request: `n` rows continuing the same prompt. Callbacks run on the scheduler's thread.

    on_token(choice, token) -> True ends that choice (a stop string was reached); on_finish(reasons) is called
    once, with one reason per choice, when every choice has ended or the job was cancelled. With `top_logprobs` set,
    on_logprobs(choice, token, logprob, top) comes just before each on_token: its log-probability under the model's
    raw logits and the `top_logprobs` likeliest [(token, logprob), ...] (`sampling.token_logprobs`).
    """

    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    on_token: Callable[[int, int], bool]
    on_finish: Callable[[list[FinishReason]], None]
    n: int = 1
    seed: int | None = None
    stop_ids: frozenset[int] = frozenset()
    grammar: GrammarMask | None = None  # a matcher per choice, each choice's text held to it (structured output)
    deadline: float | None = None  # time.monotonic() after which the job is cancelled
    top_logprobs: int | None = None  # None: no log-probabilities asked for
    on_logprobs: Callable[[int, int, float, list[tuple[int, float]]], None] | None = None
    min_tokens: int = 0  # the stop tokens are held back (at -inf) until each choice has this many tokens (vLLM's)
    owner: object = None  # the request it is one prompt of: requests take turns to join (None: a request of its own)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # set by the scheduler
    queued: float = 0.0  # time.monotonic() when it was submitted
    generators: list[torch.Generator | None] = field(default_factory=list)  # one per choice (see the docstring)
    produced: int = 0  # decoding steps taken
    held_ids: Tensor | None = None  # (S,): the stop ids on the device, while min_tokens holds them back (`_prefill`)
    seen: Tensor | None = None  # (n, V) bool: the tokens of each choice's sequence, for the penalties
    counts: Tensor | None = None  # (n, V): how often each choice generated each token
    first_token_at: float | None = None  # time.monotonic() when its first token was passed on
    last_token_at: float | None = None  # ... and its last
    finished_at: float | None = None  # ... and when it ended
    reasons: list[FinishReason | None] = field(default_factory=list)
    failure: BaseException | None = None  # why the job ended with "error"

    def cancel(self) -> None:
        """End the job at the next step (a client that went away, a timeout)."""
        self.cancelled.set()


def request_of(job: GenerationJob) -> int:
    """The request `job` is one prompt of, as the waiting queue keys it (`WaitingQueue.put`)."""
    return id(job.owner if job.owner is not None else job)


def mergeable(cache) -> bool:
    """Whether rows of `cache` can be moved between caches: plain KV caches (no ring buffer, no recurrent state)."""
    return isinstance(cache, KVCache) and all(type(layer) is LayerCache for layer in cache.layers)


class Batch:
    """The running rows (see the module docstring). `store` is a cache of R rows and P positions, `ids` and
    `attention_mask` (R, P) the window's buffers; rows [0, len(rows)) are in use, each a job's choice, and columns
    [0, length) hold their cached keys, of which those before `first` are padding in every row. `cache` is the rows
    in use from column `first` on: views of the store's buffers, so a step writes into them and attends to no dead
    column. With a `template` (a StaticKVCache of the model's layers), `static_cache()` is the rows in use over every
    column, for a fixed-shape step."""

    def __init__(self, store, ids: Tensor, attention_mask: Tensor, length: int, rows: list[Row], *,
                 template: StaticKVCache | None = None) -> None:
        self.store, self.ids, self.attention_mask = store, ids, attention_mask
        self.length, self.rows = length, rows
        self.template = template
        self.slot = torch.zeros(1, dtype=torch.long, device=ids.device)  # the column a static step writes
        self._in_use()

    @property
    def jobs(self) -> list[GenerationJob]:
        return list(dict.fromkeys(job for job, _ in self.rows))

    def rows_of_jobs(self, start: int = 0) -> dict[GenerationJob, list[int]]:
        """Each job's rows from row `start` on, counted from `start`, in the order of its choices."""
        rows_of: dict[GenerationJob, list[int]] = {}
        for row, (job, choice) in enumerate(self.rows[start:]):
            rows_of.setdefault(job, [0] * job.n)[choice] = row
        return rows_of

    @property
    def room(self) -> tuple[int, int]:
        """(R, P): the rows and positions the buffers hold."""
        rows, positions = self.ids.shape
        return rows, positions

    def window(self) -> Window:
        """The rows in use from column `first` up to their newest token, in column `length`: (B, length + 1 - first).
        Whether it is padded was read when the rows in use last changed (`_in_use`): each step adds a real column to
        every row, so a step asks the device nothing."""
        rows, end = len(self.rows), self.length + 1
        return Window(self.ids[:rows, self.first:end], self.attention_mask[:rows, self.first:end], padded=self.padded)

    def static_cache(self) -> StaticKVCache:
        """The rows in use as a StaticKVCache over the store's buffers (B, Hkv, P, D), `filled` their attention mask
        (B, P), at the batch's length: a fixed-shape step writes column `length` and attends to every real column."""
        for layer in self.static.layers:
            layer.length = self.length
        return self.static

    def write(self, tokens: Tensor) -> None:
        """Each row's next token, (B,), into column `length` (the room is there: `Scheduler._fit`)."""
        rows = len(self.rows)
        self.ids[:rows, self.length] = tokens
        self.attention_mask[:rows, self.length] = True

    def place(self, window: Window, cache: KVCache, rows: list[Row]) -> None:
        """Add prefilled rows after those in use: window (k, T) with its cache, right-aligned so that their last
        prompt token sits in column `length - 1` like every row's (T <= length; the rows are there)."""
        new = slice(len(self.rows), len(self.rows) + len(rows))
        width = window.ids.shape[1]
        start = self.length - width  # (T columns) -> columns [start, length)
        for layer, fresh in zip(self.store.layers, cache.layers, strict=True):
            layer.keys[new, :, start:self.length] = fresh.keys[:, :, :width]
            layer.values[new, :, start:self.length] = fresh.values[:, :, :width]
        self.attention_mask[new, :start] = False  # what a row's earlier user left there is padding now
        self.ids[new, start:self.length] = window.ids
        self.attention_mask[new, start:self.length] = window.attention_mask
        self.rows = self.rows + rows
        self._in_use()

    def drop(self, ended: list[int]) -> Tensor:
        """Remove the rows `ended` (ascending): the last rows in use move into their places. Returns (B',) the old
        index of each row left, in its new order."""
        kept = len(self.rows) - len(ended)
        holes = [i for i in ended if i < kept]
        gone = set(ended)
        movers = [i for i in range(kept, len(self.rows)) if i not in gone]  # as many as the holes
        order = list(range(kept))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        if holes:
            into = torch.tensor(holes, device=self.ids.device)
            source = torch.tensor(movers, device=self.ids.device)
            live = slice(self.first, self.length)
            for layer in self.store.layers:
                layer.keys[into, :, live] = layer.keys[source, :, live]
                layer.values[into, :, live] = layer.values[source, :, live]
            self.ids[into] = self.ids[source]
            self.attention_mask[into] = self.attention_mask[source]
        self.rows = [self.rows[i] for i in order]
        self._in_use()
        return torch.tensor(order, device=self.ids.device)

    def realign(self, shifts: list[int]) -> None:
        """Move each row's columns [first, length) `shifts[row]` places to the right (B,), the columns that fall off
        past `length` its own unused ones, those it leaves on the left padding: after a speculative round in which
        rows kept different numbers of drafts, every row's newest token is in column `length` again, each row with
        its own length, as rows of different prompts are. Keys and values move with their tokens: a row's positions
        count its real tokens (`positions_from_mask`), not columns, and every distance within the row is kept (ALiBi,
        relative positions, a sliding window). A row's gather reads its own columns only, and the columns it leaves
        hold its own keys, masked.

        The `shift` columns before `length` are the caller's to give up (a round's rejected drafts: the mask cannot
        tell them from tokens). Raises InputError, moving nothing, for a shift below 0 (a row never moves left, past
        the columns in use) or of every column from `first` on, and for a count of shifts not the rows'."""
        width = self.length - self.first
        if len(shifts) != len(self.rows) or not all(0 <= shift < width for shift in shifts):
            raise InputError(f"cannot realign {len(self.rows)} rows of {width} columns by {shifts}: give one shift a "
                             f"row, each from 0 to {width - 1} (a row moves right, past none of its columns in use)")
        moving = [row for row, shift in enumerate(shifts) if shift]
        if moving:
            device = self.ids.device
            rows = torch.tensor(moving, device=device)  # (b,)
            by = torch.tensor([shifts[row] for row in moving], device=device)[:, None]  # (b, 1)
            live = slice(self.first, self.length)
            source = torch.arange(width, device=device)[None, :] - by  # (b, W): columns moved from
            left = source < 0  # the columns no token moves into: padding
            source = source.clamp(min=0)
            self.ids[rows, live] = self.ids[rows, live].gather(1, source)
            self.attention_mask[rows, live] = self.attention_mask[rows, live].gather(1, source) & ~left
            for layer in self.store.layers:
                for buffer in (layer.keys, layer.values):
                    part = buffer[rows, :, live]  # (b, Hkv, W, D)
                    buffer[rows, :, live] = part.gather(2, source[:, None, :, None].expand_as(part))
        self._in_use()

    def moved(self, rows: int, positions: int, shift: int, allocate: Callable[[int, int], KVCache]) -> Batch:
        """The same rows in new buffers of `rows` x `positions`, every column `shift` places to the right (to the
        left when negative, by at most `first`: the columns that fall off are padding in every row)."""
        used, start = len(self.rows), max(0, -shift)
        old, new = slice(start, self.length), slice(start + shift, self.length + shift)
        store = allocate(rows, positions)
        for new_layer, old_layer in zip(store.layers, self.store.layers, strict=True):
            new_layer.keys[:used, :, new] = old_layer.keys[:used, :, old]
            new_layer.values[:used, :, new] = old_layer.values[:used, :, old]
        ids = torch.zeros((rows, positions), dtype=self.ids.dtype, device=self.ids.device)
        mask = torch.zeros((rows, positions), dtype=torch.bool, device=self.attention_mask.device)
        ids[:used, new] = self.ids[:used, old]
        mask[:used, new] = self.attention_mask[:used, old]
        return Batch(store, ids, mask, self.length + shift, self.rows, template=self.template)

    def _in_use(self) -> None:
        """Find `first` and make `cache`, after the rows in use changed."""
        used = len(self.rows)
        real = self.attention_mask[:used, : self.length].to(torch.uint8)  # (B, L)
        if self.template is not None:  # contiguous views (rows only): what a captured step's package takes
            buffers = [buffer[:used] for layer in self.store.layers for buffer in (layer.keys, layer.values)]
            self.static = self.template.over(buffers, self.slot, self.attention_mask[:used])
        if not mergeable(self.store):  # one job's rows, which join and leave together (Scheduler._take)
            self.first, self.cache, self.padded = 0, self.store, not bool(real.all())
            return
        self.first = int(real.argmax(dim=1).min()) if self.length else 0  # each row's first real column, the least
        self.padded = not bool(real[:, self.first :].all())
        layers = []
        for layer in self.store.layers:
            part = copy.copy(layer)  # a LayerCache over narrowed buffers: (B, Hkv, P - first, D)
            part.keys, part.values = layer.keys[:used, :, self.first:], layer.values[:used, :, self.first:]
            part.length = self.length - self.first
            layers.append(part)
        self.cache = KVCache(layers)


def _index(rows: list[int], device: torch.device) -> slice | Tensor:
    """`rows` as an index: a slice where they run in order, else a tensor of them on `device`."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.tensor(rows, device=device)


class Scheduler:
    """Runs generation jobs with continuous batching on one thread (see the module docstring).

    max_rows: rows decoded together at most (a request of n choices takes n); max_waiting: places in the queue of jobs
    waiting to join (one request's jobs hold at most half, `serve/waiting.py`), beyond which `submit` raises
    QueueFull; decoding: how a step runs (the pipeline's: `attnkit.load`'s `compile`
    gives a StaticDecoding, see the module docstring), eager by default; prefix_cache: where prompts' prefixes are
    kept and found (`layers/prefix_cache.py`), None to compute every prompt whole; writable: the tokenizer's size,
    where the model's vocabulary is padded past it (the ids from it on are never chosen, `sampling.unwritable_ids`);
    speculative: the rows that decode with a draft model (`serve/speculative.py`), which this scheduler hands the
    jobs it `takes` and runs a round of after each of its own steps, on its thread.
    """

    def __init__(self, model, *, context_len: int, pad_id: int, max_rows: int = 32, max_waiting: int = 64,
                 decoding: EagerDecoding | None = None, prefix_cache: PrefixCache | None = None,
                 writable: int | None = None, speculative: Scheduler | None = None) -> None:
        self.model = model
        self.speculative = speculative
        self.writable = writable
        self.unwritable: Tensor | None = None  # (U,): those ids, found at the first draw
        self.prefix_cache = prefix_cache
        self.observe: Callable[[GenerationJob], None] | None = None  # called with each job that ended
        self.decoding = decoding if decoding is not None else EagerDecoding(model)
        static = isinstance(self.decoding, StaticDecoding)
        self.template = model.allocate_cache(1, 1, static=True) if static else None  # the static view's layers
        self.context_len = context_len
        # The most positions a batch's buffers take, read from the model once. The rows in use never span more than
        # the context, so twice the context is spare room that lets the buffers move less often; with a sliding
        # window, the context itself, since a buffer longer than the window becomes a ring buffer, whose rows cannot
        # merge.
        windowed = any(getattr(module, "window", None) is not None for module in model.modules())
        self.most_positions = context_len if windowed else 2 * context_len
        self.pad_id = pad_id
        self.max_rows = max_rows
        self.device = next(model.parameters()).device
        self.waiting: WaitingQueue[GenerationJob] = WaitingQueue(max_waiting)
        self.batch: Batch | None = None
        self.logits: Tensor | None = None  # (B, V): the running rows' next-token logits
        self.steps = 0  # forward passes so far (prefills and decoding steps)
        self.prefills = 0  # of those, prefills (the requests that join together share one)
        self.tokens = 0  # tokens generated so far
        # iterations that chose tokens (`_iteration`), their time (a GPU's included: choosing reads the tokens) and
        # the rows they chose for: where a server's time goes, and its mean batch (GET /metrics)
        self.iterations = 0
        self.iteration_seconds = 0.0
        self.rows_chosen = 0
        self.step_seconds = 0.0  # how long the last decoding step took (with the read of its tokens, `_decode`)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = threading.Event()  # set: every job ends unfinished, and none is taken (`close`)
        self._thread = threading.Thread(target=self._loop, name="attnkit-batching", daemon=True)
        self.lock = threading.Lock()  # held while the model runs: others using it (the explorer) take it too

    # The caller's side ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """End every job, running and waiting, at the next step with "error" and a `Closed` failure (each gets its
        on_finish), and refuse jobs submitted after: the server is shutting down, and no reply waits to run to its
        end. Returns at once; the scheduler's thread ends them."""
        self._closed.set()
        self._wake.set()

    def stop(self) -> None:
        """Close, then end the scheduler's thread once it has ended the jobs."""
        self._stop.set()
        self.close()
        self._thread.join(timeout=30)

    def submit(self, job: GenerationJob) -> None:
        """Queue `job`; raises QueueFull (`serve/waiting.py`) when the queue is, Unfit when it can never fit,
        Closed after `close`."""
        if self._closed.is_set():
            raise Closed(SHUTTING_DOWN)
        if self.stopped:
            raise Closed(STOPPED)
        if job.n > self.most_choices:
            why = ("one is kept for the requests that come after it" if self.most_choices < self.max_rows
                   else "the server decodes one row at a time")
            raise Unfit(f"n={job.n} is more than one request may take of the rows the server decodes at once "
                        f"({self.max_rows}): ask for fewer, or serve with a larger --max-batch (one request "
                        f"takes at most {self.most_choices} rows: {why})", param="n")
        if len(job.prompt) + job.max_new_tokens > self.context_len:
            raise Unfit(f"the prompt has {len(job.prompt)} tokens and max_tokens is {job.max_new_tokens}: "
                        f"together more than the model's context of {self.context_len}", param="max_tokens")
        job.queued = time.monotonic()
        speculative = self.speculative
        (speculative if speculative is not None and speculative.takes(job) else self).waiting.put(job)
        self._wake.set()

    @property
    def most_choices(self) -> int:
        """The most rows (choices, `n`) one job may take: all but one of max_rows, so that a request of many choices
        and many tokens never holds every row while a request that came after it waits for it to end."""
        return max(1, self.max_rows - 1)

    @property
    def parts(self) -> list[Scheduler]:
        """This scheduler and its speculative rows' (`speculative`), whose counts together are the server's."""
        return [self] if self.speculative is None else [self, self.speculative]

    @property
    def stopped(self) -> bool:
        """Whether the scheduler's thread has ended (after `start`): no job would ever be taken."""
        return self._thread.ident is not None and not self._thread.is_alive()

    @property
    def _own_rows(self) -> int:
        """The rows of this scheduler's batch alone, which its admission bounds by max_rows."""
        return len(self.batch.rows) if self.batch is not None else 0

    @property
    def running_rows(self) -> int:
        return sum(len(part.batch.rows) for part in self.parts if part.batch is not None)

    @property
    def queue_length(self) -> int:
        return sum(len(part.waiting) for part in self.parts)

    @property
    def running_requests(self) -> int:
        return sum(len(part.batch.jobs) for part in self.parts if part.batch is not None)

    @property
    def kv_cache_usage(self) -> float:
        """The share of the running batches' cache positions (rows x columns allocated, the speculative rows' too)
        that hold a row's keys: its prompt and the tokens it has generated, counted without reading the device."""
        held = room = 0
        for part in self.parts:
            batch = part.batch
            if batch is not None:
                rows, positions = batch.room
                held += sum(len(job.prompt) + job.produced for job, _ in batch.rows)
                room += rows * positions
        return held / room if room else 0.0

    # The scheduler's thread -------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._closed.is_set():
                self._end_all()
            if all(part.batch is None and part.waiting.empty() for part in self.parts):
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            with self.lock, torch.inference_mode():
                for part in self.parts:  # a step of the plain rows, then a round of the speculative ones
                    try:
                        part._iteration()
                    except Exception as error:  # a step shared by its running jobs failed: they end, not the server
                        log.exception("a decoding step failed; ending the requests it ran")
                        part._end_running(error)
        self._end_all()  # what came between `close` and `stop`: every job gets its on_finish

    def _end_all(self) -> None:
        """End every job, running and waiting, unfinished: "error" for each choice still open, `Closed` its failure."""
        with self.lock:
            for part in self.parts:
                jobs = part.batch.jobs if part.batch is not None else []
                part._let_go()
                jobs += part.waiting.take_all()
                for job in jobs:
                    job.failure = Closed(SHUTTING_DOWN)
                    job.reasons = ["error" if reason is None else reason for reason in (job.reasons or [None] * job.n)]
                    part._finish(job)

    def _iteration(self) -> None:
        """Admit waiting jobs, then decode the batch (`_decode`), counted for /metrics."""
        began = time.monotonic()
        self._admit()
        self._end_cancelled()
        if self.batch is None:
            return
        self.rows_chosen += self._decode()
        self.iterations += 1
        self.iteration_seconds += time.monotonic() - began

    def _decode(self) -> int:
        """Choose a token for every row, drop the rows that ended, and step the rest; returns the rows chosen for."""
        started = time.monotonic()
        chosen = self._choose(self.batch)  # reads the tokens: waits for the step before to finish on a GPU
        choosing = time.monotonic() - started
        self._advance(chosen, choosing)
        return len(chosen)

    def _advance(self, chosen: Tensor, choosing: float) -> None:
        """End the jobs whose choices all ended, drop their rows, and step the rest (`chosen`: each row's token)."""
        ended = [i for i, (job, _) in enumerate(self.batch.rows) if None not in job.reasons]
        if ended and self.prefix_cache is not None and self._merge_ok():
            self._keep_sequences(ended)
        for job in self.batch.jobs:
            if None not in job.reasons:
                self._finish(job)
        if len(ended) == len(self.batch.rows):
            self._let_go()
            return
        if ended:
            chosen = chosen[self.batch.drop(ended)]
        self._fit()
        self.batch.write(chosen)
        started = time.monotonic()
        cache = self.batch.static_cache() if self.template is not None else self.batch.cache
        self.logits = self.decoding.step(self.batch.window(), cache)
        # the step's call and the wait for the last step's tokens: on a CPU the call computes the step, on a GPU it
        # launches the kernels and the next read of tokens waits for them; either way, what a step costs
        self.step_seconds = time.monotonic() - started + choosing
        self.batch.length += 1
        self.steps += 1

    def _choose(self, batch: Batch) -> Tensor:
        """Each row's next token, (B,), passed on to its job; a cancelled job's rows get padding and its choices end.
        The rows of jobs with the same settings are sampled in one call, each job's rows in the order of its
        choices and from its own generator."""
        chosen = torch.empty(len(batch.rows), dtype=torch.long, device=self.device)
        rows_of = batch.rows_of_jobs()
        expired = self._cancel_expired(rows_of)
        for job in expired:
            chosen[rows_of[job]] = self.pad_id
        self._sample_alike([job for job in rows_of if job not in expired], rows_of, chosen)
        return chosen

    def _sample_alike(self, jobs: list[GenerationJob], rows_of: dict[GenerationJob, list[int]],
                      chosen: Tensor) -> None:
        """Sample the rows of `jobs` into `chosen` (`_sample`), the jobs of one setting in one call."""
        alike: dict[SamplingConfig, list[GenerationJob]] = {}
        for job in jobs:
            alike.setdefault(job.sampling, []).append(job)
        for sampling, same in alike.items():
            self._sample(same, sampling, rows_of, chosen)

    def _cancel_expired(self, jobs: Iterable[GenerationJob]) -> list[GenerationJob]:
        """End ("cancelled") the open choices of the `jobs` whose clients went away or whose deadline passed; returns
        those jobs."""
        now = time.monotonic()
        expired = [job for job in jobs if job.cancelled.is_set() or (job.deadline is not None and now > job.deadline)]
        for job in expired:
            job.reasons = ["cancelled" if reason is None else reason for reason in job.reasons]
        return expired

    def _sample(self, jobs: list[GenerationJob], sampling: SamplingConfig, rows_of: dict[GenerationJob, list[int]],
                chosen: Tensor) -> None:
        """Sample the rows of `jobs` (alike settings) in one call into `chosen` and pass the tokens on. When the call
        fails, the generators go back to where they were and each job is sampled alone, so that only the job whose
        rows fail ends ("error"); its rows get padding."""
        rows = [row for job in jobs for row in rows_of[job]]
        at = _index(rows, self.device)  # a slice where the rows run in order (the usual case): no copy to the device
        states = [[g.get_state() if g is not None else None for g in job.generators] for job in jobs]
        try:
            logits = self._held_back(jobs, self.logits[at])  # (B, V)
            if self.unwritable is None:
                self.unwritable = unwritable_ids(logits.shape[-1], self.writable, device=self.device)
            logits = hold_back(logits, self.unwritable)
            grammar = GrammarMask.joined([(job.n, job.grammar) for job in jobs])
            if grammar is not None:  # each constrained row's forbidden tokens at -inf (generate/constrained.py)
                logits = grammar(logits)
            seen, counts = self._penalties(jobs, sampling, logits.shape[-1])
            groups = [(1, generator) for job in jobs for generator in job.generators]  # a generator per choice
            tokens = select_next_in_groups(logits, sampling, groups, seen=seen, counts=counts)
        except Exception as error:
            if len(jobs) == 1:
                chosen[at] = self.pad_id
                self._fail(jobs[0], error)
                return
            for job, kept in zip(jobs, states, strict=True):
                for generator, state in zip(job.generators, kept, strict=True):
                    if state is not None:
                        generator.set_state(state)
                self._sample([job], sampling, rows_of, chosen)
            return
        chosen[at] = tokens
        if sampling.penalises:
            start = 0
            for job in jobs:
                choices = torch.arange(job.n, device=self.device)
                drawn = tokens[start:start + job.n].clamp(min=0)  # NO_TOKEN, a broken row, fails below
                job.seen[choices, drawn] = True
                job.counts[choices, drawn] += 1
                start += job.n
        drawn = iter(tokens.tolist())
        for job in jobs:
            picked = [next(drawn) for _ in range(job.n)]
            try:
                check_drawn(picked)
                self._deliver(job, picked, self._scores(job, rows_of[job], chosen))
            except Exception as error:  # its own logits gave no distribution, or its own callback failed
                chosen[rows_of[job]] = self.pad_id
                self._fail(job, error)

    def _keep_sequences(self, rows: list[int]) -> None:
        """Keep the whole blocks of each of `rows`' sequences, prompt and reply, in the prefix cache as they leave:
        the next turn of a conversation (the same prompt, this reply, a new message) reuses the reply's keys too.
        A failed job's rows are not kept (their logits, perhaps their keys, may be broken)."""
        batch = self.batch
        for row in rows:
            if batch.rows[row][0].failure is not None:
                continue
            start = int(batch.attention_mask[row, : batch.length].to(torch.uint8).argmax())  # its first real column
            tokens = batch.ids[row, start : batch.length].tolist()  # the tokens whose keys columns [start, length) hold
            self.prefix_cache.keep(tokens, batch.store, row, start)

    def _held_back(self, jobs: list[GenerationJob], logits: Tensor) -> Tensor:
        """`logits` (B, V) of `jobs`' rows with the stop tokens at -inf in the rows of jobs that have not yet reached
        their `min_tokens`: one new tensor for the batch where any is held back, each such job's rows filled in it
        (the raw logits stay for the log-probabilities)."""
        held, start = [], 0
        for job in jobs:
            if job.produced < job.min_tokens and job.held_ids is not None:
                held.append((slice(start, start + job.n), job.held_ids))
            start += job.n
        return hold_back_in_rows(logits, held)

    def _penalties(self, jobs: list[GenerationJob], sampling: SamplingConfig, vocab: int
                   ) -> tuple[Tensor | None, Tensor | None]:
        """What the penalties of `sampling` read for `jobs`' rows: (B, V) bool, the tokens of each sequence (prompt
        and reply), and (B, V), each token's count in each reply; (None, None) without penalties. Each job's start
        from its prompt at its first draw."""
        if not sampling.penalises:
            return None, None
        for job in jobs:
            if job.seen is None:
                prompt = torch.tensor(job.prompt, device=self.device)
                job.seen = torch.zeros((job.n, vocab), dtype=torch.bool, device=self.device)
                job.seen[:, prompt] = True
                job.counts = torch.zeros((job.n, vocab), dtype=torch.int32, device=self.device)
        return torch.cat([job.seen for job in jobs]), torch.cat([job.counts for job in jobs])

    def _scores(self, job: GenerationJob, rows: list[int], chosen: Tensor) -> list | None:
        """For a job that asks for them, each choice's (logprob, top) under the logits its token was drawn from."""
        if job.top_logprobs is None:
            return None
        logprobs, values, ids = token_logprobs(self.logits[rows], chosen[rows], job.top_logprobs)
        return [(logprob, list(zip(top_ids, top_values, strict=True)))
                for logprob, top_ids, top_values in zip(logprobs.tolist(), ids.tolist(), values.tolist(), strict=True)]

    def _deliver(self, job: GenerationJob, tokens: list[int], scores: list | None = None) -> None:
        """Pass each choice's token (and its `scores`) on, as `decode_n_tokens` does: a stop token ends a choice
        unreturned."""
        job.produced += 1
        job.last_token_at = time.monotonic()
        job.first_token_at = job.first_token_at or job.last_token_at
        for choice, token in enumerate(tokens):
            if job.reasons[choice] is not None:
                continue
            self.tokens += 1
            if scores is not None and token not in job.stop_ids:
                job.on_logprobs(choice, token, *scores[choice])
            complete = token not in job.stop_ids and job.grammar is not None and job.grammar.advance(choice, token)
            if token in job.stop_ids or job.on_token(choice, token) or complete:
                job.reasons[choice] = "stop"
            elif job.produced >= job.max_new_tokens:
                job.reasons[choice] = "length"

    def _admit(self) -> None:
        """Prefill the jobs that join now (`_take`) in one forward pass and add their rows to the batch. When that
        fails, each is prefilled alone, and a job that fails alone ends ("error"): none taken from the queue is lost."""
        joining = self._take()
        if not joining:
            return
        try:
            self._prefill(joining)
        except Exception as error:
            if len(joining) == 1:
                self._fail(joining[0], error)
                self._finish(joining[0])
                return
            log.warning("prefilling %d requests together failed; prefilling each alone", len(joining))
            for job in joining:
                try:
                    self._prefill([job])
                except Exception as alone:
                    self._fail(job, alone)
                    self._finish(job)

    def _prefill(self, joining: list[GenerationJob]) -> None:
        """Prefill `joining` in one forward pass and add their rows; the batch is unchanged when the pass fails."""
        for job in joining:
            job.generators = [make_generator(choice_seed(job.seed, choice), self.device) for choice in range(job.n)]
            job.reasons = [None] * job.n
            if job.min_tokens and job.stop_ids:  # built once: every step it holds them back reads the same tensor
                job.held_ids = torch.tensor(sorted(job.stop_ids), device=self.device)
        rows = [(job, choice) for job in joining for choice in range(job.n)]
        window = left_pad([job.prompt for job, _ in rows], pad_id=self.pad_id, device=self.device)  # (k, T)
        count, width = window.ids.shape
        prompts = [job.prompt for job, _ in rows]
        if self.batch is None:
            batch = self._start(window, rows, headroom=max(job.max_new_tokens for job in joining))
            logits = self._prefill_logits(window, batch.cache, prompts)
            batch.length, batch.padded = width, window.padded  # its columns are the prompts' now
            self.batch, self.logits = batch, logits
        else:
            cache = self._allocate(count, width)
            logits = self._prefill_logits(window, cache, prompts)  # (k, V)
            self._fit(rows=count, width=width)
            self.batch.place(window, cache, rows)
            self.logits = torch.cat((self.logits, logits))
        self.steps += 1
        self.prefills += 1

    def _prefill_logits(self, window: Window, cache: KVCache, prompts: list[list[int]]) -> Tensor:
        """Prefill `window` (the left-padded `prompts`) into the plain cache `cache`: (k, V). Eager beside a
        fixed-shape step, as it is there. With a prefix cache, the kept prefixes are written into `cache` first and
        only the rest is computed; then the prompts' whole blocks are kept."""
        keeps = self.prefix_cache is not None and self._merge_ok()
        if keeps:
            reuse(self.prefix_cache, prompts, window.ids.shape[1], cache)
        if self.template is not None:
            logits = prefill(self.model, window, cache)
        else:
            logits = self.decoding.prefill(window, cache)
        if keeps:
            width = window.ids.shape[1]
            for row, prompt in enumerate(prompts):
                self.prefix_cache.keep(prompt, cache, row, width - len(prompt))
        return logits

    def _end_cancelled(self) -> None:
        """End the waiting jobs whose clients gave up, which the queue set aside where it met them (`_take`, or a
        `submit` that found the queue full): "cancelled", on this thread."""
        for job in self.waiting.take_set_aside():
            job.reasons = ["cancelled"] * job.n
            self._finish(job)

    def _take(self) -> list[GenerationJob]:
        """The waiting jobs that join now, as many as fit: at once when nothing runs; while a batch runs, once the
        head job of the request whose turn it is has waited a decoding step or the waiting jobs fill the free rows;
        never beside a cache that cannot merge (nor a second job with such a model)."""
        batch = self.batch
        if batch is not None and (not self._due() or not self._merge_ok()):  # _due first: it meets the head
            return []
        joining: list[GenerationJob] = []
        rows = self._own_rows  # max_rows bounds each batch: the speculative rows' have their own
        # the rows each request (`request_of`) holds in this batch
        held = Counter(request_of(job) for job, _ in (batch.rows if batch is not None else []))

        def fits(job: GenerationJob) -> bool:
            return rows + job.n <= self.max_rows

        def at_share(job: GenerationJob) -> bool:  # its request's prompts hold as many rows as one request may
            return held[request_of(job)] + job.n > self.most_choices

        # cancelled jobs met are set aside (`_end_cancelled`); a request at its share is passed over, keeping its turn
        while (job := self.waiting.pop_if(fits, passes=at_share)) is not None:
            joining.append(job)
            rows += job.n
            held[request_of(job)] += job.n
            if batch is None and not self._merge_ok():
                break
        return joining

    def _due(self) -> bool:
        """Whether the waiting jobs join the running batch now (see `_take`), judged by the head job of the request
        whose turn it is (`WaitingQueue.head`: not always the oldest job; the cancelled ones met before it are set
        aside)."""
        head = self.waiting.head()
        if head is None:
            return False
        waited = time.monotonic() - head.queued
        return waited >= self.step_seconds or len(self.waiting) >= self.max_rows - self._own_rows

    def _start(self, window: Window, rows: list[Row], *, headroom: int) -> Batch:
        """A batch of these rows, not yet prefilled: buffers for twice the positions they need (one job's exact
        need for a cache that cannot merge, which never grows)."""
        count, width = window.ids.shape
        needed = width + headroom
        positions = min(2 * needed, self.most_positions) if self._merge_ok() else needed
        ids = torch.zeros((count, positions), dtype=window.ids.dtype, device=self.device)
        mask = torch.zeros((count, positions), dtype=torch.bool, device=self.device)
        ids[:, :width], mask[:, :width] = window.ids, window.attention_mask
        return Batch(self._allocate(count, positions), ids, mask, 0, rows, template=self.template)

    def _fit(self, *, rows: int = 0, width: int = 0, columns: int = 1) -> None:
        """Make room in the batch for `rows` more rows whose prompts are `width` columns wide, and `columns` free
        columns from `length` on (the next token's; a speculative round's drafts too). When the buffers lack it, the
        batch moves into new ones, leaving behind the columns that are padding in every row; rows double (up to
        max_rows), and positions double (up to `most_positions`) when what is left would fill at least three
        quarters of them."""
        batch = self.batch
        capacity, positions = batch.room
        used = len(batch.rows) + rows
        if used <= capacity and width <= batch.length and batch.length + columns <= positions:
            return
        length = max(batch.length - batch.first, width)  # the columns the rows need now
        if positions - length - (columns - 1) <= positions // 4:
            positions = min(max(2 * positions, length + columns), self.most_positions)
        if used > capacity:
            capacity = min(self.max_rows, max(2 * capacity, used))
        self.batch = batch.moved(capacity, positions, length - batch.length, self._allocate)

    def _merge_ok(self) -> bool:
        """Whether this model's caches merge (checked once, on a cache of no rows and the whole context: a sliding
        window shorter than the context makes it a ring buffer). Decided by the model, not by a batch's buffer,
        which a short first job may have allocated below the window."""
        if not hasattr(self, "_merges"):
            self._merges = mergeable(self._allocate(0, self.context_len))
        return self._merges

    def _allocate(self, batch_size: int, positions: int):
        return self.model.allocate_cache(batch_size, positions)

    def _finish(self, job: GenerationJob) -> None:
        """Call the job's on_finish with its reasons, then `observe` (the server's metrics) with the job; a callback
        that raises is logged and harms no other job."""
        job.finished_at = time.monotonic()
        try:
            job.on_finish(list(job.reasons))
            if self.observe is not None:
                self.observe(job)
        except Exception:
            log.exception("a request's on_finish failed")

    def _fail(self, job: GenerationJob, error: BaseException) -> None:
        """End `job` alone: its unfinished choices end with "error", and `error` is kept as its failure. Its
        on_finish comes from the iteration when its rows are in the batch, else from the caller (`_finish`)."""
        if isinstance(error, AttnkitError):  # the library refused the request (its client gets a 400): one line
            log.warning("a request was refused: %s", error)
        else:
            log.error("a request failed: %s", error, exc_info=error)
        job.failure = error
        job.reasons = ["error" if reason is None else reason for reason in (job.reasons or [None] * job.n)]

    def _end_running(self, error: BaseException) -> None:
        """End the running jobs after a decoding step they shared failed: the unfinished ones fail, and those whose
        choices had all ended before it (a speculative round delivers its tokens before its caches are rewound) get
        their on_finish too; the waiting jobs stay queued."""
        jobs = self.batch.jobs if self.batch is not None else []
        self._let_go()
        for job in jobs:
            if None in job.reasons:
                self._fail(job, error)
            self._finish(job)

    def _let_go(self) -> None:
        """Drop the running batch (its buffers and cache) and the logits of its last step."""
        self.batch, self.logits = None, None
