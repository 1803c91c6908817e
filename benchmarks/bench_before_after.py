"""Speed before and after a change: the speed suite's generation rows for two checkouts of attnkit, in one run.

    python -m benchmarks before_after --old DIR [--new DIR] [--only CASE ...] [--rows fp32 bf16 int8-dynamic]
                                      [--pairs 9] [--threads 1] [--clock wall | cpu] [--name before-after]

Each checkout builds the row's model with its own harness (`benchmarks/speed.py`'s `step_function`, named
`_step_function` in checkouts from before 3ca609c4, imported in a worker process started in that checkout with its
`src/` first on the path), so the earlier code runs as it ran then.
The two workers stay up and take turns, one greedy generation (the suite's 128 tokens) each, which one goes first
alternating from pair to pair, so a machine shared with other work moves both sides of a pair alike; after one
warm-up generation each, `--pairs` pairs are timed. The ratio is the median of the pairs' own ratios (new over old),
with the spread of the middle half of them. `--clock cpu` times each repetition in its worker's own CPU time
(`time.process_time`, summed over the worker's threads where `--threads` is more than 1) instead of the wall clock:
on a machine other jobs load past its cores (a `nice`d run there gets a small share of them) that is the time the
code took, where the wall clock is mostly the wait. The rows:
fp32 and bf16 eager decoding, and int8 weights with int8 activations (the suite's `attnkit-int8-dynamic`, fp32
elsewhere), for each generation case. The load average is read before and after each row. Results:
benchmarks/results/<name>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from attnkit.machine import CpuCapabilities
from benchmarks.common import RESULTS, ROOT
from benchmarks.speed import CASES, INT8_DYNAMIC

# The speed harness's function that builds a row: its name since 3ca609c4, and its name before that (from 7820aaab,
# which added the harness). An older checkout is history that cannot be renamed, so its worker calls the old name.
ROUTES = ("step_function", "_step_function")
ROWS = (("attnkit", "fp32"), ("attnkit", "bf16"), (INT8_DYNAMIC, "bf16"))  # (the suite's impl, dtype)
ROW_LABELS = {("attnkit", "fp32"): "fp32", ("attnkit", "bf16"): "bf16", (INT8_DYNAMIC, "bf16"): "int8-dynamic"}
# A worker: builds the row in its checkout's harness (argv[6]: the route, `ROUTES`), then times one repetition per
# line read, printing seconds.
WORKER = """
import sys, time, torch
from benchmarks import speed
torch.set_num_threads(int(sys.argv[4]))
clock = time.process_time if sys.argv[5] == "cpu" else time.perf_counter
torch.manual_seed(0)
case = next(c for c in speed.CASES if c.name == sys.argv[1])
model, step = getattr(speed, sys.argv[6])(case, sys.argv[2], sys.argv[3])
print("ready", flush=True)
for _ in sys.stdin:
    start = clock()
    step()
    print(clock() - start, flush=True)
"""


class Worker:
    """One checkout's row, built in its own process, timing one repetition when asked."""

    def __init__(self, tree: Path, case: str, impl: str, dtype: str, threads: int, clock: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
        route = harness_route(tree)
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, case, impl, dtype, str(threads), clock, route],
                                        cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the worker in {tree} did not start ({case} {impl} {dtype})")

    def time_one(self) -> float:
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def harness_route(tree: Path) -> str | None:
    """The function of `ROUTES` that `tree`'s benchmarks/speed.py defines, or None."""
    source = (tree / "benchmarks" / "speed.py").read_text(encoding="utf-8")
    return next((name for name in ROUTES if f"def {name}(" in source), None)


def checkout_problem(tree: Path) -> str | None:
    """Why `tree` cannot be one side of the comparison (not an attnkit checkout, or one whose harness has no route
    to a row, `ROUTES`), or None."""
    speed = tree / "benchmarks" / "speed.py"
    if not speed.is_file() or not (tree / "src" / "attnkit").is_dir():
        return f"{tree} is not an attnkit checkout (no benchmarks/speed.py and src/attnkit)"
    if harness_route(tree) is None:
        return (f"{tree}'s benchmarks/speed.py has neither step_function nor _step_function (it is from before "
                "commit 7820aaab, which added the speed harness): check out a later commit")
    return None


