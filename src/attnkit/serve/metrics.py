"""The server's counters, written as Prometheus text (GET /metrics), named in Prometheus's conventions (base units,
`_total` counters, `_seconds` histograms), after vLLM's where it has one:

    attnkit_requests_total{path,status}           counter    requests answered
    attnkit_request_seconds_sum / _count          counter    time spent answering requests
    attnkit_prompt_tokens_total                   counter    prompt tokens of generation requests (vLLM's prompt_tokens)
    attnkit_generated_tokens_total                counter    tokens generated (vLLM's generation_tokens)
    attnkit_tokens_per_second                     gauge      tokens generated per second over the last 10 s (since
                                                             the scrape before, when scrapes are further apart)
    attnkit_time_to_first_token_seconds           histogram  from a generation request's queueing to its first token
    attnkit_time_per_output_token_seconds         histogram  a request's time from its first token to its last, per
                                                             token after the first
    attnkit_e2e_request_latency_seconds           histogram  from its queueing to its end
    attnkit_num_requests_running / _waiting       gauge      generation requests being decoded / waiting to join
                                                             (one whose client left counts until admission meets it)
    attnkit_batch_size                            gauge      sequences being decoded (a request of n: n)
    attnkit_queue_length                          gauge      as num_requests_waiting (its older name)
    attnkit_kv_cache_usage_ratio                  gauge      the running batches' cache positions that hold keys
    attnkit_scheduler_iterations_total            counter    scheduler iterations that chose tokens: each admits the
                                                             waiting requests that join (a prefill), chooses every
                                                             running row's next token and runs a decoding step
    attnkit_scheduler_iteration_seconds_total     counter    their time; on a GPU with the wait for the device (the
                                                             tokens are read), so over an interval: the time a step
                                                             takes as the server runs it
    attnkit_scheduler_rows_total                  counter    rows the iterations chose a token for (per iteration: the
                                                             mean batch size)
    attnkit_prefills_total                        counter    prefill forward passes (requests joining together share
                                                             one)
    attnkit_prefix_cache_queries_total            counter    prompt tokens looked up in the prefix cache
    attnkit_prefix_cache_hits_total               counter    of those, tokens whose keys and values were reused
    attnkit_prefix_cache_hit_rate                 gauge      hits / queries since the server started
    attnkit_prefix_cache_bytes                    gauge      memory the kept blocks take (`layers/prefix_cache.py`)
    attnkit_spec_decode_num_drafts_total          counter    with --draft: drafts the target scored, one per row and
                                                             round (vLLM's spec_decode_num_drafts: the mean
                                                             acceptance length is 1 + accepted / drafts)
    attnkit_spec_decode_num_draft_tokens_total    counter    tokens the draft proposed (K per row and round)
    attnkit_spec_decode_num_accepted_tokens_total counter    of those, tokens the target accepted
    attnkit_spec_decode_draft_acceptance_rate     gauge      accepted / proposed since the server started

The counts of generation (tokens, requests, rows, iterations, the cache's positions) are those of the plain and the
speculative rows together (`Scheduler.parts`): with --draft, two batches run, and the gauges count both.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque

from attnkit.serve.batching import GenerationJob, Scheduler

WINDOW_SECONDS = 10.0
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0, 160.0, 640.0)  # seconds (vLLM's time-to-first-token buckets)


class Histogram:
    """A Prometheus histogram: cumulative counts of observations at most each bucket's bound, their sum and count."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)  # per bucket, not cumulative; the last: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self) -> list[str]:
        lines = [f"# HELP attnkit_{self.name} {self.help_text}", f"# TYPE attnkit_{self.name} histogram"]
        total = 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'attnkit_{self.name}_bucket{{le="{le}"}} {total}')
        return lines + [f"attnkit_{self.name}_sum {round(self.sum, 6)}", f"attnkit_{self.name}_count {total}"]


