"""What every experiment shares: its claim, a budget, the rule that turns evidence into a verdict, and progress.

An experiment is one function `run(budget, out, progress) -> Result` registered under a name with the claim it
tests and the lecture that makes it. `run_experiment` times it, writes `results.json` and `table.md` into `out`,
and returns the result; plots are PNGs the experiment writes into `out` and names in `Result.plots`. The plots that
need only the rows (and each row's values per seed, `Result.per_seed`) come from the experiment's `plot(Stored, out)`,
which `run_experiment` calls after the run and `replot` calls on a stored results.json, without running anything.

The verdict is never chosen by an experiment. Each experiment states what its claim predicts as `Check`s: a
difference the claim predicts positive, measured over several seeds (or timing rounds), with the noise those
seeds show. `verdict_of` turns the checks into the verdict, by one rule for every experiment:

    a check is FOR the claim      when its mean difference exceeds its noise,
               AGAINST the claim  when it is below minus its noise,
               INSIDE NOISE       otherwise;
    held                          every check for;
    did not hold at this scale    every decided check against (none for);
    mixed                         checks decided both ways;
    inconclusive at this budget   no check against, and some inside noise: the budget cannot tell.

The noise is the half-width of the 95% confidence interval of the mean difference (Student's t over the seeds:
t * sd / sqrt(n)); with one seed it is unknown, and nothing is decided.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from attnkit.errors import ConfigError, InputError, unknown_name
from attnkit.experiments.arms import ARMS_DIR, Arm, Arms, source_digest
from attnkit.machine import pick_device
from attnkit.outputs import files_into
from attnkit.readback import FileFields
from attnkit.train.trainer import shows_progress
from attnkit.version import installed_version

log = logging.getLogger(__name__)
T = TypeVar("T")

# tiny: seconds (tests); small: minutes on 2 CPU cores; full: the README's; gpu: sizes a GPU makes cheap (--device cuda)
Budget = Literal["tiny", "small", "full", "gpu"]
BUDGETS: tuple[str, ...] = get_args(Budget)
SEEDS = {"tiny": 2, "small": 3, "full": 3, "gpu": 2}  # seeds (or timing rounds) an experiment repeats, for its noise
Verdict = Literal["held", "did not hold at this scale", "mixed", "inconclusive at this budget"]
VERDICTS: tuple[str, ...] = get_args(Verdict)


@dataclass(frozen=True)
class ExperimentSettings:
    """What `attnkit experiment` runs; each field is one of its options."""

    name: str | None = field(default=None, metadata={"positional": True})  # the experiment to run (see --list)
    list: bool = False  # print the experiments, each with its claim and lecture
    budget: Budget = "small"
    """tiny: seconds (what the tests run); small: minutes on 2 CPU cores; full: larger runs; gpu: the sizes a GPU makes
    cheap, for the experiments that run there (--device cuda)"""
    out: str | None = None  # directory for results.json, table.md and the plots; none: runs/experiments/NAME
    device: str = "cpu"  # cpu, or cuda for the experiments that run there (--list says which)
    progress: bool | None = None  # a bar per training run; --no-progress: log lines; none: on a terminal
    seeds: int | None = None  # seeds (or timing rounds) to repeat, for the noise; none: the budget's (2 tiny, 3 small)
    replot: str | None = None  # redraw the plots of the run stored in this directory from its results.json; no run
    resume: bool = True
    """reuse the arms (trained models, measurements) a stopped run of the same command finished, kept in OUT/arms
    until the run ends; --no-resume: run every arm afresh"""


_T_95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)  # Student's t, two-sided 95%, df 1..10


def t_95(df: int) -> float:
    """Student's t quantile of a two-sided 95% interval with `df` degrees of freedom (past 10, 1.96 + 2.4 / df,
    within 0.02 of it)."""
    if df < 1:
        return math.inf
    return _T_95[df - 1] if df <= len(_T_95) else 1.96 + 2.4 / df


@dataclass(frozen=True)
class Check:
    """One thing the claim predicts, as a difference it predicts positive, and the noise the difference must clear.

    Build it with `Check.over` from one difference per seed (or timing round), or with `Check.fact` for what is
    not a measurement (an input refused, a cache size).
    """

    what: str  # the prediction, e.g. "unscaled dot's validation loss minus scaled dot's, D=256 (nats)"
    difference: float  # the mean difference; the claim predicts it positive
    noise: float  # half-width of its 95% interval: a difference within +-noise is not told from zero
    basis: str  # where the noise comes from, e.g. "3 seeds"
    spread: float | None = None  # standard deviation of one seed's difference, where measured
    n: int = 0  # seeds or rounds averaged
    unit: str = "seeds"
    unmeasured: int = 0  # samples that were no finite number (runs that diverged): the check is left undecided
    repeated: bool = True  # whether --seeds repeats its runs (False: a size the experiment runs once, whatever --seeds)

    @classmethod
    def over(cls, what: str, samples: Sequence[float], *, unit: str = "seeds", spread: float | None = None,
             df: int | None = None, repeated: bool = True) -> Check:
        """The mean of `samples` (one difference per seed or round) and its noise from their spread. `spread` and
        `df`: a spread measured on other runs at the same budget (pooled), where these runs are too few. A sample
        that is no finite number (a run that diverged, a loss that is nan) measured nothing: the check is left
        undecided (noise infinite, the basis saying how many), never read as a difference inside the noise that more
        seeds would decide. `repeated`: False where --seeds does not add to these samples (a size run once), so that
        an undecided check does not name more seeds as what would decide it."""
        n = len(samples)
        unmeasured = sum(not math.isfinite(sample) for sample in samples)
        if unmeasured:
            finite = [sample for sample in samples if math.isfinite(sample)]
            return cls(what, statistics.fmean(finite) if finite else 0.0, math.inf,
                       f"{n} {unit}, {unmeasured} of them no finite value (a run diverged)", None, n, unit, unmeasured)
        mean = statistics.fmean(samples)
        if spread is None:
            spread = statistics.stdev(samples) if n >= 2 else None
            df = n - 1
        noise = math.inf if spread is None else t_95(df or 0) * spread / math.sqrt(n)
        basis = f"{n} {unit}" if df == n - 1 else f"{n} {unit}, spread pooled from other runs ({df} df)"
        return cls(what, mean, noise, basis, spread, n, unit, repeated=repeated)

    @classmethod
    def fact(cls, what: str, holds: bool) -> Check:
        """A prediction that is not a measurement: it holds or it does not, without noise."""
        return cls(what, 1.0 if holds else -1.0, 0.0, "not a measurement")

    @property
    def outcome(self) -> str:
        if self.difference > self.noise:
            return "for"
        if self.difference < -self.noise:
            return "against"
        return "inside noise"

    def to_decide(self) -> str:
        """What would tell this difference from zero: the seeds it would take at this budget, or a larger budget."""
        if self.unmeasured:
            return "runs that stay finite (a lower learning rate, or another budget)"
        if not self.repeated:
            return f"a larger budget (--seeds does not repeat these {self.n} {self.unit})"
        if self.spread and self.difference and self.n:
            for n in range(self.n + 1, 201):
                if t_95(n - 1) * self.spread / math.sqrt(n) < abs(self.difference):
                    return f"about {n} {self.unit} (now {self.n}; --seeds {n}) at this budget, or a larger budget"
        if self.spread:
            return (f"a larger budget (the difference is too small beside the {self.unit}' spread for more "
                    f"{self.unit} at this budget to tell)")
        return f"a larger budget (more {self.unit}, sizes or steps)"


def verdict_of(checks: Sequence[Check]) -> tuple[Verdict, str]:
    """The verdict the checks support, and a sentence saying why (the rule is in this module's docstring)."""
    if not checks:
        raise ValueError("an experiment states at least one check of its claim")
    outcomes = [check.outcome for check in checks]
    undecided = [check for check in checks if check.outcome == "inside noise"]
    if "against" not in outcomes and undecided:
        return "inconclusive at this budget", "; ".join(
            f"{check.what} is {check.difference:+.4g}, inside its noise +-{check.noise:.2g} ({check.basis}): "
            f"{check.to_decide()} would decide it" for check in undecided)
    if "against" not in outcomes:
        return "held", "every check is beyond its noise"
    against = "; ".join(check.what for check in checks if check.outcome == "against")
    if "for" in outcomes:
        return "mixed", f"beyond the noise, against the claim: {against}"
    return "did not hold at this scale", f"beyond the noise, against the claim: {against}"


@dataclass(frozen=True)
class Stored:
    """What an experiment's plots read of a run, the same fresh from `run` as from a stored results.json: the rows,
    each row's values per seed (column -> one value per seed; empty where the run did not store them), the budget
    and the seeds repeated."""

    rows: list[dict[str, Any]]
    per_seed: list[dict[str, list[float]]]
    budget: str
    seeds: int

    @classmethod
    def read(cls, results: dict[str, Any], default_seeds: int) -> Stored:
        """From a results.json; for a run stored before `seeds` was written, the most seeds its checks averaged, else
        `default_seeds`."""
        checks = results.get("checks", [])
        seeds = results.get("seeds") or max((c.get("n", 0) for c in checks if c.get("unit") == "seeds"), default=0)
        return cls(results["rows"], results.get("per_seed", []), results["budget"], seeds or default_seeds)

    def spread(self, cells: Sequence[tuple[int, str]]) -> list[list[float]] | None:
        """Per (row index, column): its values per seed; None where this run did not store them."""
        if not self.per_seed:
            return None
        return [list(self.per_seed[row].get(column) or []) for row, column in cells]


@dataclass
class Result:
    """What an experiment found: a table (rows of column -> value), plots, the checks of its claim and the verdict
    they support (`verdict_of`), with the experiment's reason and the rule's."""

    checks: list[Check]
    reason: str  # what was measured, in one or two sentences with the numbers behind it
    key_number: str  # the one figure a reader should remember, e.g. "BLEU 31.2 vs 12.4 at 20+ tokens"
    rows: list[dict[str, Any]]
    plots: list[str] = field(default_factory=list)  # PNG file names inside the output directory
    per_seed: list[dict[str, list[float]]] = field(default_factory=list)  # per row: column -> its value per seed
    verdict: Verdict = field(init=False)
    decision: str = field(init=False)  # why the checks give this verdict, and what would decide an undecided one
    # Filled in by run_experiment:
    name: str = ""
    claim: str = ""
    lecture: str = ""
    budget: str = ""
    seconds: float = 0.0
    machine: str = ""
    seeds: int = 0
    version: str = ""  # the code that ran: attnkit's version, and its commit where run from a git checkout

    def __post_init__(self) -> None:
        self.verdict, self.decision = verdict_of(self.checks)

    def summary(self) -> str:
        """The verdict with the experiment's reason and the rule's, as printed and written."""
        return f"{self.verdict}: {self.reason}. {self.decision[0].upper()}{self.decision[1:]}."

    def stored(self) -> Stored:
        """What the experiment's `plot` reads of this result."""
        return Stored(self.rows, self.per_seed, self.budget, self.seeds)

    def table_markdown(self) -> str:
        """The rows as a markdown table (columns in the order of the first row)."""
        return _markdown(self.rows)

    def checks_markdown(self) -> str:
        """The checks as a markdown table: the difference the claim predicts positive, its noise, the outcome."""
        return _markdown([{"the claim predicts": c.what, "difference": c.difference, "noise (95%)": c.noise,
                           "over": c.basis, "outcome": c.outcome} for c in self.checks])

    def write(self, out: Path) -> None:
        """results.json (standard JSON: a number that is not finite, such as an unknown noise, is null) and
        table.md."""
        out.mkdir(parents=True, exist_ok=True)
        fields = _finite_or_null(json.loads(json.dumps(asdict(self), default=float)))
        (out / "results.json").write_text(json.dumps(fields, indent=2, allow_nan=False) + "\n")
        header = (f"# {self.name}\n\nClaim ({self.lecture}): {self.claim}\n\n"
                  f"Verdict: **{self.verdict}**. {self.reason}. {self.decision[0].upper()}{self.decision[1:]}.\n\n"
                  "Checks (a difference the claim predicts positive; decided only beyond its noise, the 95% "
                  "interval over seeds or rounds):\n\n" + self.checks_markdown() + "\n")
        footer = (f"\nBudget `{self.budget}`, --seeds {self.seeds}, {self.seconds:.0f} s on {self.machine}; "
                  f"{self.version}.\n")
        (out / "table.md").write_text(header + self.table_markdown() + footer)


def _finite_or_null(value: Any) -> Any:
    """`value` (JSON's types) with each infinite or nan number made None: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(item) for item in value]
    return value


def _markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)\n"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


class Progress:
    """How an experiment shows and keeps its work, as training does (`train.trainer.shows_progress`): a log line per
    phase, and for each loop of steps a tqdm bar when bars are shown, else a log line every fifth of its steps.
    arms: where each finished arm (a trained model, a measurement) is saved and a resumed run reuses it from
    (`experiments.arms`); None: nothing is kept."""

    def __init__(self, *, bars: bool = False, arms: Arms | None = None) -> None:
        self.bars = bars
        self.arms = arms

    def phase(self, message: str) -> None:
        log.info("%s", message)

    def arm(self, name: str, setting: dict[str, Any], compute: Callable[[], tuple[T, Arm]],
            restore: Callable[[Arm], T]) -> T:
        """The arm `name` (see `Arms.run`): reused where this run keeps arms and a stopped run saved it, else
        `compute()`'s value, its Arm saved where arms are kept."""
        if self.arms is None:
            return compute()[0]
        return self.arms.run(name, setting, compute, restore)

    def steps(self, total: int, desc: str) -> Iterator[int]:
        """1, 2, ..., total, shown as `desc`'s progress."""
        if self.bars:
            yield from tqdm(range(1, total + 1), desc=desc, unit="step", dynamic_ncols=True, leave=False)
            return
        every = max(total // 5, 1)
        for step in range(1, total + 1):
            yield step
            if step % every == 0 or step == total:
                log.info("%s: step %d/%d", desc, step, total)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Experiment:
    name: str
    claim: str
    lecture: str
    run: Callable[..., Result]  # (budget, out, progress, seeds=), and device= where `devices` holds more than the CPU
    devices: tuple[str, ...] = ("cpu",)
    default_seeds: Callable[[str], int] = SEEDS.__getitem__  # a budget -> the seeds it repeats unless asked
    plot: PlotFunction | None = None  # draws the plots that need only a run's rows, returns their file names


REGISTRY: dict[str, Experiment] = {}


RunFunction = Callable[..., Result]  # (budget, out, progress, *, seeds) -> Result
PlotFunction = Callable[[Stored, Path], list[str]]  # (what a run stored, out) -> the PNG file names written


def experiment(name: str, *, claim: str, lecture: str, devices: tuple[str, ...] = ("cpu",),
               default_seeds: Callable[[str], int] = SEEDS.__getitem__,
               plot: PlotFunction | None = None) -> Callable[[RunFunction], RunFunction]:
    """Register `run(budget, out, progress, *, seeds) -> Result` as the experiment `name`; one that also runs on a
    GPU lists "cuda" in `devices` and takes `device=` (the device to run on). `default_seeds` gives the seeds (or
    timing rounds) a budget repeats unless `--seeds` asks for another number (`SEEDS`, or more where they are cheap).
    `plot(Stored, out)` draws the plots that need only the rows and values per seed (see `replot`)."""

    def register(run: RunFunction) -> RunFunction:
        REGISTRY[name] = Experiment(name, claim, lecture, run, devices, default_seeds, plot)
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


def machine(device: str = "cpu") -> str:
    """The device (and the CPU's thread count) the numbers were measured on."""
    if torch.device(device).type == "cuda":
        return device_name(device)
    return f"{device_name()}, {torch.get_num_threads()} thread(s)"


def code_version() -> str:
    """attnkit's installed version, and the commit of the checkout it runs from (with "+ changes" where files under
    src/attnkit differ from it), so that a stored run says which code measured it."""
    version = f"attnkit {installed_version()}"
    source = Path(__file__).resolve().parent
    try:  # this file tracked by the repository around it: an install inside another project's checkout is not one
        subprocess.run(["git", "ls-files", "--error-unmatch", Path(__file__).name], cwd=source, capture_output=True,
                       timeout=10, check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        # --no-optional-locks: a plain status refreshes .git/index under index.lock, which a commit running beside
        # this run would find taken
        changed = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--", "."], cwd=source.parent,
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout: the version alone
        return version
    return f"{version}, commit {commit}" + (" + changes" if changed else "")


def run_experiment(name: str, *, budget: str = "small", out: str | Path | None = None,
                   progress: bool | None = False, device: str = "cpu", seeds: int | None = None,
                   resume: bool = True) -> Result:
    """Run experiment `name` at `budget` on `device`, write its files into `out` (default runs/experiments/NAME).

    progress: True draws a bar per training run, False logs progress lines, None: bars on a terminal. seeds: how
    many seeds (or timing rounds) to repeat, the number an inconclusive verdict names; None: the budget's. Each
    finished arm is kept in `out`/arms until the results are written (`experiments.arms`); resume: reuse the arms a
    stopped run of the same command kept there (False: run them all afresh)."""
    spec = get(name)
    if budget not in BUDGETS:
        raise ConfigError(f"budget={budget!r} is not one of {', '.join(BUDGETS)}")
    kind = pick_device(device).type
    if budget == "gpu" and (kind != "cuda" or "cuda" not in spec.devices):
        on_gpu = sorted(n for n, e in REGISTRY.items() if "cuda" in e.devices)
        raise ConfigError(f"--budget gpu sizes a run for a GPU ({', '.join(on_gpu)} with --device cuda); "
                          + (f"{name!r} runs on the CPU only" if "cuda" not in spec.devices else
                             f"this run is on {kind}") + ": use --budget tiny, small or full")
    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2):
        raise ConfigError(f"seeds={seeds!r}: give an integer of at least 2 (one seed measures no noise, so it "
                          f"decides nothing); leave it out for the budget's {spec.default_seeds(budget)}")
    seeds = seeds if seeds is not None else spec.default_seeds(budget)
    if kind not in spec.devices:
        elsewhere = sorted(n for n, e in REGISTRY.items() if kind in e.devices)
        raise ConfigError(f"experiment {name!r} runs on the CPU only (its claim is not about {kind} hardware); "
                          f"on {kind}: {', '.join(elsewhere) or 'none'}; or drop --device")
    on_device = {"device": device} if len(spec.devices) > 1 else {}
    out_dir = Path(out) if out is not None else Path("runs") / "experiments" / name
    _refuse_another_run(name, out_dir)
    start = time.perf_counter()
    bars = shows_progress(progress)
    log.info("%s at budget %s, %d seeds: %s", name, budget, seeds, spec.claim)
    version = code_version()
    arms = Arms(out_dir / ARMS_DIR, experiment=name, budget=budget, code=source_digest(), version=version)
    if not resume:
        arms.clear()
    elif (other := arms.stopped_run()) is not None:  # this run would rerun its arms and remove them when it ends
        raise InputError(f"{arms.directory} keeps the finished arms of a stopped run of {other}: run that command "
                         "again to finish it, choose another --out, or add --no-resume to discard them")
    # the run writes into a hidden sibling; its files reach out_dir together at the end, results.json first, so an
    # interrupted run leaves out_dir as it was (a previous run's files unmixed with a half run's pictures)
    with files_into(out_dir, first=("results.json", "table.md")) as partial, logging_redirect_tqdm():
        result = spec.run(budget, partial, Progress(bars=bars, arms=arms), seeds=seeds, **on_device)
        result.name, result.claim, result.lecture, result.budget = spec.name, spec.claim, spec.lecture, budget
        result.seconds, result.machine, result.seeds = time.perf_counter() - start, machine(device), seeds
        result.version = version
        if spec.plot is not None:
            result.plots += spec.plot(result.stored(), partial)
        result.write(partial)
    if arms.reused:
        log.info("reused %d of %d arms a stopped run had finished", len(arms.reused), len(arms.reused) + len(arms.ran))
    arms.clear()
    return result


def _refuse_another_run(name: str, out: Path) -> None:
    """An `out` holding another experiment's results (or a results.json attnkit did not write) would mix the two runs'
    files: InputError naming it and the fix, before anything runs."""
    results = out / "results.json"
    if not results.is_file():
        return
    try:
        other = json.loads(results.read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):
        other = None
    if other != name:
        held = f"experiment {other!r}" if isinstance(other, str) else "results attnkit did not write"
        raise InputError(f"--out {out} holds the {held} ({results}); choose another --out, so that their results "
                         "and plots do not mix")


def replot(directory: str | Path, *, name: str | None = None) -> list[str]:
    """Redraw, from `directory`'s results.json, the plots its experiment draws from rows alone (the axes and seeds'
    spread of today's `plot`), without running anything; the other PNGs there are left as they are. Returns the
    file names redrawn. `name`: the experiment the caller expects there (a run of another is refused).

    Raises InputError where there is no readable results.json, or one whose fields are not what an experiment writes
    (`attnkit.readback`: rows of values, a known budget, values per seed) or hold what its plots cannot draw (text
    for a length, a time at or below zero on a log axis), ConfigError where it names no known experiment."""
    path = Path(directory) / "results.json"
    if not path.is_file():
        raise InputError(f"{path} does not exist: --replot takes a directory an experiment wrote (its --out)")
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise InputError(f"{path} is not JSON ({error}): rerun the experiment into {directory}") from error
    missing = [key for key in ("name", "budget", "rows") if not isinstance(results, dict) or key not in results]
    if missing:
        raise InputError(f"{path} is not an experiment's results (no {', '.join(missing)}): rerun the experiment "
                         f"into {directory}")
    stored_name, budget = _check_results(results, str(path), fix=f"rerun the experiment into {directory}")
    if name is not None and name != stored_name:
        raise InputError(f"{directory} holds a run of {stored_name}, not {name}: give `attnkit experiment "
                         f"{stored_name} --replot {directory}`, or --replot alone (the name is read from results.json)")
    spec = get(stored_name)
    if spec.plot is None:
        return []
    try:
        return spec.plot(Stored.read(results, spec.default_seeds(budget)), Path(directory))
    except KeyError as missing:
        raise InputError(f"{path}: a row lacks the column {missing.args[0]!r} that {stored_name}'s plots read; rerun "
                         f"the experiment into {directory}") from None
    except (TypeError, ValueError) as error:  # a value of the wrong kind for its column: text where a length is drawn
        raise InputError(f"{path}: its rows hold a value {stored_name}'s plots cannot draw ({error}); rerun the "
                         f"experiment into {directory}") from None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_results(results: dict[str, Any], source: str, *, fix: str) -> tuple[str, str]:
    """A results.json's fields, checked as `Result.write` writes them: its name, a known budget, rows of values (none
    empty), values per seed for as many rows, and the seeds. Returns (name, budget)."""
    fields = FileFields(results, source, fix=fix)
    rows = [row.scalars() for row in fields.records("rows")]
    per_seed = fields.records("per_seed", default=[])
    for row in per_seed:
        for column in row:
            values = row.get(column)
            numbers = isinstance(values, list) and all(v is None or _number(v) for v in values)
            if values is not None and not numbers:
                row.refuse(column, values, "a list of numbers (one per seed) or null")
    if per_seed and len(per_seed) != len(rows):
        raise InputError(f"{source}: per_seed has {len(per_seed)} entries for {len(rows)} rows (one a row); {fix}")
    fields.integer("seeds", default=None, minimum=1)
    for check in fields.records("checks", default=[]):
        check.integer("n", default=0, minimum=0)
        check.string("unit", default="")
    return fields.string("name"), fields.string("budget", choices=BUDGETS)
