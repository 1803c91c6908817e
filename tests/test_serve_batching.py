"""The batching scheduler driven iteration by iteration (no thread, no HTTP): rows that join and leave at any step
get the tokens they get alone, a freed row is taken by the next request without moving the others, the cache
moves only when its columns run out, requests arriving within a step are prefilled together while one arriving
at an idle scheduler starts at once, and a model whose cache cannot merge serves one request at a time."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from generate_models import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from attnkit.errors import InputError
from attnkit.generate import GREEDY, SamplingConfig, generate_tokens, make_generator
from attnkit.generate.sampling import NoDistribution, choice_seed
from attnkit.layers.prefix_cache import PrefixCache
from attnkit.serve.batching import Batch, Closed, GenerationJob, Scheduler
from attnkit.serve.waiting import QueueFull

CONTEXT = 48
SAMPLINGS = (GREEDY, SamplingConfig(), SamplingConfig(temperature=0.7, top_k=4), SamplingConfig(top_p=0.8))
STOP = frozenset({3})  # a token that ends a choice early, as EOS does


class Recorded:
    """A job and what the scheduler passes back: each choice's tokens, and the reasons it finished with."""

    def __init__(self, prompt: list[int], max_new: int, *, sampling: SamplingConfig = GREEDY, seed: int = 0,
                 n: int = 1, stop_ids: frozenset[int] = frozenset(), min_tokens: int = 0) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.reasons: list[str] | None = None
        self.job = GenerationJob(prompt=prompt, max_new_tokens=max_new, sampling=sampling, seed=seed, n=n,
                                 stop_ids=stop_ids, min_tokens=min_tokens, on_token=self._token,
                                 on_finish=self._finish)

    def _token(self, choice: int, token: int) -> bool:
        self.tokens[choice].append(token)
        return False

    def _finish(self, reasons: list[str]) -> None:
        assert self.reasons is None, "on_finish was called twice"
        self.reasons = reasons

    def alone(self, model) -> list[list[int]]:
        """The same request through generate_tokens alone (as Pipeline.generate runs it: choice i from seed + i)."""
        job = self.job
        generators = [make_generator(choice_seed(job.seed, i), "cpu") for i in range(job.n)]
        return generate_tokens(model, [job.prompt] * job.n, max_new_tokens=job.max_new_tokens, context_len=CONTEXT,
                               sampling=job.sampling, generator=generators if job.n > 1 else generators[0],
                               stop_ids=job.stop_ids)


def iterate(scheduler: Scheduler, times: int = 1) -> None:
    with torch.inference_mode():
        for _ in range(times):
            scheduler._iteration()


def drain(scheduler: Scheduler, limit: int = 500) -> None:
    for _ in range(limit):
        if scheduler.batch is None and scheduler.waiting.empty():
            return
        iterate(scheduler)
    raise AssertionError(f"the jobs did not end within {limit} iterations")


@pytest.fixture(scope="module")
def model():
    return tiny_model(max_seq_len=CONTEXT, position="rope", seed=2)[0]


def scheduler_for(model, max_rows: int = 8) -> Scheduler:
    return Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=max_rows)


