"""The requests waiting to join the running batch: first come first served, at most `limit` of them (the server
answers 429 beyond), in a deque that admission pops from the left, so an iteration looks at the jobs it admits and
the cancelled ones met before them, never the whole queue.

    submit  ->  [ A  b~  C  d~  E ]  ->  admission: A joins; b~ (its client gone) is set aside where it is met;
                                                    C joins, or waits at the head for a free row
    a full queue: before a request is refused, the cancelled jobs still queued (d~) are set aside, so jobs whose
    clients gave up never turn a live request away

A job set aside is handed to the scheduler's thread (`take_set_aside`), which ends it ("cancelled"): every job's
callbacks run on that thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class QueueFull(Exception):
    """The waiting queue is full; the caller should try again later."""


class Cancellable(Protocol):
    cancelled: threading.Event  # set when the job's client has gone (or its time is up)


Job = TypeVar("Job", bound=Cancellable)


class WaitingQueue(Generic[Job]):
    """Jobs in the order they came, at most `limit`. `put` is called from any thread, the rest from the scheduler's;
    every call holds the queue's lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._jobs: deque[Job] = deque()
        self._set_aside: list[Job] = []  # cancelled jobs taken out of the queue, not yet ended
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._jobs)

    def empty(self) -> bool:
        return not self._jobs

    def put(self, job: Job) -> None:
        """Queue `job` last; QueueFull when `limit` jobs wait whose clients are still there."""
        with self._lock:
            if len(self._jobs) >= self.limit:  # rare: the one whole pass, to free the places of cancelled jobs
                live = [queued for queued in self._jobs if not queued.cancelled.is_set()]
                self._set_aside += [queued for queued in self._jobs if queued.cancelled.is_set()]
                self._jobs = deque(live)
                if len(live) >= self.limit:
                    raise QueueFull
            self._jobs.append(job)

    def head(self) -> Job | None:
        """The oldest job whose client is still there, left queued (None: none waits); the cancelled jobs before it
        are set aside."""
        with self._lock:
            return self._live_head()

    def pop_if(self, fits: Callable[[Job], bool]) -> Job | None:
        """`head`, taken from the queue when `fits(head)`; None when none waits or it does not fit (it stays)."""
        with self._lock:
            job = self._live_head()
            if job is None or not fits(job):
                return None
            return self._jobs.popleft()

    def _live_head(self) -> Job | None:
        while self._jobs and self._jobs[0].cancelled.is_set():
            self._set_aside.append(self._jobs.popleft())
        return self._jobs[0] if self._jobs else None

    def take_set_aside(self) -> list[Job]:
        """The cancelled jobs set aside since the last call, in the order they came, for the caller to end."""
        with self._lock:
            jobs, self._set_aside = self._set_aside, []
        return jobs

    def take_all(self) -> list[Job]:
        """Every job, set aside or waiting, emptying the queue (the server is shutting down)."""
        with self._lock:
            jobs, self._set_aside = [*self._set_aside, *self._jobs], []
            self._jobs.clear()
        return jobs
