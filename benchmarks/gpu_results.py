"""`python -m benchmarks.gpu_results DIR [--commit]`: a GPU session's files (`benchmarks/gpu_session.sh`'s $OUT, as
the device tool brings it back) into the places the documentation reads them from, each checked before it is copied.

    gpu-<device>.json, .md          -> benchmarks/results/ (the benchmark's report, every part it reached)
    pytest-gpu.txt, session.txt     -> benchmarks/results/gpu-<device>-pytest.txt, -session.txt
    rnn-vs-transformer-cost.tgz     -> docs/experiments/rnn-vs-transformer-cost/ (results.json, table.md, plots: the
    transformer-plus-plus.tgz          gallery's stored run) and its log to benchmarks/results/gpu-<device>-NAME.txt

A `--smoke` session's files are refused (they measure no GPU), as is an experiment run that is not on CUDA. With
`--commit` the files written are committed, named one by one. Prints each file written, and what did not come back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("rnn-vs-transformer-cost", "transformer-plus-plus")
EXPERIMENT_FILES = ("results.json", "table.md")


class Refused(Exception):
    """A file of the session that is not what it should be: the message names it and why."""


def report_of(folder: Path) -> tuple[str, dict]:
    """The benchmark's report in `folder`: (its stem, gpu-<device>), checked to be a CUDA run's."""
    found = sorted(folder.glob("gpu-*.json"))
    if not found:
        raise Refused(f"{folder} holds no gpu-*.json: the session's benchmark stages did not run or wrote nothing")
    if len(found) > 1:
        raise Refused(f"{folder} holds {len(found)} reports ({', '.join(p.name for p in found)}): one session's only")
    path = found[0]
    if path.stem == "gpu-smoke":
        raise Refused(f"{path} is a --smoke run's: it measures no GPU")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        machine, rows = report["machine"], report["results"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise Refused(f"{path} is not a report of python -m benchmarks gpu ({err})") from err
    if not str(machine.get("device", "")).startswith("cuda") or not isinstance(rows, list):
        raise Refused(f"{path} was not measured on CUDA (device {machine.get('device')!r})")
    if not (folder / f"{path.stem}.md").is_file():
        raise Refused(f"{path.stem}.md is missing beside {path}")
    return path.stem, report


def experiment_files(archive: Path, name: str, scratch: Path) -> tuple[Path | None, Path]:
    """The experiment's results folder (None where the run did not finish) and its log, from `archive`."""
    with tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
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
    if stored.get("name") != name or stored.get("budget") != "gpu" or "verdict" not in stored:
        raise Refused(f"{archive}: {name}/results.json is not a --budget gpu run of {name} (name "
                      f"{stored.get('name')!r}, budget {stored.get('budget')!r})")
    return results.parent, log


def collect(folder: Path, root: Path = ROOT) -> tuple[list[Path], list[str]]:
    """Copy the session's files in `folder` under `root`, once every one of them has passed its check: (the paths
    written, lines on what is missing)."""
    stem, report = report_of(folder)
    results = root / "benchmarks" / "results"
    copies = {folder / f"{stem}.json": results / f"{stem}.json", folder / f"{stem}.md": results / f"{stem}.md"}
    reached = {row["part"] for row in report["results"]}
    missing = [f"benchmark part {part}: no rows" for part in ("train", "serve", "decode", "variants")
               if part not in reached]
    for name, suffix in (("pytest-gpu.txt", "pytest"), ("session.txt", "session")):
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
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    return list(copies.values()), missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_results", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folder", type=Path, help="the session's files ($OUT as it came back)")
    parser.add_argument("--commit", action="store_true", help="commit the files written, naming each")
    args = parser.parse_args(argv)
    try:
        written, missing = collect(args.folder)
    except Refused as err:
        print(f"gpu_results: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(ROOT)}")
    for line in missing:
        print(f"missing: {line}")
    if args.commit:
        paths = [str(p.relative_to(ROOT)) for p in written]
        message = (f"A GPU session's results: {', '.join(p.name for p in written)}"
                   + ("" if not missing else f". Not measured: {'; '.join(missing)}"))
        subprocess.run(["git", "add", *paths], cwd=ROOT, check=True)
        subprocess.run(["git", "commit", "-m", message, "--", *paths], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