arrivals = st.lists(
    st.tuples(
        st.integers(0, 5),  # iterations run before this request arrives
        st.lists(st.integers(1, 12), min_size=1, max_size=14),  # its prompt
        st.integers(1, 24),  # max_new_tokens
        st.sampled_from(SAMPLINGS),
        st.integers(1, 3),  # n
        st.booleans(),  # whether token 3 ends a choice
        st.integers(0, 10_000),  # seed
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=30, deadline=None)
@given(arrivals=arrivals, max_rows=st.integers(4, 8))  # n up to 3: one request takes at most max_rows - 1
def test_rows_joining_and_leaving_at_any_step_get_the_tokens_they_get_alone(model, arrivals, max_rows):
    scheduler = scheduler_for(model, max_rows)
    recorded = []
    for wait, prompt, max_new, sampling, n, stops, seed in arrivals:
        iterate(scheduler, wait)
        request = Recorded(prompt, max_new, sampling=sampling, seed=seed, n=n, stop_ids=STOP if stops else frozenset())
        scheduler.submit(request.job)
        recorded.append(request)
    drain(scheduler)
    for request in recorded:
        assert request.reasons is not None and None not in request.reasons
        assert request.tokens == request.alone(model)


def test_a_freed_row_is_taken_by_the_next_request_and_nothing_else_moves(model):
    scheduler = scheduler_for(model, max_rows=4)
    short, long_a, long_b = Recorded([5, 6, 7], 2), Recorded([1, 2, 4, 5], 20), Recorded([7, 8], 20, seed=1,
                                                                                          sampling=SamplingConfig())
    for request in (short, long_a, long_b):
        scheduler.submit(request.job)
    iterate(scheduler)
    batch = scheduler.batch
    assert [job for job, _ in batch.rows] == [short.job, long_a.job, long_b.job]
    store, room = batch.store, batch.room
    iterate(scheduler)  # the short request ends: the last row moves into its place
    assert short.reasons == ["length"]
    assert [job for job, _ in scheduler.batch.rows] == [long_b.job, long_a.job]
    late = Recorded([9, 10], 6, sampling=SamplingConfig(temperature=0.9), seed=5)
    scheduler.submit(late.job)
    iterate(scheduler, 3)
    assert [job for job, _ in scheduler.batch.rows] == [long_b.job, long_a.job, late.job]
    assert scheduler.batch.store is store and scheduler.batch.room == room  # the freed row, in the same buffers
    drain(scheduler)
    for request in (short, long_a, long_b, late):
        assert request.tokens == request.alone(model)


def test_the_cache_moves_only_when_it_must_and_leaves_the_padding_behind(model, monkeypatch):
    moves = []
    moved = Batch.moved

    def recorded_move(batch, rows, positions, shift, allocate):
        after = moved(batch, rows, positions, shift, allocate)
        moves.append((batch.length, batch.room, after.room, shift, after.first))
        return after

    monkeypatch.setattr(Batch, "moved", recorded_move)
    scheduler = scheduler_for(model, max_rows=4)
    recorded = [Recorded(list(range(1, 9)), 40)]  # one long reply, its prompt the widest, beside short ones
    scheduler.submit(recorded[0].job)
    iterations = 0
    while iterations < 150 or scheduler.batch is not None:
        if iterations < 150 and scheduler.running_rows + scheduler.queue_length < 4:  # four rows, whenever one ends
            recorded.append(Recorded([4, 5, 6, 7, 8, 9][: 1 + len(recorded) % 6], 5, sampling=SamplingConfig(),
                                     seed=len(recorded)))
            scheduler.submit(recorded[-1].job)
        iterate(scheduler)
        iterations += 1
        if scheduler.batch is not None:
            assert scheduler.batch.length <= scheduler.batch.room[1]  # the next step finds or makes a free column
    full = [move for move in moves if move[0] == move[1][1]]
    assert full, "the columns never ran out: lengthen the run"
    for length, (rows, positions), (new_rows, _), shift, _ in moves:  # no column left, more rows, or a wider prompt
        assert length == positions or new_rows > rows or shift > 0
    assert all(padding == 0 for *_, shift, padding in moves if shift < 0)  # all-padding columns stayed behind
    assert len(moves) < iterations // 4
    for request in recorded:
        assert request.tokens == request.alone(model)


def test_requests_arriving_within_a_step_are_prefilled_together_and_one_at_an_idle_scheduler_at_once(model):
    scheduler = scheduler_for(model, max_rows=8)
    prefills = []
    prefill = scheduler.decoding.prefill
    scheduler.decoding.prefill = lambda window, cache: prefills.append(window.ids.shape[0]) or prefill(window, cache)
    scheduler.step_seconds = 1e9  # a step that lasts for ever: only an idle scheduler would start a request now
    first = Recorded([1, 2, 3], 12)
    scheduler.submit(first.job)
    iterate(scheduler)
    assert prefills == [1] and scheduler.running_rows == 1
    others = [Recorded([4, 5 + i], 8, sampling=SamplingConfig(), seed=i) for i in range(3)]
    for request in others:
        scheduler.submit(request.job)
    scheduler.step_seconds = 1e9
    iterate(scheduler)
    assert prefills == [1] and scheduler.queue_length == 3  # they wait while the batch steps on
    iterate(scheduler)  # now they have waited a (measured) step: one prefill for the three
    assert prefills == [1, 3] and scheduler.running_rows == 4
    drain(scheduler)
    for request in [first, *others]:
        assert request.tokens == request.alone(model)


def test_requests_that_fill_the_free_rows_join_without_waiting(model):
    scheduler = scheduler_for(model, max_rows=2)
    first, second = Recorded([1, 2], 10), Recorded([3, 4, 5], 10, sampling=SamplingConfig(), seed=3)
    scheduler.submit(first.job)
    iterate(scheduler)
    scheduler.step_seconds = 1e9
    scheduler.submit(second.job)
    iterate(scheduler)
    assert scheduler.running_rows == 2
    drain(scheduler)
    assert first.tokens == first.alone(model) and second.tokens == second.alone(model)


def test_a_model_whose_cache_cannot_merge_serves_one_request_at_a_time():
    windowed = tiny_model(max_seq_len=CONTEXT, position="rope", attention_window=5, seed=4)[0]
    scheduler = scheduler_for(windowed, max_rows=8)
    recorded = [Recorded([1 + i, 2, 3, 4, 5, 6, 7][: 3 + i], 9, sampling=SamplingConfig(), seed=i, n=1 + i % 2)
                for i in range(3)]
    for request in recorded:
        scheduler.submit(request.job)
    for _ in range(100):
        if scheduler.batch is not None:
            assert len(scheduler.batch.jobs) == 1
        iterate(scheduler)
    assert scheduler.batch is None
    for request in recorded:
        assert request.tokens == request.alone(windowed)


@pytest.mark.parametrize(("window", "first_new", "merges"), [(5, 3, False), (CONTEXT, 20, True)])
def test_a_windowed_model_merges_by_its_window_whatever_the_first_job_allocated(window, first_new, merges):
    """A short first job's cache fits inside a window of 5 (a plain cache), yet its rows cannot merge with a longer
    job's ring buffer: later jobs wait. A window as long as the context never makes a ring buffer, so the jobs
    arriving later join the running one."""
    windowed = tiny_model(max_seq_len=CONTEXT, position="rope", attention_window=window, seed=4)[0]
    scheduler = scheduler_for(windowed, max_rows=8)
    recorded = [Recorded([1, 2], first_new), Recorded([3, 4, 5, 6, 7, 8], 12), Recorded([9, 1, 2], 8)]
    scheduler.submit(recorded[0].job)
    iterate(scheduler)
    for request in recorded[1:]:
        scheduler.submit(request.job)
    most_jobs = 0
    for _ in range(100):
        iterate(scheduler)
        most_jobs = max(most_jobs, len(scheduler.batch.jobs) if scheduler.batch is not None else 0)
    assert scheduler.batch is None
    assert most_jobs == (3 if merges else 1)
    for request in recorded:
        assert request.tokens == request.alone(windowed)


class Poisoned(Recorded):
    """A job whose own part fails: its token callback raises (`where="token"`), or its sampling does (a stand-in for
    settings that sample to nothing, which the edge refuses)."""

    def __init__(self, *args, where: str = "token", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.where = where

    def _token(self, choice: int, token: int) -> bool:
        if self.where == "token":
            raise RuntimeError("this request's own callback failed")
        return super()._token(choice, token)


def poison_sampling(monkeypatch, seed: int) -> None:
    """Sampling fails for every call that includes the rows of the job seeded with `seed`."""
    from attnkit.serve import batching

    sample = batching.select_next_in_groups

    def failing(logits, config, groups, **kwargs):
        if any(generator is not None and generator.initial_seed() == seed for _, generator in groups):
            raise RuntimeError("probability tensor contains inf or nan")
        return sample(logits, config, groups, **kwargs)

    monkeypatch.setattr(batching, "select_next_in_groups", failing)


def poison_logits(monkeypatch, seed: int) -> None:
    """The logits of the job seeded with `seed` are nan (a broken model for that request alone): its rows draw
    NO_TOKEN in the call it shares with others, which go on with their own draws."""
    from attnkit.serve import batching

    sample = batching.select_next_in_groups

    def nan_rows(logits, config, groups, **kwargs):
        logits, start = logits.clone(), 0
        for rows, generator in groups:
            if generator is not None and generator.initial_seed() == seed:
                logits[start:start + rows] = float("nan")
            start += rows
        return sample(logits, config, groups, **kwargs)

    monkeypatch.setattr(batching, "select_next_in_groups", nan_rows)


@pytest.mark.parametrize("where", ["token", "sampling", "nan", "prefill"])
def test_a_job_that_fails_fails_alone_and_the_others_get_the_tokens_they_get_alone(model, monkeypatch, where):
    marker = SamplingConfig(temperature=0.9, top_k=7)
    scheduler = scheduler_for(model, max_rows=8)
    good = [Recorded([1 + i, 2, 3], 6 + i, sampling=SamplingConfig(temperature=0.9, top_k=7 if i % 2 else None),
                     seed=i, n=1 + i % 2) for i in range(4)]
    bad = Poisoned([4, 5], 6, sampling=marker, seed=9, where=where)
    if where in ("sampling", "nan"):  # a good job of the same settings shares its sampling call
        (poison_sampling if where == "sampling" else poison_logits)(monkeypatch, seed=9)
        good[1].job = GenerationJob(**{**vars(good[1].job), "sampling": marker})
    elif where == "prefill":  # prefilling any batch that holds the bad prompt fails
        prefill = scheduler.decoding.prefill

        def failing(window, cache):
            if any(row[-2:] == [4, 5] for row in window.ids.tolist()):
                raise RuntimeError("a kernel failed on this prompt")
            return prefill(window, cache)

        monkeypatch.setattr(scheduler.decoding, "prefill", failing)
    scheduler.submit(good[0].job)
    iterate(scheduler, 2)  # a running batch that the others join
    for request in [good[1], bad, *good[2:]]:
        scheduler.submit(request.job)
    drain(scheduler)
    assert bad.reasons == ["error"] and isinstance(bad.job.failure, RuntimeError)
    if where == "nan":
        assert isinstance(bad.job.failure, NoDistribution) and "no probability distribution" in str(bad.job.failure)
    for request in good:
        assert request.reasons is not None and "error" not in request.reasons
        assert request.job.failure is None
        assert request.tokens == request.alone(model)


def test_one_request_never_takes_every_row_so_a_later_short_one_ends_first(model):
    """A request of n = max_rows choices would hold every row for all its tokens, and a request that came after it
    would wait for it to end: one request takes at most max_rows - 1 rows, and the row left is the later one's."""
    scheduler = scheduler_for(model, max_rows=4)
    with pytest.raises(InputError, match=r"n=4 .*one request takes at most 3 rows"):
        scheduler.submit(Recorded([1, 2], 40, n=4).job)
    ended: list[str] = []
    long, short = Recorded([1, 2], 40, n=3), Recorded([5, 6], 2)
    for name, request in (("long", long), ("short", short)):
        finish = request.job.on_finish
        request.job.on_finish = lambda reasons, name=name, finish=finish: (ended.append(name), finish(reasons))
    scheduler.submit(long.job)
    iterate(scheduler)  # the long request runs alone, on three of the four rows
    scheduler.submit(short.job)
    drain(scheduler)
    assert ended == ["short", "long"] and long.reasons == ["length"] * 3
    assert short.tokens == short.alone(model) and long.tokens == long.alone(model)
    one_row = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=1)
    assert one_row.most_choices == 1  # one row: it is the request's, and no row is said to be kept back
    with pytest.raises(InputError, match=r"at most 1 rows: the server decodes one row at a time\)$"):
        one_row.submit(Recorded([1, 2], 4, n=2).job)


def test_a_request_of_many_prompts_never_takes_every_row_so_a_later_short_one_ends_first(model):
    """A request's prompts together take at most max_rows - 1 rows, as its choices do: a request of six prompts on
    four rows leaves one for a request of three short prompts that comes after it, which end first, one after the
    other on that row; the long request's prompts left wait for its own rows, and are passed over (keeping their
    turn) while the short request's next prompt takes the free row."""
    scheduler = scheduler_for(model, max_rows=4)
    ended: list[str] = []
    long = [Recorded([1 + i, 2], 30) for i in range(6)]
    short = [Recorded([5, 6 + i], 2) for i in range(3)]
    for name, requests in (("long", long), ("short", short)):
        owner = object()
        for request in requests:
            finish = request.job.on_finish
            request.job.on_finish = lambda reasons, name=name, finish=finish: (ended.append(name), finish(reasons))
            request.job.owner = owner
    for request in long:
        scheduler.submit(request.job)
    iterate(scheduler)
    assert len(scheduler.batch.rows) == 3 and scheduler.waiting.head() is long[3].job
    for request in short:
        scheduler.submit(request.job)
    drain(scheduler)
    assert ended == ["short"] * 3 + ["long"] * 6
    for request in (*long, *short):
        assert request.tokens == request.alone(model)


def test_a_request_the_scheduler_cannot_fit_names_the_field_to_change(model):
    """The server's 400 names the field from the refusal itself (`Unfit.param`), not from words in its message."""
    from attnkit.serve.batching import Unfit

    scheduler = scheduler_for(model, max_rows=4)
    with pytest.raises(Unfit) as many:
        scheduler.submit(Recorded([1, 2], 4, n=4).job)
    with pytest.raises(Unfit) as long:
        scheduler.submit(Recorded(list(range(1, 11)), CONTEXT - 5).job)
    assert (many.value.param, long.value.param) == ("n", "max_tokens")
    assert isinstance(many.value, InputError)


def test_realign_moves_each_row_right_by_its_own_shift_within_the_row_and_refuses_a_move_it_cannot_make():
    """`Batch.realign` (a speculative round's rows that kept fewer drafts than another): each row's columns from
    `first` move right by its own shift, keys and values with their ids (GQA's two key heads, two layers); the columns
    a row leaves are padding holding its own keys, never another row's. A shift below 0 (a move left, past the
    columns in use), one of every column in use, or a count of shifts not the rows' is refused, moving nothing."""
    from attnkit.layers.kv_cache import KVCache

    rows, positions, length, first = 3, 8, 6, 1
    store = KVCache.allocate(n_layers=2, batch_size=rows, n_kv_heads=2, head_dim=3, max_len=positions,
                             dtype=torch.float64)
    tag = 100 * torch.arange(rows)[:, None] + torch.arange(positions)[None, :]  # (R, P): row and column, each cell
    for index, layer in enumerate(store.layers):
        layer.keys.copy_((tag + 1000 * index)[:, None, :, None].expand_as(layer.keys))
        layer.values.copy_(-layer.keys)
    mask = torch.zeros(rows, positions, dtype=torch.bool)
    mask[:, first:length] = True
    mask[1, first:3] = False  # a shorter prompt's row
    batch = Batch(store, tag.clone(), mask.clone(), length, [(object(), 0)] * rows)
    held = [batch.ids, batch.attention_mask] + [buffer for layer in store.layers for buffer in (layer.keys,
                                                                                                 layer.values)]
    before = [tensor.clone() for tensor in held]
    for shifts in ([-1, 0, 0], [length - first, 0, 0], [1, 0]):
        with pytest.raises(InputError, match="cannot realign"):
            batch.realign(shifts)
    assert all(torch.equal(old, new) for old, new in zip(before, held, strict=True))

    shifts = [2, 0, 1]
    batch.realign(shifts)
    for row, shift in enumerate(shifts):
        for column in range(first, length):
            source = column - shift
            if source >= first:  # a token moved here: its id, mask and keys
                assert batch.ids[row, column] == tag[row, source]
                assert batch.attention_mask[row, column] == mask[row, source]
                for index, layer in enumerate(store.layers):
                    assert (layer.keys[row, :, column] == tag[row, source] + 1000 * index).all()
                    assert (layer.values[row, :, column] == -(tag[row, source] + 1000 * index)).all()
            else:  # left behind: padding, and nothing of another row's
                assert not batch.attention_mask[row, column]
                keys = torch.cat([layer.keys[row, :, column] % 1000 for layer in store.layers])
                assert ((keys // 100) == row).all()
    assert batch.first == first + 1 and batch.cache.length == length - batch.first  # row 0's padding left behind


def test_a_decoding_step_that_fails_ends_the_running_jobs_and_the_waiting_ones_still_run(model, monkeypatch):
    scheduler = scheduler_for(model, max_rows=3)
    running, waiting = Recorded([1, 2], 8, n=2), Recorded([3, 4], 5, sampling=SamplingConfig(), seed=1, n=2)
    scheduler.submit(running.job)
    scheduler.submit(waiting.job)  # too few free rows: it waits
    iterate(scheduler)
    monkeypatch.setattr(scheduler.decoding, "step", lambda window, cache: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        iterate(scheduler)
    scheduler._end_running(ZeroDivisionError("step"))  # what the scheduler's loop does with the exception
    monkeypatch.undo()
    drain(scheduler)
    assert running.reasons == ["error", "error"] and isinstance(running.job.failure, ZeroDivisionError)
    assert waiting.reasons is not None and waiting.tokens == waiting.alone(model)


def test_jobs_whose_clients_left_while_waiting_leave_the_queue_at_the_next_step(model):
    """A full batch, and a queue of requests whose clients gave up waiting: they end ("cancelled") at the next step
    instead of holding their places until rows free, where a queue full of them turned live requests away (429)."""
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=1, max_waiting=2)
    running, gone = Recorded([1, 2], 30), [Recorded([3], 5), Recorded([4], 5)]
    scheduler.submit(running.job)
    iterate(scheduler)
    for request in gone:
        scheduler.submit(request.job)
        request.job.cancel()
    iterate(scheduler)
    assert [request.reasons for request in gone] == [["cancelled"], ["cancelled"]] and scheduler.waiting.empty()
    assert running.reasons is None  # still running: only the waiting left
    live = [Recorded([5], 3), Recorded([6], 3)]
    for request in live:
        scheduler.submit(request.job)  # room in the queue again
    drain(scheduler)
    assert running.reasons == ["length"] and [request.tokens for request in live] == [r.alone(model) for r in live]


class CountedEvent(threading.Event):
    """A job's `cancelled`, counting how often the scheduler asks it."""

    asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        return super().is_set()


def test_waiting_jobs_join_in_order_and_a_cancelled_one_never_joins_nor_is_looked_at_before_its_turn(model):
    """First come first served behind a full batch: the waiting jobs join in the order they came, the ones whose
    clients gave up (behind a live job, met only when their turn comes) end "cancelled" without a token, and an
    iteration asks only the head of the queue, never the jobs behind it (it scanned the whole queue)."""
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=1, max_waiting=8)
    running = Recorded([1, 2], 6)
    waiting = [Recorded([3 + i], 3) for i in range(5)]
    for request in waiting:
        request.job.cancelled = CountedEvent()
    scheduler.submit(running.job)
    iterate(scheduler)
    for request in waiting:
        scheduler.submit(request.job)
    waiting[1].job.cancel()
    waiting[3].job.cancel()
    iterate(scheduler, 3)  # the batch is full: nothing joins
    assert [request.job.cancelled.asked for request in waiting[1:]] == [0, 0, 0, 0]
    joined = []
    scheduler.observe = joined.append  # the order the jobs end in: one row, so the order they joined in
    drain(scheduler)
    assert [request.reasons for request in waiting] == [["length"], ["cancelled"], ["length"], ["cancelled"],
                                                        ["length"]]
    assert waiting[1].tokens == waiting[3].tokens == [[]]
    live = [waiting[i] for i in (0, 2, 4)]
    assert [job for job in joined if job.reasons == ["length"]] == [running.job, *(r.job for r in live)]
    assert [request.tokens for request in live] == [request.alone(model) for request in live]


def test_a_full_queue_frees_the_places_of_cancelled_jobs_before_it_refuses_a_request(model):
    """The queue limit counts the jobs whose clients are still there: a full queue whose jobs gave up takes a new
    request (each cancelled job then ends "cancelled" at the next step); a queue full of live jobs refuses it."""
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=1, max_waiting=2)
    running, first, second = Recorded([1, 2], 6), Recorded([3], 3), Recorded([4], 3)
    scheduler.submit(running.job)
    iterate(scheduler)
    scheduler.submit(first.job)
    scheduler.submit(second.job)
    first.job.cancel()
    late, later = Recorded([5], 3), Recorded([6], 3)
    scheduler.submit(late.job)  # first's place
    with pytest.raises(QueueFull):
        scheduler.submit(later.job)
    assert scheduler.queue_length == 2
    drain(scheduler)
    assert first.reasons == ["cancelled"] and first.tokens == [[]] and later.reasons is None
    assert [second.reasons, late.reasons] == [["length"], ["length"]]


def test_closing_ends_every_job_running_and_waiting_and_refuses_new_ones(model):
    """What the server does when told to stop: each job, in the batch or in the queue, gets its on_finish once, its
    open choices "error" and its failure `Closed`; a job submitted after is refused."""
    scheduler = scheduler_for(model, max_rows=2)
    running, waiting = Recorded([1, 2], 30), Recorded([3, 4], 5)
    scheduler.submit(running.job)
    iterate(scheduler, 3)
    scheduler.submit(waiting.job)  # no free row: it waits
    iterate(scheduler)
    scheduler.close()
    scheduler._end_all()  # what the scheduler's loop does once closed
    assert running.reasons == ["error"] and 0 < len(running.tokens[0]) < 30 and waiting.reasons == ["error"]
    assert isinstance(running.job.failure, Closed) and isinstance(waiting.job.failure, Closed)
    assert scheduler.batch is None and scheduler.waiting.empty()
    with pytest.raises(Closed):
        scheduler.submit(Recorded([5], 2).job)


def test_a_fixed_shape_step_over_the_batchs_static_view_gives_the_tokens_of_the_eager_one(model):
    """Rows stepped by StaticDecoding (its eager reference step, which torch.compile and the captured step are held
    to) over `Batch.static_cache`, joining and leaving at several steps, get the tokens they get alone, and the
    cache moves as it does under eager steps."""
    from attnkit.generate.static_decode import StaticDecoding

    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=3,
                          decoding=StaticDecoding(model, compile=False))
    requests = [Recorded([1, 2, 4, 5], 20), Recorded([7, 8], 6, sampling=SamplingConfig(temperature=0.7), seed=3, n=2),
                Recorded([5, 6, 7, 8, 9, 10, 11], 30, stop_ids=STOP),
                Recorded([9], 12, sampling=SamplingConfig(top_k=4))]
    for wait, request in zip((0, 2, 1, 5), requests, strict=True):
        iterate(scheduler, wait)
        scheduler.submit(request.job)
    drain(scheduler)
    assert all(request.tokens == request.alone(model) for request in requests)


