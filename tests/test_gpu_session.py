"""benchmarks/gpu_session.sh, the one script a lent GPU machine runs, and benchmarks/gpu_results.py, which files what
it brought back. The script: its CUDA tests are every test module that holds one (a module left out would go unrun
there without a word), a part it does not know or an $OUT it cannot write is refused before any stage runs, and each
stage runs within what is left of the budget, its end (or why it was not started) said in session.txt. The collector:
each file put where the docs read it, and a spoilt, partial or --smoke session refused in one line, nothing copied.
A stand-in interpreter takes python's place in the script's tests, so they take seconds (the --smoke run: slow)."""

import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from benchmarks import gpu_results
from benchmarks.bench_gpu import write_report

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"


def test_the_session_runs_every_test_module_that_holds_a_gpu_test():
    marked = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\s*=.*pytest\.mark\.gpu\b)", re.MULTILINE)
    holding = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").glob("test_*.py")
               if marked.search(path.read_text(encoding="utf-8"))}
    assert holding, "no test module is marked gpu"
    assert set(re.findall(r"tests/test_\w+\.py", SCRIPT.read_text())) == holding


def test_an_unknown_part_is_refused_naming_the_parts(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "tests", "benchmark"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "unknown part benchmark: tests, train, serve, decode, variants or experiments" in result.stdout
    assert not (tmp_path / "pytest-gpu.txt").exists()  # refused before any part ran


def _session(tmp_path, *args: str, budget: int) -> subprocess.CompletedProcess:
    env = {"OUT": str(tmp_path / "out"), "GPU_SESSION_DIR": str(tmp_path / "work"), "BUDGET_S": str(budget),
           "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env=env)


def test_a_stage_whose_minimum_no_longer_fits_the_budget_is_not_started_and_said(tmp_path):
    """The budget is the device tool's one command: a stage that cannot finish in what is left is not started (so
    the ones before it keep their results and the command ends in time), and session.txt, brought back, says so."""
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", "tests", "train", "experiments"],
                            cwd=_stand_in_checkout(tmp_path), capture_output=True, text=True, timeout=60,
                            env={"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin", "BUDGET_S": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    session = (tmp_path / "out" / "session.txt").read_text()
    stages = re.findall(r"^([\w-]+): not started, -?\d+ s left of 0 and it needs (\d+) s$", session, re.MULTILINE)
    assert stages == [("tests", "60"), ("train", "110"), ("rnn-vs-transformer-cost", "40"),
                      ("transformer-plus-plus", "240")]
    assert not (tmp_path / "out" / "pytest-gpu.txt").exists()


def _stand_in_checkout(tmp_path: Path) -> Path:
    """A checkout holding the session script and, as its .venv's python, a stand-in: `-c` (the session's first
    lines) says there is no GPU, the train part fails at once, the serve part hangs, any other command succeeds."""
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    shutil.copy(SCRIPT, checkout / "benchmarks")
    python = checkout / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/bash\ncase "$*" in\n  -c*) echo "gpu: none" ;;\n'
                      '  *"--only train"*) echo "train broke" >&2; exit 3 ;;\n  *"--only serve"*) exec sleep 60 ;;\n'
                      '  *) echo "ran $*" ;;\nesac\n')
    python.chmod(0o755)
    return checkout


def test_a_failed_stage_and_one_cut_at_its_limit_are_said_and_what_follows_still_runs_or_is_said(tmp_path):
    """Under a 4 s budget (--smoke: each stage's cap is what is left): train fails (its status in session.txt, its
    error in bench-log.txt), serve hangs and is stopped at the budget, and decode, with nothing left, is not started;
    each line is in $OUT's session.txt as the stage ends."""
    checkout = _stand_in_checkout(tmp_path)
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--smoke", "train", "serve", "decode"],
                            cwd=checkout, capture_output=True, text=True, timeout=60,
                            env={"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin", "BUDGET_S": "4"})
    assert result.returncode == 0, result.stdout + result.stderr
    session = (tmp_path / "out" / "session.txt").read_text()
    assert re.search(r"^train: exit 3 after \d s of its \d s$", session, re.MULTILINE), session
    assert re.search(r"^serve: exit 124 after \d s of its \d s, cut at its limit$", session, re.MULTILINE), session
    assert re.search(r"^decode: not started, -?\d s left of 4 and it needs 1 s$", session, re.MULTILINE), session
    assert "train broke" in (tmp_path / "out" / "bench-log.txt").read_text()