class Metrics:
    """Counts requests and their time; reads tokens, queue and batch from the scheduler when written."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.seconds = 0.0
        self.count = 0
        self._token_marks: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])  # (time, tokens so far)
        self.prompt_tokens = 0
        self.first_token = Histogram("time_to_first_token_seconds", "Time from a generation request's queueing to "
                                     "its first token.")
        self.per_token = Histogram("time_per_output_token_seconds", "A generation request's time from its first "
                                   "token to its last, per token after the first.")
        self.latency = Histogram("e2e_request_latency_seconds", "Time from a generation request's queueing to its "
                                 "end.")
        self._lock = threading.Lock()

    def record(self, path: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(path, status)] += 1
            self.seconds += seconds
            self.count += 1

    def observe(self, job: GenerationJob) -> None:
        """Count a generation request that ended (the scheduler's `observe`, on its thread)."""
        with self._lock:
            self.prompt_tokens += len(job.prompt)
            self.latency.observe(job.finished_at - job.queued)
            if job.first_token_at is not None:
                self.first_token.observe(job.first_token_at - job.queued)
            if job.produced > 1:
                self.per_token.observe((job.last_token_at - job.first_token_at) / (job.produced - 1))

    def tokens_per_second(self, tokens: int) -> float:
        """The rate over the last WINDOW_SECONDS, from the total `tokens` now and the totals seen at earlier scrapes
        (and at the start): since the latest mark at least WINDOW_SECONDS old, so that scrapes further apart (every
        15 s, Prometheus's usual interval) give the rate since the scrape before, not 0."""
        now = time.monotonic()
        with self._lock:
            marks = self._token_marks
            marks.append((now, tokens))
            while len(marks) > 1 and now - marks[1][0] >= WINDOW_SECONDS:
                marks.popleft()
            then, before = marks[0]
        return (tokens - before) / (now - then) if now > then else 0.0

    def text(self, scheduler: Scheduler | None) -> str:
        """Every metric of the module docstring; those of generation read from `scheduler` (None: a run that does
        not generate, whose counts stay 0)."""
        lines = ["# HELP attnkit_requests_total Requests answered, by path and status.",
                 "# TYPE attnkit_requests_total counter"]
        with self._lock:
            for (path, status), n in sorted(self.requests.items()):
                lines.append(f'attnkit_requests_total{{path="{_escape(path)}",status="{status}"}} {n}')
            seconds, count, prompt_tokens = self.seconds, self.count, self.prompt_tokens
            for histogram in (self.first_token, self.per_token, self.latency):
                lines += histogram.lines()
        parts = scheduler.parts if scheduler is not None else []

        def total(name: str) -> float:
            return sum(getattr(part, name) for part in parts)

        tokens = total("tokens")
        waiting = scheduler.queue_length if scheduler is not None else 0
        rate = self.tokens_per_second(tokens)
        values = [
            ("prompt_tokens_total", "counter", prompt_tokens, "Prompt tokens of generation requests that ended."),
            ("generated_tokens_total", "counter", tokens, "Tokens generated."),
            ("tokens_per_second", "gauge", round(rate, 3), "Tokens generated per second over the last 10 s, or since "
             "the scrape before when longer ago."),
            ("num_requests_running", "gauge", scheduler.running_requests if scheduler is not None else 0,
             "Generation requests being decoded (with --draft, the plain and the speculative batches' together)."),
            ("num_requests_waiting", "gauge", waiting, "Generation requests waiting to join a batch."),
            ("queue_length", "gauge", waiting, "Requests waiting to join a batch (num_requests_waiting)."),
            ("batch_size", "gauge", scheduler.running_rows if scheduler is not None else 0,
             "Sequences being decoded, n for a request of n (with --draft, both batches' together)."),
            ("kv_cache_usage_ratio", "gauge", round(scheduler.kv_cache_usage, 6) if scheduler is not None else 0,
             "Share of the running batches' cache positions that hold keys."),
            ("scheduler_iterations_total", "counter", total("iterations"),
             "Scheduler iterations that chose tokens (each: admission, the rows' next tokens, a decoding step)."),
            ("scheduler_iteration_seconds_total", "counter", round(total("iteration_seconds"), 6),
             "Time those iterations took, with the wait for the device."),
            ("scheduler_rows_total", "counter", total("rows_chosen"),
             "Rows the iterations chose a token for (per iteration: the mean batch size)."),
            ("prefills_total", "counter", total("prefills"),
             "Prefill forward passes (requests joining together share one)."),
            ("request_seconds_sum", "counter", round(seconds, 6), "Time spent answering requests."),
            ("request_seconds_count", "counter", count, "Requests timed."),
        ]
        prefix_cache = scheduler.prefix_cache if scheduler is not None else None
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
        speculative = scheduler.speculative if scheduler is not None else None
        if speculative is not None:
            stats = speculative.speculation
            values += [
                ("spec_decode_num_drafts_total", "counter", stats.drafts, "Drafts the target scored, one per row and "
                 "speculative round."),
                ("spec_decode_num_draft_tokens_total", "counter", stats.drafted, "Tokens the draft model proposed."),
                ("spec_decode_num_accepted_tokens_total", "counter", stats.accepted, "Proposed tokens the target "
                 "accepted."),
                ("spec_decode_draft_acceptance_rate", "gauge", round(stats.acceptance_rate, 6), "Share of the "
                 "proposed tokens the target accepted, since the server started."),
            ]
        for name, kind, value, help_text in values:
            lines += [f"# HELP attnkit_{name} {help_text}", f"# TYPE attnkit_{name} {kind}", f"attnkit_{name} {value}"]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