SYSTEM = [5, 1, 7, 2, 9, 4, 11, 6, 3, 8, 10, 12, 2, 5, 7, 1, 9, 9, 4, 6]  # a prompt's shared start


@pytest.mark.parametrize("position", ["rope", "learned", "alibi"])
@settings(max_examples=12, deadline=None)
@given(arrivals=st.lists(st.tuples(
    st.integers(0, 3),  # iterations run before this request arrives
    st.integers(0, len(SYSTEM)),  # how much of the shared start its prompt has
    st.lists(st.integers(1, 12), min_size=1, max_size=6),  # then its own tokens
    st.sampled_from(SAMPLINGS), st.integers(1, 2), st.integers(0, 10_000),  # sampling, n, seed
), min_size=2, max_size=7))
def test_prompts_that_share_a_prefix_get_the_tokens_they_get_alone_from_the_prefix_cache(position, arrivals):
    """Prefixes reused across requests and across the rows of one prefill (blocks of 4 tokens, so prompts reuse
    whole and part blocks at every offset) leave every request's tokens as they are without the cache."""
    model = tiny_model(max_seq_len=CONTEXT, position=position, seed=5)[0]
    cache = PrefixCache(max_bytes=1 << 20, block_size=4)
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=6, prefix_cache=cache)
    recorded = []
    for wait, shared, own, sampling, n, seed in arrivals:
        iterate(scheduler, wait)
        request = Recorded(SYSTEM[:shared] + own, 6, sampling=sampling, seed=seed, n=n)
        scheduler.submit(request.job)
        recorded.append(request)
    drain(scheduler)
    for request in recorded:
        assert request.tokens == request.alone(model)
    assert cache.queried == sum(len(r.job.prompt) * r.job.n for r in recorded)