def test_without_out_the_files_stay_in_the_session_folder(tmp_path):
    """Run by hand, with no $OUT: the results are in runs/gpu-session-smoke/ (or GPU_SESSION_DIR), nothing else."""
    checkout = _stand_in_checkout(tmp_path)
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--smoke", "tests"], cwd=checkout,
                            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout + result.stderr
    work = checkout / "runs" / "gpu-session-smoke"
    assert "ran -m pytest -m gpu" in (work / "pytest-gpu.txt").read_text()
    assert re.search(r"^tests: exit 0 after", (work / "session.txt").read_text(), re.MULTILINE)
    assert sorted(p.name for p in checkout.iterdir()) == [".venv", "benchmarks", "runs"]


def test_an_out_that_cannot_be_written_is_refused_before_any_stage(tmp_path):
    checkout = _stand_in_checkout(tmp_path)
    (tmp_path / "a-file").write_text("")
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "a-file" / "out")}  # under a file: no folder can be made
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", "tests"], cwd=checkout, capture_output=True,
                            text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert f"cannot write into runs/gpu-session or {tmp_path / 'a-file' / 'out'}: run it from the checkout's root" \
        in result.stdout
    assert not (checkout / "runs" / "gpu-session" / "session.txt").exists()


@pytest.mark.slow  # the CPU runs the CUDA tests' collection and both experiments at the tiny budget: about a minute
def test_smoke_session_runs_each_stage_in_order_and_brings_back_at_most_eight_files(tmp_path):
    """`--smoke` on the CPU: the tests stage, then both experiments (the benchmark's parts have their own smoke
    tests), each noted in order as it ends, every result in $OUT within the device tool's eight files, each
    experiment's results in its archive without its arms."""
    result = _session(tmp_path, "--smoke", "tests", "experiments", budget=1500)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "out"
    session = (out / "session.txt").read_text()
    ended = re.findall(r"^([\w-]+): exit (\d+) after", session, re.MULTILINE)
    assert ended == [("tests", "0"), ("rnn-vs-transformer-cost", "0"), ("transformer-plus-plus", "0")], session
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and set(files) == {"session.txt", "pytest-gpu.txt", "rnn-vs-transformer-cost.tgz",
                                              "transformer-plus-plus.tgz"}, files
    assert "skipped" in (out / "pytest-gpu.txt").read_text()  # collected, and skipped without CUDA
    for name in ("rnn-vs-transformer-cost", "transformer-plus-plus"):
        with tarfile.open(out / f"{name}.tgz") as tar:
            names = tar.getnames()
            results = json.load(tar.extractfile(f"{name}/results.json"))
        assert f"{name}.txt" in names and not any("/arms" in n for n in names), names
        assert (results["name"], results["budget"]) == (name, "tiny")


