"""The server's counters, written as Prometheus text (GET /metrics).

    attnkit_requests_total{path,status}    requests answered
    attnkit_generated_tokens_total         tokens generated
    attnkit_tokens_per_second              tokens generated per second over the last 10 s
    attnkit_queue_length                   requests waiting to join the batch
    attnkit_batch_size                     sequences in the running batch
    attnkit_request_seconds_sum / _count   time spent answering requests
    attnkit_prefix_cache_queries_total     prompt tokens looked up in the prefix cache (`layers/prefix_cache.py`)
    attnkit_prefix_cache_hits_total        of those, tokens whose keys and values were reused
    attnkit_prefix_cache_hit_rate          hits / queries since the server started
    attnkit_prefix_cache_bytes             memory the kept blocks take
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

from attnkit.layers.prefix_cache import PrefixCache

WINDOW_SECONDS = 10.0


class Metrics:
    """Counts requests and their time; reads tokens, queue and batch from the scheduler when written."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.seconds = 0.0
        self.count = 0
        self._token_marks: deque[tuple[float, int]] = deque()  # (time, tokens so far)
        self._lock = threading.Lock()

    def record(self, path: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(path, status)] += 1
            self.seconds += seconds
            self.count += 1

    def tokens_per_second(self, tokens: int) -> float:
        """The rate over the last WINDOW_SECONDS, from the total `tokens` now and the totals seen before."""
        now = time.monotonic()
        with self._lock:
            marks = self._token_marks
            marks.append((now, tokens))
            while len(marks) > 1 and now - marks[0][0] > WINDOW_SECONDS:
                marks.popleft()
            then, before = marks[0]
        return (tokens - before) / (now - then) if now > then else 0.0

    def text(self, *, tokens: int, queue_length: int, batch_size: int, prefix_cache: PrefixCache | None = None) -> str:
        lines = ["# HELP attnkit_requests_total Requests answered, by path and status.",
                 "# TYPE attnkit_requests_total counter"]
        with self._lock:
            for (path, status), n in sorted(self.requests.items()):
                lines.append(f'attnkit_requests_total{{path="{_escape(path)}",status="{status}"}} {n}')
            seconds, count = self.seconds, self.count
        rate = self.tokens_per_second(tokens)
        values = [
            ("generated_tokens_total", "counter", tokens, "Tokens generated."),
            ("tokens_per_second", "gauge", round(rate, 3), "Tokens generated per second over the last 10 s."),
            ("queue_length", "gauge", queue_length, "Requests waiting to join the batch."),
            ("batch_size", "gauge", batch_size, "Sequences in the running batch."),
            ("request_seconds_sum", "counter", round(seconds, 6), "Time spent answering requests."),
            ("request_seconds_count", "counter", count, "Requests timed."),
        ]
        if prefix_cache is not None:
            values += [
                ("prefix_cache_queries_total", "counter", prefix_cache.queried, "Prompt tokens looked up in the "
                 "prefix cache."),
                ("prefix_cache_hits_total", "counter", prefix_cache.hits, "Prompt tokens whose keys and values the "
                 "prefix cache gave."),
                ("prefix_cache_hit_rate", "gauge", round(prefix_cache.hit_rate, 6), "Share of looked-up prompt tokens "
                 "the prefix cache gave."),
                ("prefix_cache_bytes", "gauge", prefix_cache.bytes, "Memory the prefix cache's blocks take."),
            ]
        for name, kind, value, help_text in values:
            lines += [f"# HELP attnkit_{name} {help_text}", f"# TYPE attnkit_{name} {kind}", f"attnkit_{name} {value}"]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
