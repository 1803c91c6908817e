"""The requests waiting to join the running batch, holding at most `limit` places (the server answers 429 beyond).
Each request takes its turn: a request's jobs (one per prompt) join in the order they came, and the requests take
turns, one job each, so that a request of many prompts cannot keep a request that came after it waiting until all of
its prompts have run (Nagle's fair queuing, round robin). A request that arrives takes its turn before the one just
served. Admission looks at the head job of the request whose turn it is and the cancelled ones met before it, never
the whole queue; a request that holds its share of the rows is passed over, keeping its turn, and the next request's
head is looked at (`pop_if`'s passes): at most one head per request.

One request's jobs hold at most `share` places, half the queue's: its further jobs wait behind them holding none,
and each takes a place as one before it joins the batch. So a request of many prompts never fills the queue and
turns every other client away with 429 until its prompts have joined (as one request's choices take at most all but
one of the batch's rows); the other half stays open to the requests after it.

    limit 8, share 4:  A: [ a1 a2 a3 a4 | a5 a6 a7 a8 ]   B: [ b1 ]   C: [ c1 c2 c3 ]   -> 8 places held; D: 429
                       (a5..a8 hold no place; when a1 joins, a5 takes its place)

    submit  ->  A: [ a1  a2~  a3 ]   B: [ b1 ]   C: [ c1~  c2 ]
    admission:  a1 joins (or waits, first, for a free row); then B's b1, then C's c2 (c1~, its client gone, set
                aside where it is met), then A's a3 (a2~ set aside)
    a full queue: before a request is refused, the cancelled jobs still queued are set aside, so jobs whose clients
    gave up never turn a live request away

A job set aside is handed to the scheduler's thread (`take_set_aside`), which ends it ("cancelled"): every job's
callbacks run on that thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class QueueFull(Exception):
    """The waiting queue is full; the caller should try again later."""


class Cancellable(Protocol):
    cancelled: threading.Event  # set when the job's client has gone (or its time is up)
    owner: object  # the request it is part of (None: a request of its own)


Job = TypeVar("Job", bound=Cancellable)


class WaitingQueue(Generic[Job]):
    """Jobs by request, the requests in turn, holding at most `limit` places (a request's jobs hold at most `share`).
    `put` is called from any thread, the rest from the scheduler's; every call holds the queue's lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._turns: OrderedDict[int, deque[Job]] = OrderedDict()  # request -> its jobs; the request first in turn
        self._size = 0  # jobs in _turns
        self._served: int | None = None  # the request that took the last turn, while it has jobs queued (`_drop`)
        self._set_aside: list[Job] = []  # cancelled jobs taken out of the queue, not yet ended
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The jobs waiting, those that hold no place too."""
        return self._size

    @property
    def share(self) -> int:
        """The places one request's jobs hold at most: half the queue's (at least one)."""
        return max(1, self.limit // 2)

    def empty(self) -> bool:
        return not self._size

    def put(self, job: Job) -> None:
        """Queue `job` last among its request's; QueueFull when it needs a place (its request holds fewer than
        `share`) and `limit` places are held by jobs whose clients are still there."""
        request = id(job.owner if job.owner is not None else job)
        with self._lock:
            if self._full(request):  # rare: the one whole pass, to free the places of cancelled jobs
                for other, jobs in list(self._turns.items()):
                    self._set_aside += [queued for queued in jobs if queued.cancelled.is_set()]
                    self._turns[other] = deque(queued for queued in jobs if not queued.cancelled.is_set())
                    if not self._turns[other]:
                        self._drop(other)
                self._size = sum(map(len, self._turns.values()))
                if self._full(request):
                    raise QueueFull
            if request not in self._turns:
                self._turns[request] = deque()
                if self._served in self._turns:  # the newcomer's turn comes before the request just served
                    self._turns.move_to_end(self._served)
            self._turns[request].append(job)
            self._size += 1

    def _full(self, request: int) -> bool:
        """Whether a job of `request` finds no place: its request holds fewer than `share` and `limit` are held
        (a request's jobs beyond its share hold none)."""
        if len(self._turns.get(request, ())) >= self.share or self._size < self.limit:
            return False
        return sum(min(len(jobs), self.share) for jobs in self._turns.values()) >= self.limit

    def head(self) -> Job | None:
        """The head job of the request whose turn it is, left queued (None: none waits); the cancelled jobs met
        before it are set aside."""
        with self._lock:
            for request in list(self._turns):  # a request whose jobs were all cancelled is dropped on the way
                jobs = self._live(request)
                if jobs:
                    return jobs[0]
            return None

    def pop_if(self, fits: Callable[[Job], bool], *, passes: Callable[[Job], bool] | None = None) -> Job | None:
        """`head`, taken from the queue when `fits(head)`, its request's turn then passing to the next; None when none
        waits or it does not fit (it stays, and its request keeps the turn). A request whose head `passes` (one that
        holds its share of the rows) is passed over, keeping its place, and the next request's head is looked at."""
        with self._lock:
            for request in list(self._turns):
                jobs = self._live(request)
                if not jobs or (passes is not None and passes(jobs[0])):
                    continue
                if not fits(jobs[0]):
                    return None
                job = jobs.popleft()
                self._size -= 1
                self._served = request
                if jobs:
                    self._turns.move_to_end(request)
                else:
                    self._drop(request)
                return job
            return None

    def _live(self, request: int) -> deque[Job] | None:
        """`request`'s jobs after setting aside the cancelled ones at their head; None (and the request dropped) when
        none is left."""
        jobs = self._turns[request]
        while jobs and jobs[0].cancelled.is_set():
            self._set_aside.append(jobs.popleft())
            self._size -= 1
        if jobs:
            return jobs
        self._drop(request)
        return None

    def _drop(self, request: int) -> None:
        """Take `request`, whose jobs are all gone, out of the turns, and forget that it took the last one: its id
        may be given to a later request, which would otherwise lose a turn to every request after it."""
        del self._turns[request]
        if request == self._served:
            self._served = None

    def take_set_aside(self) -> list[Job]:
        """The cancelled jobs set aside since the last call, in the order they came, for the caller to end."""
        with self._lock:
            jobs, self._set_aside = self._set_aside, []
        return jobs

    def take_all(self) -> list[Job]:
        """Every job, set aside or waiting, emptying the queue (the server is shutting down)."""
        with self._lock:
            jobs = [*self._set_aside, *(job for queued in self._turns.values() for job in queued)]
            self._set_aside, self._size = [], 0
            self._turns.clear()
        return jobs
