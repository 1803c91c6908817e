"""What the kernel micro-benchmarks share: their command line, the timer, and writing results beside the others."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit.outputs import atomic_write

ROOT = Path(__file__).resolve().parents[1]  # the repository
DATA = ROOT / ".." / "shared" / "data"  # the real data sets, beside the repository and never copied into it
RESULTS = ROOT / "benchmarks" / "results"


def parse_args(name: str, doc: str | None, argv: list[str] | None, *, repeats: int) -> argparse.Namespace:
    """`--threads` (default 1, applied here), `--repeats`, `--machine`."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--machine", default=platform.node() or "cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that wall time covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def synced(run: Callable[[], object], device: str) -> Callable[[], None]:
    """`run`, then `synchronize(device)`: what a timed repetition on a GPU has to be."""

    def run_and_wait() -> None:
        run()
        synchronize(device)

    return run_and_wait


def timed_runs(run: Callable[[], object], repeats: int, *, warmup: int = 1) -> list[float]:
    """Wall times of `repeats` calls of `run`, after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls, after one untimed call."""
    return statistics.median(timed_runs(run, repeats))


def write_results(stem: str, name: str, args: argparse.Namespace, argv: list[str] | None, rows: list[dict],
                  table: list[str]) -> None:
    """results/<stem>.json (rows with the machine and the command) and results/<stem>.md (`table` under a header)."""
    command = f"python -m benchmarks {name} " + " ".join(argv or [])
    report = {"machine": args.machine, "threads": args.threads, "torch": torch.__version__, "command": command,
              "results": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    header = f"Machine `{args.machine}`, {args.threads} thread(s), torch {torch.__version__}. Command: `{command}`"
    (RESULTS / f"{stem}.md").write_text("\n".join([header, "", *table]) + "\n")
    print(f"wrote {RESULTS / stem}.json and .md")


def write_report(stem: str, report: dict, table: str) -> None:
    """results/<stem>.json (`report`) and results/<stem>.md (`table`), each written whole or not at all."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write(RESULTS / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    atomic_write(RESULTS / f"{stem}.md", table + "\n")


def load_averages(before: tuple[float, ...], after: tuple[float, ...]) -> str:
    """"load average (1, 5, 15 min) before a, b, c, after d, e, f", for a results table."""
    def three(load):
        return ", ".join(f"{x:.1f}" for x in load)
    return f"load average (1, 5, 15 min) before {three(before)}, after {three(after)}"