def test_a_request_after_one_with_the_same_start_computes_only_the_rest_and_its_logits_are_unchanged(model):
    cache = PrefixCache(max_bytes=1 << 20, block_size=4)
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=4, prefix_cache=cache)
    widths = []  # the columns each prefill computes
    prefill = scheduler.decoding.prefill
    scheduler.decoding.prefill = lambda window, kv: widths.append(window.ids.shape[1] - kv.length) or prefill(window,
                                                                                                              kv)
    first, second = Recorded(SYSTEM + [3], 4), Recorded(SYSTEM + [4, 2], 4)
    scheduler.submit(first.job)
    drain(scheduler)
    scheduler.submit(second.job)
    iterate(scheduler)
    assert widths == [21, 2]  # the second computes its own two tokens: the 20 shared ones are 5 kept blocks
    assert cache.hits == 20 and cache.queried == 21 + 22
    uncached = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=4)
    uncached.submit(Recorded(SYSTEM + [4, 2], 4).job)
    iterate(uncached)
    torch.testing.assert_close(scheduler.logits, uncached.logits)
    drain(scheduler)
    assert second.tokens == second.alone(model)


@torch.no_grad()
def penalised_greedy(model, prompt: list[int], n: int, *, presence: float = 0.0, frequency: float = 0.0,
                     stop: frozenset[int] = frozenset(), min_tokens: int = 0) -> list[int]:
    """Greedy decoding with OpenAI's presence and frequency penalties and vLLM's min_tokens, from their definitions:
    the whole sequence through the model at each step, each logit lowered by c * frequency + (c > 0) * presence (c:
    the token's count in the reply), the stop tokens at -inf before `min_tokens` tokens."""
    ids, reply = list(prompt), []
    for _ in range(n):
        logits = model(torch.tensor([ids])).logits[0, -1].tolist()
        for token in set(reply):
            logits[token] -= reply.count(token) * frequency + presence
        if len(reply) < min_tokens:
            for token in stop:
                logits[token] = float("-inf")
        token = max(range(len(logits)), key=logits.__getitem__)
        if token in stop:
            break
        reply.append(token)
        ids.append(token)
    return reply


