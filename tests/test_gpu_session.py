"""benchmarks/gpu_session.sh, the one script a rented GPU machine runs: its CUDA tests are every test module that
holds one (a module left out would go unrun there without a word), and a part it does not know is refused before
any part runs."""

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
    result = _session(tmp_path, "tests", "train", "experiments", budget=0)
    assert result.returncode == 0, result.stdout + result.stderr
    session = (tmp_path / "out" / "session.txt").read_text()
    stages = re.findall(r"^([\w-]+): not started, -?\d+ s left of 0 and it needs (\d+) s$", session, re.MULTILINE)
    assert stages == [("tests", "60"), ("train", "110"), ("rnn-vs-transformer-cost", "40"),
                      ("transformer-plus-plus", "240")]
    assert not (tmp_path / "out" / "pytest-gpu.txt").exists()


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


def _session_files(folder: Path, *, stem: str = "gpu-nvidia-h200", finished: bool = True) -> None:
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
    (folder / "session.txt").write_text("tests: exit 0 after 80 s of its 150 s\n")
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
                            results / "gpu-nvidia-h200-rnn-vs-transformer-cost.txt",
                            results / "gpu-nvidia-h200-transformer-plus-plus.txt",
                            *(gallery / "rnn-vs-transformer-cost" / f for f in ("results.json", "table.md",
                                                                                  "plot.png"))}
    assert all(path.is_file() for path in written)
    assert "| attnkit | 500,000 |" in (results / "gpu-nvidia-h200.md").read_text()
    assert missing == ["benchmark part serve: no rows", "benchmark part variants: no rows",
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
