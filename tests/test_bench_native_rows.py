"""`python -m benchmarks native_rows` runs end to end on one small shape: a row per dtype and row count, each
kernel's time and their ratio, written to the results folder it is given."""

import json

import pytest
import torch

from attnkit.generate import native_gemv
from benchmarks import bench_native_rows, common


def test_the_native_rows_benchmark_writes_a_row_per_dtype_and_row_count(tmp_path, monkeypatch):
    if native_gemv.unavailable() is not None:
        pytest.skip(f"the native kernels cannot run here: {native_gemv.unavailable()}")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench_native_rows, "WEIGHTS_MB", 0)  # one copy of the layer: the sizes, not the memory's rate
    threads = torch.get_num_threads()
    try:
        assert bench_native_rows.main(["--rows", "1", "3", "--rounds", "1", "--shapes", "40x24"]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark runs on one thread
    stem = f"native-rows-{bench_native_rows.CpuCapabilities.detect().isa.split()[0].lower()}"
    report = json.loads((tmp_path / "results" / f"{stem}.json").read_text())
    assert [(r["dtype"], r["shape"], r["rows"]) for r in report["results"]] == [
        ("float32", "40x24", 1), ("float32", "40x24", 3), ("bfloat16", "40x24", 1), ("bfloat16", "40x24", 3)]
    for r in report["results"]:
        assert r["ms"]["native"] > 0 and r["ms"]["matrix"] > 0, r
        assert r["matrix_over_native"] == pytest.approx(r["ms"]["matrix"] / r["ms"]["native"]), r
    assert report["native_rows"] == bench_native_rows.NATIVE_ROWS
    assert "| bfloat16 | 40x24 | 3 |" in (tmp_path / "results" / f"{stem}.md").read_text()