def test_penalties_and_min_tokens_hold_each_request_to_their_definitions_beside_others(model):
    scheduler = scheduler_for(model, max_rows=6)
    prompt = [1, 2, 3, 4]
    first = penalised_greedy(model, prompt, 1)[0]  # the token greedy picks first: held back by min_tokens below
    penalised = Recorded(prompt, 12, sampling=SamplingConfig(temperature=0.0, presence_penalty=0.8,
                                                             frequency_penalty=0.5))
    held = Recorded(prompt, 12, stop_ids=frozenset({first}), min_tokens=3)
    repeating = Recorded([5, 6, 5, 6], 10, sampling=SamplingConfig(temperature=0.9, repetition_penalty=1.6), seed=7,
                         n=2)
    plain = Recorded(prompt, 12)
    for wait, request in zip((0, 1, 0, 2), (plain, penalised, held, repeating), strict=True):
        iterate(scheduler, wait)
        scheduler.submit(request.job)
    drain(scheduler)
    assert penalised.tokens == [penalised_greedy(model, prompt, 12, presence=0.8, frequency=0.5)]
    assert penalised.tokens != plain.tokens  # the penalties changed the reply (else the test shows nothing)
    assert held.tokens == [penalised_greedy(model, prompt, 12, stop=frozenset({first}), min_tokens=3)]
    assert len(held.tokens[0]) >= 3  # without min_tokens it would stop at once, at `first`
    assert repeating.tokens == repeating.alone(model)  # the repetition penalty as Pipeline.generate applies it
    assert plain.tokens == [penalised_greedy(model, prompt, 12)]


