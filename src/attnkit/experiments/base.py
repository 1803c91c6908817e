"""What every experiment shares: its claim, a budget, and a result that ends in a verdict.

An experiment is one function `run(budget, out) -> Result` registered under a name with the claim it tests and the
lecture that makes it. `run_experiment` times it, writes `results.json` and `table.md` into `out`, and returns the
result; plots are PNGs the experiment writes into `out` and names in `Result.plots`.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from attnkit.errors import ConfigError, unknown_name

Budget = Literal["tiny", "small", "full"]  # tiny: seconds (tests); small: minutes on 2 CPU cores; full: the README's
BUDGETS: tuple[str, ...] = get_args(Budget)
Verdict = Literal["held", "did not hold at this scale", "mixed"]
VERDICTS: tuple[str, ...] = get_args(Verdict)


@dataclass(frozen=True)
class ExperimentSettings:
    """What `attnkit experiment` runs; each field is one of its options."""

    name: str | None = field(default=None, metadata={"positional": True})  # the experiment to run (see --list)
    list: bool = False  # print the experiments, each with its claim and lecture
    budget: Budget = "small"  # tiny: seconds (what the tests run); small: minutes on 2 CPU cores; full: larger runs
    out: str | None = None  # directory for results.json, table.md and the plots; none: runs/experiments/NAME


@dataclass
class Result:
    """What an experiment found: a table (rows of column -> value), plots, and a verdict with its reason."""

    verdict: Verdict
    reason: str  # why the verdict, in one or two sentences with the numbers behind it
    key_number: str  # the one figure a reader should remember, e.g. "BLEU 31.2 vs 12.4 at 20+ tokens"
    rows: list[dict[str, Any]]
    plots: list[str] = field(default_factory=list)  # PNG file names inside the output directory
    # Filled in by run_experiment:
    name: str = ""
    claim: str = ""
    lecture: str = ""
    budget: str = ""
    seconds: float = 0.0
    machine: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")

    def table_markdown(self) -> str:
        """The rows as a markdown table (columns in the order of the first row)."""
        if not self.rows:
            return "(no rows)\n"
        columns = list(self.rows[0])
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(asdict(self), indent=2, default=float) + "\n")
        header = (f"# {self.name}\n\nClaim ({self.lecture}): {self.claim}\n\n"
                  f"Verdict: **{self.verdict}**. {self.reason}\n\n")
        footer = f"\nBudget `{self.budget}`, {self.seconds:.0f} s on {self.machine}.\n"
        (out / "table.md").write_text(header + self.table_markdown() + footer)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Experiment:
    name: str
    claim: str
    lecture: str
    run: Callable[[str, Path], Result]


REGISTRY: dict[str, Experiment] = {}


def experiment(name: str, *, claim: str, lecture: str) -> Callable[[Callable[[str, Path], Result]], Callable]:
    """Register `run(budget, out) -> Result` as the experiment `name`."""

    def register(run: Callable[[str, Path], Result]) -> Callable[[str, Path], Result]:
        REGISTRY[name] = Experiment(name, claim, lecture, run)
        return run

    return register


def get(name: str) -> Experiment:
    if name not in REGISTRY:
        raise ConfigError(unknown_name("unknown experiment", name, REGISTRY,
                                       otherwise=f"known experiments: {', '.join(sorted(REGISTRY))}"))
    return REGISTRY[name]


def device_name(device: str = "cpu") -> str:
    """The GPU's name, or the CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.is_file() else []
    return models[0] if models else platform.processor() or platform.machine()


def machine() -> str:
    """The device and thread count the numbers were measured on."""
    if torch.cuda.is_available():
        return device_name("cuda")
    return f"{device_name()}, {torch.get_num_threads()} thread(s)"


def run_experiment(name: str, *, budget: str = "small", out: str | Path | None = None) -> Result:
    """Run experiment `name` at `budget`, write its files into `out` (default runs/experiments/NAME)."""
    spec = get(name)
    if budget not in BUDGETS:
        raise ConfigError(f"budget={budget!r} is not one of {', '.join(BUDGETS)}")
    out_dir = Path(out) if out is not None else Path("runs") / "experiments" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = spec.run(budget, out_dir)
    result.name, result.claim, result.lecture, result.budget = spec.name, spec.claim, spec.lecture, budget
    result.seconds, result.machine = time.perf_counter() - start, machine()
    result.write(out_dir)
    return result
