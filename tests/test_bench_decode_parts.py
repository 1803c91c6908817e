"""`python -m benchmarks decode_parts` runs end to end on a tiny batch-1 case: the weights a token reads, counted
from the model's own linear layers, and each part's time, written to the results folder it is given."""

import json

import pytest
import torch
from torch import nn

from attnkit import build_model
from attnkit.generate import native_gemv
from benchmarks import bench_decode_parts, common, speed

TINY = speed.Case("generate-tiny-b1", "generate", "decoder", 2, 32, 2, 40, 8, 1, new_tokens=4)


def test_the_decode_parts_benchmark_counts_the_weights_a_token_reads(tmp_path, monkeypatch):
    if native_gemv.unavailable() is not None:
        pytest.skip(f"the native kernels cannot run here: {native_gemv.unavailable()}")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(speed, "CASES", [*speed.CASES, TINY])
    monkeypatch.setattr(bench_decode_parts, "CALLS", 2)
    threads = torch.get_num_threads()
    try:
        assert bench_decode_parts.main(["--case", TINY.name, "--rounds", "1", "--dtypes", "fp32", "bf16"]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark runs on one thread
    report = json.loads((tmp_path / "results" / "decode-parts-cpu.json").read_text())
    linear = [m for m in build_model(speed.attnkit_config(TINY)).modules() if isinstance(m, nn.Linear)]
    weights = sum(m.weight.numel() for m in linear)  # the output layer shares the embedding's table: read once more
    assert [(r["dtype"], r["weight_mb"]) for r in report["rows"]] == [
        ("fp32", round(4 * weights / 1e6, 2)), ("bf16", round(2 * weights / 1e6, 2))]
    for row in report["rows"]:
        assert row["layers"] == 2 * 4 + 1 and min(row["step_ms"], row["layers_ms"], row["products_ms"]) > 0, row


def test_the_decode_parts_benchmark_refuses_a_case_of_several_rows():
    with pytest.raises(SystemExit):
        bench_decode_parts.main(["--case", "generate-small-b8"])