def test_kv_cache_usage_is_the_share_of_the_batchs_positions_holding_a_rows_keys(model):
    scheduler = scheduler_for(model, max_rows=4)
    assert scheduler.kv_cache_usage == 0.0
    for request in (Recorded([1, 2, 3, 4, 5], 8), Recorded([6, 7], 8, n=2, sampling=SamplingConfig(), seed=1)):
        scheduler.submit(request.job)
    for _ in range(4):
        iterate(scheduler)
        batch = scheduler.batch
        rows, positions = batch.room
        held = batch.attention_mask[: len(batch.rows), : batch.length].sum().item()  # every real column
        assert scheduler.kv_cache_usage == pytest.approx(held / (rows * positions))
        assert scheduler.running_requests == 2 and scheduler.running_rows == 3


def test_the_iteration_counters_give_the_mean_batch_and_the_prefills(model):
    """Two requests prefilled together, one of 3 tokens and one of 5: five iterations choose tokens, for 2, 2, 2, 1
    and 1 rows (the first leaves after its third), in one prefill; a third request joining later takes a second."""
    scheduler = scheduler_for(model, max_rows=4)
    for request in (Recorded([1, 2, 3], 3), Recorded([4, 5, 6, 7], 5)):
        scheduler.submit(request.job)
    drain(scheduler)
    assert (scheduler.iterations, scheduler.rows_chosen, scheduler.prefills) == (5, 8, 1)
    assert scheduler.rows_chosen == scheduler.tokens
    assert scheduler.iteration_seconds > 0
    scheduler.submit(Recorded([8, 9], 2).job)
    drain(scheduler)
    assert (scheduler.iterations, scheduler.rows_chosen, scheduler.prefills) == (7, 10, 2)