def _session_files(folder: Path, *, stem: str = "gpu-nvidia-h200", finished: bool = True,
                   gpu: str = "NVIDIA H200") -> None:
    """A session's $OUT as the device tool brings it back: the benchmark's report (train and decode reached), the
    tests' and session's logs, and the two experiments (transformer-plus-plus cut before it finished)."""
    folder.mkdir()
    rows = [{"part": "train", "impl": "attnkit", "tokens_per_s": 5e5, "ms_per_step": 32.0, "mfu_spec": 0.5,
             "peak_gpu_gb": 9.8},
            {"part": "decode", "impl": "attnkit", "case": "generate-gpt2-124m-b1", "error": "RuntimeError: x"}]
    write_report({"machine": {"device": "cuda", "name": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0"},
                  "command": "python -m benchmarks gpu --only train decode", "train_shape": "12 layers",
                  "results": rows}, folder, stem)
    (folder / "pytest-gpu.txt").write_text("10 passed\n")
    (folder / "session.txt").write_text(f"== gpu_session 2026-12-01T10:00:00Z parts: all; budget 560 s\n"
                                        f"commit abc1234\ngpu: {gpu}\ntorch 2.11.0 CUDA 13.0 attnkit src\n"
                                        "tests: exit 0 after 80 s\n")
    (folder / "bench-log.txt").write_text("== python -m benchmarks gpu --only train\n")
    for name in gpu_results.EXPERIMENTS:
        staging = folder / "staging"
        (staging / name).mkdir(parents=True)
        (staging / f"{name}.txt").write_text("log\n")
        members = [f"{name}.txt"]
        if finished or name == "rnn-vs-transformer-cost":
            (staging / name / "results.json").write_text(json.dumps({"name": name, "budget": "gpu",
                                                                     "verdict": "held"}))
            (staging / name / "table.md").write_text("| a |\n")
            (staging / name / "plot.png").write_bytes(b"\x89PNG")
            members.append(name)
        with tarfile.open(folder / f"{name}.tgz", "w:gz") as tar:
            for member in members:
                tar.add(staging / member, arcname=member)
        shutil.rmtree(staging)


def test_collect_puts_each_result_where_the_docs_read_it_and_names_what_is_missing(tmp_path):
    _session_files(tmp_path / "out", finished=False)
    written, missing = gpu_results.collect(tmp_path / "out", root=tmp_path / "repo")
    results, gallery = tmp_path / "repo" / "benchmarks" / "results", tmp_path / "repo" / "docs" / "experiments"
    assert set(written) == {results / "gpu-nvidia-h200.json", results / "gpu-nvidia-h200.md",
                            results / "gpu-nvidia-h200-pytest.txt", results / "gpu-nvidia-h200-session.txt",
                            results / "gpu-nvidia-h200-bench-log.txt",
                            results / "gpu-nvidia-h200-rnn-vs-transformer-cost.txt",
                            results / "gpu-nvidia-h200-transformer-plus-plus.txt",
                            *(gallery / "rnn-vs-transformer-cost" / f for f in ("results.json", "table.md",
                                                                                  "plot.png"))}
    assert all(path.is_file() for path in written)
    assert "| attnkit | 500,000 |" in (results / "gpu-nvidia-h200.md").read_text()
    assert missing == ["benchmark part variants: no rows", "benchmark part serve: no rows",
                       "experiment transformer-plus-plus: did not finish (its log: "
                       f"{results / 'gpu-nvidia-h200-transformer-plus-plus.txt'})"]


def test_collect_refuses_a_smoke_session_and_an_experiment_run_on_another_budget(tmp_path):
    _session_files(tmp_path / "smoke", stem="gpu-smoke")
    with pytest.raises(gpu_results.Refused, match="gpu-smoke.json is a --smoke run's: it measures no GPU"):
        gpu_results.collect(tmp_path / "smoke", root=tmp_path / "repo")
    _session_files(tmp_path / "out")
    scratch = tmp_path / "scratch"
    with tarfile.open(tmp_path / "out" / "transformer-plus-plus.tgz") as tar:
        tar.extractall(scratch, filter="data")
    (scratch / "transformer-plus-plus" / "results.json").write_text(
        json.dumps({"name": "transformer-plus-plus", "budget": "tiny", "verdict": "held"}))
    with tarfile.open(tmp_path / "out" / "transformer-plus-plus.tgz", "w:gz") as tar:
        for member in ("transformer-plus-plus.txt", "transformer-plus-plus"):
            tar.add(scratch / member, arcname=member)
    with pytest.raises(gpu_results.Refused, match="is not a --budget gpu run of transformer-plus-plus"):
        gpu_results.collect(tmp_path / "out", root=tmp_path / "repo")
    assert not (tmp_path / "repo" / "docs").exists()  # nothing of the refused run reached the gallery


def _refusal(folder: Path, root: Path, capsys) -> str:
    """What `python -m benchmarks.gpu_results folder` says refusing it (exit 2, one line), checking nothing reached
    `root`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_results, "ROOT", root)
        assert gpu_results.main([str(folder)]) == 2
    said = capsys.readouterr()
    assert not root.exists(), sorted(root.rglob("*"))
    assert said.out == "" and said.err.count("\n") == 1 and said.err.endswith("; nothing was copied\n"), said.err
    return said.err


@pytest.mark.parametrize("spoil, says", [
    (lambda f: (f / "transformer-plus-plus.tgz").write_bytes((f / "transformer-plus-plus.tgz").read_bytes()[:300]),
     "transformer-plus-plus.tgz is not a whole .tgz"),
    (lambda f: (f / "gpu-nvidia-h200.json").write_text('{"machine": {"device": "cuda"}, "results": [{"impl": "x"}]}'),
     "gpu-nvidia-h200.json is not a report of python -m benchmarks gpu (a row of none of the parts"),
    (lambda f: (f / "gpu-nvidia-h200.json").write_text('{"machine": {"device": "cuda"}, "results": [3]}'),
     "is not a report of python -m benchmarks gpu"),
    (lambda f: (f / "gpu-nvidia-h200.json").write_text('{"machine": {"device": "cu'),
     "is not a report of python -m benchmarks gpu"),
    (lambda f: (f / "gpu-nvidia-h200.md").unlink(), "gpu-nvidia-h200.md is missing beside"),
    (lambda f: (f / "session.txt").write_text("== gpu_session 2026 parts: tests; budget 560 s; --smoke\ngpu: none\n"),
     "session.txt is a --smoke session's: it measures no GPU"),
    (lambda f: (f / "session.txt").write_text("== gpu_session 2026 parts: tests; budget 560 s\ngpu: none\n"),
     "session.txt says torch saw no CUDA device"),
    (lambda f: (f / "session.txt").write_text("tests: exit 0 after 80 s\n"), "session.txt names no GPU"),
    (lambda f: (f / "session.txt").write_text("gpu: NVIDIA H100 80GB HBM3\n"),
     "gpu-nvidia-h200.json is a run on 'NVIDIA H200', session.txt's GPU is 'NVIDIA H100 80GB HBM3'"),
], ids=["archive-cut-short", "row-of-no-part", "row-not-a-row", "report-cut-short", "markdown-missing",
        "smoke-session", "no-gpu", "no-gpu-line", "two-gpus"])
def test_collect_refuses_a_spoilt_or_partial_session_in_one_line_and_copies_nothing(tmp_path, capsys, spoil, says):
    """Files cut short on their way back, or not the script's: one line naming the file and why, exit 2, and
    nothing copied (not even the files that were whole)."""
    _session_files(tmp_path / "out")
    spoil(tmp_path / "out")
    assert says in _refusal(tmp_path / "out", tmp_path / "repo", capsys)


def test_collect_refuses_a_folder_that_is_not_a_session(tmp_path, capsys):
    assert "is no folder: give the folder $OUT's files came back to" in _refusal(
        tmp_path / "nowhere", tmp_path / "repo", capsys)
    (tmp_path / "empty").mkdir()
    assert "holds neither a gpu-*.json report nor session.txt" in _refusal(tmp_path / "empty", tmp_path / "repo",
                                                                           capsys)


def test_collect_without_a_report_keeps_the_tests_and_experiments_named_after_session_txts_gpu(tmp_path):
    """A session whose benchmark parts all failed before writing a report (bench-log.txt says why) still brings
    back the CUDA tests' log and the experiments: they are collected under the GPU session.txt names."""
    _session_files(tmp_path / "out", gpu="NVIDIA H100 80GB HBM3")
    for suffix in ("json", "md"):
        (tmp_path / "out" / f"gpu-nvidia-h200.{suffix}").unlink()
    written, missing = gpu_results.collect(tmp_path / "out", root=tmp_path / "repo")
    results = tmp_path / "repo" / "benchmarks" / "results"
    assert {p.name for p in written if p.parent == results} == {
        f"gpu-nvidia-h100-80gb-hbm3-{name}.txt" for name in ("pytest", "session", "bench-log",
                                                              *gpu_results.EXPERIMENTS)}
    assert missing[0] == "the benchmark's report: no part wrote one (bench-log.txt says why)"
