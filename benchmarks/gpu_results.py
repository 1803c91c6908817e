"""`python -m benchmarks.gpu_results DIR [--commit]`: a GPU session's files (`benchmarks/gpu_session.sh`'s $OUT, as
the device tool brings it back) into the places the documentation reads them from, each checked before any is copied.

    gpu-<device>.json, .md          -> benchmarks/results/ (the benchmark's report, every part it reached)
    pytest-gpu.txt, session.txt     -> benchmarks/results/gpu-<device>-pytest.txt, -session.txt
    bench-log.txt                   -> benchmarks/results/gpu-<device>-bench-log.txt (plans, any row's traceback)
    rnn-vs-transformer-cost.tgz     -> docs/experiments/rnn-vs-transformer-cost/ (results.json, table.md, plots: the
    transformer-plus-plus.tgz          gallery's stored run) and its log to benchmarks/results/gpu-<device>-NAME.txt

<device> is the GPU session.txt names (or the report's, where session.txt did not come back). A `--smoke` session's
files are refused (they measure no GPU), as are an experiment run at another budget than `gpu`, an archive cut short
and a report or session.txt that is not what the script writes: then nothing is copied. With `--commit` the files
written are committed, named one by one. Prints each file written, and what did not come back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

from attnkit.outputs import atomic_write
from benchmarks.bench_gpu import PARTS, report_stem

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("rnn-vs-transformer-cost", "transformer-plus-plus")
EXPERIMENT_FILES = ("results.json", "table.md")
LOGS = (("pytest-gpu.txt", "pytest"), ("session.txt", "session"), ("bench-log.txt", "bench-log"))


class Refused(Exception):
    """A file of the session that is not what it should be: the message names it and why."""


def session_gpu(folder: Path) -> str | None:
    """The GPU that `folder`'s session.txt names on its `gpu:` line (None where session.txt did not come back),
    checked to be one CUDA GPU of sessions that were not `--smoke` runs."""
    path = folder / "session.txt"
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if any(line.startswith("== gpu_session") and "--smoke" in line for line in lines):
        raise Refused(f"{path} is a --smoke session's: it measures no GPU")
    names = {line.removeprefix("gpu: ") for line in lines if line.startswith("gpu: ")}
    if not names:
        raise Refused(f"{path} names no GPU (no 'gpu:' line): it is not benchmarks/gpu_session.sh's session.txt")
    if "none" in names:
        raise Refused(f"{path} says torch saw no CUDA device: the session measured no GPU")
    if len(names) > 1:
        raise Refused(f"{path} names {len(names)} GPUs ({', '.join(sorted(names))}): one machine's session only")
    return names.pop()


def report_of(folder: Path) -> tuple[str, dict] | None:
    """The benchmark's report in `folder`: (its stem, gpu-<device>; the report), checked to be a CUDA run's of the
    benchmark's parts; None where none came back."""
    found = sorted(folder.glob("gpu-*.json"))
    if not found:
        return None
    if len(found) > 1:
        raise Refused(f"{folder} holds {len(found)} reports ({', '.join(p.name for p in found)}): one session's only")
    path = found[0]
    if path.stem == "gpu-smoke":
        raise Refused(f"{path} is a --smoke run's: it measures no GPU")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        machine, rows = report["machine"], report["results"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) and r.get("part") in PARTS for r in rows):
            raise ValueError(f"a row of none of the parts {', '.join(PARTS)}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise Refused(f"{path} is not a report of python -m benchmarks gpu ({err})") from err
    if not str(machine.get("device", "")).startswith("cuda"):
        raise Refused(f"{path} was not measured on CUDA (device {machine.get('device')!r})")
    if not (folder / f"{path.stem}.md").is_file():
        raise Refused(f"{path.stem}.md is missing beside {path}")
    return path.stem, report


def experiment_files(archive: Path, name: str, scratch: Path) -> tuple[Path | None, Path]:
    """The experiment's results folder (None where the run did not finish) and its log, from `archive`."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise Refused(f"{archive} is not a whole .tgz ({err}): copy it again from where it came back") from err
    log = scratch / f"{name}.txt"
    results = scratch / name / "results.json"
    if not log.is_file():
        raise Refused(f"{archive} holds no {name}.txt")
    if not results.is_file():
        return None, log
    try:
        stored = json.loads(results.read_text(encoding="utf-8"))
    except ValueError as err:
        raise Refused(f"{archive}: {name}/results.json is not JSON ({err})") from err
    if not isinstance(stored, dict) or stored.get("name") != name or stored.get("budget") != "gpu" \
            or "verdict" not in stored:
        described = (f"name {stored.get('name')!r}, budget {stored.get('budget')!r}" if isinstance(stored, dict)
                     else f"a {type(stored).__name__}")
        raise Refused(f"{archive}: {name}/results.json is not a --budget gpu run of {name} ({described})")
    return results.parent, log


def collect(folder: Path, root: Path = ROOT) -> tuple[list[Path], list[str]]:
    """Copy the session's files in `folder` under `root`, once every one of them has passed its check: (the paths
    written, lines on what is missing)."""
    if not folder.is_dir():
        raise Refused(f"{folder} is no folder: give the folder $OUT's files came back to")
    gpu, found = session_gpu(folder), report_of(folder)
    if found is None and gpu is None:
        raise Refused(f"{folder} holds neither a gpu-*.json report nor session.txt: is it where $OUT came back?")
    results = root / "benchmarks" / "results"
    copies, missing = {}, []  # copies: the session's file -> its place
    if found is None:
        stem = report_stem(gpu)
        missing.append("the benchmark's report: no part wrote one (bench-log.txt says why)")
    else:
        stem, report = found
        if gpu is not None and report["machine"].get("name") != gpu:
            raise Refused(f"{stem}.json is a run on {report['machine'].get('name')!r}, session.txt's GPU is {gpu!r}: "
                          "the files are of two sessions")
        copies = {folder / f"{stem}.json": results / f"{stem}.json", folder / f"{stem}.md": results / f"{stem}.md"}
        reached = {row["part"] for row in report["results"]}
        missing += [f"benchmark part {part}: no rows" for part in PARTS if part not in reached]
    for name, suffix in LOGS:
        if (folder / name).is_file():
            copies[folder / name] = results / f"{stem}-{suffix}.txt"
        else:
            missing.append(f"{name}: not brought back")
    with tempfile.TemporaryDirectory() as scratch:
        for name in EXPERIMENTS:
            archive = folder / f"{name}.tgz"
            if not archive.is_file():
                missing.append(f"experiment {name}: not run")
                continue
            run, log = experiment_files(archive, name, Path(scratch) / name)
            copies[log] = results / f"{stem}-{name}.txt"
            if run is None:
                missing.append(f"experiment {name}: did not finish (its log: {copies[log]})")
                continue
            copies.update({path: root / "docs" / "experiments" / name / path.name for path in sorted(run.iterdir())
                           if path.name in EXPERIMENT_FILES or path.suffix == ".png"})
        for source, target in copies.items():
            atomic_write(target, source.read_bytes())
    return list(copies.values()), missing


def commit(paths: list[str], missing: list[str]) -> str | None:
    """Commit `paths` (relative to the checkout), naming each; None, or why git failed."""
    message = (f"A GPU session's results: {', '.join(Path(p).name for p in paths)}"
               + ("" if not missing else f". Not measured: {'; '.join(missing)}"))
    try:
        subprocess.run(["git", "add", "--", *paths], cwd=ROOT, check=True, capture_output=True, text=True)
        if subprocess.run(["git", "diff", "--cached", "--quiet", "--", *paths], cwd=ROOT).returncode == 0:
            print("nothing to commit: the files are the ones already committed")
            return None
        subprocess.run(["git", "commit", "-q", "-m", message, "--", *paths], cwd=ROOT, check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as err:
        said = (getattr(err, "stderr", "") or str(err)).strip().splitlines()
        return f"git failed ({said[-1] if said else err}); the files are written: commit them by name"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_results", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folder", type=Path, help="the session's files ($OUT as it came back)")
    parser.add_argument("--commit", action="store_true", help="commit the files written, naming each")
    args = parser.parse_args(argv)
    try:
        written, missing = collect(args.folder)
    except Refused as err:
        print(f"gpu_results: {err}; nothing was copied", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(ROOT)}")
    for line in missing:
        print(f"missing: {line}")
    if args.commit:
        failed = commit([str(p.relative_to(ROOT)) for p in written], missing)
        if failed:
            print(f"gpu_results: {failed}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