def test_each_choice_of_a_seeded_request_is_the_request_of_one_choice_seeded_seed_plus_its_index(model):
    scheduler = scheduler_for(model, max_rows=8)
    sampling = SamplingConfig(temperature=1.0)
    several = Recorded([1, 2, 3], 10, sampling=sampling, seed=11, n=3)
    singles = [Recorded([1, 2, 3], 10, sampling=sampling, seed=11 + i) for i in range(3)]
    for request in (several, *singles):
        scheduler.submit(request.job)
        iterate(scheduler)
    drain(scheduler)
    assert several.tokens == [single.tokens[0] for single in singles]
    assert len({tuple(tokens) for tokens in several.tokens}) == 3  # three different samples


def test_a_conversations_next_turn_reuses_the_reply_of_the_last(model):
    cache = PrefixCache(max_bytes=1 << 20, block_size=4)
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=4, prefix_cache=cache)
    first = Recorded([5, 1, 7, 2, 9, 4], 12)
    scheduler.submit(first.job)
    drain(scheduler)
    assert len(first.tokens[0]) == 12  # 6 + 11 tokens' keys were cached: 4 whole blocks
    turn = Recorded(first.job.prompt + first.tokens[0][:10] + [3], 5, sampling=SamplingConfig(), seed=2)
    hits = cache.hits
    scheduler.submit(turn.job)
    drain(scheduler)
    assert cache.hits - hits == 16  # the prompt's block and three of the reply's (only the first is, without them)
    assert turn.tokens == turn.alone(model)


def test_a_failed_requests_reply_is_not_kept(model):
    cache = PrefixCache(max_bytes=1 << 20, block_size=4)
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=4, prefix_cache=cache)
    failing = Recorded([5, 1, 7, 2, 9, 4, 8, 8], 12)
    told = failing.job.on_token

    def on_token(choice: int, token: int) -> bool:
        if len(failing.tokens[0]) == 9:
            raise RuntimeError("the client's callback broke")
        return told(choice, token)

    failing.job.on_token = on_token
    scheduler.submit(failing.job)
    drain(scheduler)
    assert failing.reasons == ["error"]
    assert len(cache.blocks) == 2  # the prompt's two blocks, none of the reply's