def compare(trees: dict[str, Path], case: str, impl: str, dtype: str, args: argparse.Namespace) -> dict:
    """`args.pairs` alternating pairs of repetitions of the row in both trees: seconds each, and the ratio."""
    load = [os.getloadavg()[0]]
    workers = {side: Worker(tree, case, impl, dtype, args.threads, args.clock) for side, tree in trees.items()}
    try:
        for worker in workers.values():  # warm-up
            worker.time_one()
        seconds: dict[str, list[float]] = {side: [] for side in trees}
        for n in range(args.pairs):
            for side in (list(trees) if n % 2 == 0 else list(reversed(trees))):
                seconds[side].append(workers[side].time_one())
    finally:
        for worker in workers.values():
            worker.close()
    load.append(os.getloadavg()[0])
    ratios = sorted(old / new for new, old in zip(seconds["new"], seconds["old"], strict=True))  # speed, new / old
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    tokens = next(c for c in CASES if c.name == case)
    per_run = tokens.batch_size * tokens.new_tokens
    return {"case": case, "impl": impl, "dtype": dtype, "seconds": seconds,
            "tokens_per_s": {side: per_run / statistics.median(s) for side, s in seconds.items()},
            "ratio_new_over_old": statistics.median(ratios), "ratio_quartiles": [quartiles[0], quartiles[2]],
            "load_average": load}


def markdown(report: dict) -> str:
    lines = [f"CPU: {CpuCapabilities.from_dict(report['cpu']).summary()}; {report['threads']} thread(s). Old: "
             f"`{report['old']}`; new: `{report['new']}`; {report.get('clock', 'wall')} clock. Command: "
             f"`{report['command']}`", "",
             "| case | row | old tok/s | new tok/s | new / old speed (median of pairs) | middle half of pairs | load |",
             "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        label = ROW_LABELS[(r["impl"], r["dtype"])]
        low, high = r["ratio_quartiles"]
        load = " - ".join(f"{x:.1f}" for x in r["load_average"])
        lines.append(f"| {r['case']} | {label} | {r['tokens_per_s']['old']:.1f} | {r['tokens_per_s']['new']:.1f} | "
                     f"{r['ratio_new_over_old']:.2f}x | {low:.2f}-{high:.2f}x | {load} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks before_after", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the earlier checkout (e.g. a git worktree)")
    parser.add_argument("--new", type=Path, default=ROOT, help="the later checkout (default: this one)")
    parser.add_argument("--only", nargs="*", help="generation cases (default: all)")
    parser.add_argument("--rows", nargs="*", choices=sorted(set(ROW_LABELS.values())), help="default: all")
    parser.add_argument("--pairs", type=int, default=9, help="timed repetitions of each side, alternating")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time each repetition by the wall clock or by the worker's CPU time")
    parser.add_argument("--name", default="before-after")
    args = parser.parse_args(argv)
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for side, tree in trees.items():
        if (problem := checkout_problem(tree)) is not None:
            parser.error(f"--{side} {problem}")
    cases = [c.name for c in CASES if c.kind == "generate" and (not args.only or c.name in args.only)]
    results = []
    for case in cases:
        for impl, dtype in ROWS:
            if args.rows and ROW_LABELS[(impl, dtype)] not in args.rows:
                continue
            result = compare(trees, case, impl, dtype, args)
            results.append(result)
            print(json.dumps(result), flush=True)
    report = {"old": str(trees["old"]), "new": str(trees["new"]), "threads": args.threads, "clock": args.clock,
              "cpu": CpuCapabilities.detect().to_dict(), "results": results,
              "command": "python -m benchmarks before_after " + " ".join(argv if argv is not None else sys.argv[1:])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