class Refused(Recorded):
    """A job whose token callback refuses its request as the library does (a grammar the tokenizer cannot follow)."""

    def _token(self, choice: int, token: int) -> bool:
        raise InputError("the grammar cannot start with this char tokenizer")


def test_a_request_the_library_refuses_is_logged_in_a_line_and_a_failure_with_its_traceback(model, caplog):
    scheduler = scheduler_for(model)
    refused, failed = Refused([1, 2], 4), Poisoned([3, 4], 4)
    with caplog.at_level(logging.INFO, logger="attnkit.serve.batching"):
        for request in (refused, failed):
            scheduler.submit(request.job)
        drain(scheduler)
    assert refused.reasons == ["error"] and failed.reasons == ["error"]
    logged = {str(record.exc_info[1] if record.exc_info else record.getMessage()): record for record in caplog.records}
    refusal = next(record for text, record in logged.items() if "cannot start" in text)
    failure = next(record for text, record in logged.items() if "own callback failed" in text)
    assert refusal.exc_info is None and "cannot start" in refusal.getMessage()  # the client's 400: no traceback
    assert failure.exc_info is not None  # the server's own failure keeps its traceback


def test_the_server_never_chooses_a_padded_vocabularys_ids_past_the_tokenizers():
    """The server's decoding loop chose the ids past the tokenizer's size (which name no text) where the model made
    them likely, as Pipeline.generate no longer does; with `writable` (the served tokenizer's size) it never does,
    and each request gets Pipeline.generate's tokens, greedy and sampled."""
    model = tiny_model(max_seq_len=CONTEXT, position="rope", seed=5)[0]
    with torch.no_grad():
        model.stack.embeddings.token.weight[10:] *= 50  # the output head shares the embedding's rows
    prompt = [1, 2, 3]
    for writable in (None, 10):
        scheduler = Scheduler(model, context_len=CONTEXT, pad_id=0, max_rows=4, writable=writable)
        requests = [Recorded(prompt, 8), Recorded(prompt, 8, sampling=SamplingConfig(), seed=4, n=2)]
        for request in requests:
            scheduler.submit(request.job)
        drain(scheduler)
        written = [t for request in requests for choice in request.tokens for t in choice]
        if writable is None:
            assert max(written) >= 10  # the padding ids win without the mask
            continue
        assert max(written) < 10
        for request in requests:
            job = request.job
            generators = [make_generator(choice_seed(job.seed, i), "cpu") for i in range(job.n)]
            alone = generate_tokens(model, [prompt] * job.n, max_new_tokens=8, context_len=CONTEXT,
                                    sampling=job.sampling, generator=generators if job.n > 1 else generators[0],
                                    writable=writable)
            assert request.tokens == alone


class Fills(TorchFunctionMode):
    """Watches the tensor calls made under it: the ids each in-place index fill is given, and how many clones."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[torch.Tensor] = []
        self.clones = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.index_fill_:
            self.ids.append(args[2])
        self.clones += func is torch.Tensor.clone
        return func(*args, **(kwargs or {}))


def test_a_jobs_held_back_stop_ids_are_one_tensor_for_all_its_steps(model):
    """A job short of its min_tokens had its stop ids made into a new tensor at every step: it is built once, at its
    prefill, and every step holds back the same one; the tokens are those of the definition."""
    scheduler = scheduler_for(model)
    prompt = [1, 2, 3, 4]
    first = penalised_greedy(model, prompt, 1)[0]
    held = Recorded(prompt, 8, stop_ids=frozenset({first}), min_tokens=4)
    scheduler.submit(held.job)
    with Fills() as fills:
        drain(scheduler)
    assert held.tokens == [penalised_greedy(model, prompt, 8, stop=frozenset({first}), min_tokens=4)]
    assert len(fills.ids) >= 3 and all(ids is fills.ids[0] for ids in fills.ids)


def test_the_jobs_held_back_in_a_step_share_one_copy_of_the_logits(model):
    """Each job short of its min_tokens copied the (B, V) logits again to hold its stop tokens back: the step makes
    one copy for all of them, and each job's rows hold back its own stop tokens alone."""
    scheduler = scheduler_for(model)
    stops = (frozenset({5}), frozenset({7, 9}), frozenset({5, 11}))
    held = [Recorded([1, 2, 3], 8, n=n, stop_ids=stop, min_tokens=4) for n, stop in zip((1, 2, 1), stops, strict=True)]
    free = Recorded([4, 5], 8, stop_ids=frozenset({5}))
    for request in (held[0], free, *held[1:]):
        scheduler.submit(request.job)
    iterate(scheduler)  # prefilled together: the held back ids are built
    jobs = [held[0].job, free.job, held[1].job, held[2].job]
    logits = torch.randn(5, 16)  # (B, V): the rows of the four jobs, in order
    with Fills() as fills:
        out = scheduler._held_back(jobs, logits)
    assert fills.clones == 1
    expected = logits.clone()
    for rows, stop in ((slice(0, 1), {5}), (slice(2, 4), {7, 9}), (slice(4, 5), {5, 11})):
        expected[rows, sorted(stop)] = float("-inf")
    torch.testing.assert_close(out, expected)
    assert not logits.isinf().any()  # the raw logits stay, for the log-probabilities
