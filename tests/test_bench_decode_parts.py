"""`python -m benchmarks decode_parts` runs end to end on a tiny batch-1 case: the weights a token reads, counted
from the model's own linear layers, and each part's time, written to the results folder it is given."""

import json

import pytest
import torch
from torch import nn

from attnkit import build_model
from attnkit.generate import native_gemv
from attnkit.layers.kernels import MathKernel, use_math_kernel
from attnkit.machine import AttentionKernelLimits
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
    # the math kernel reads an fp32 cache as it is; a bf16 one it widens, keys and values, in each layer it serves
    copies = {r["dtype"]: r["cache_copies_per_token"] for r in report["rows"]}
    assert copies["fp32"] == 0 and copies["bf16"] in (0, 2 * 2), copies


def test_the_cache_copies_are_the_math_kernels_keys_and_values_at_each_length(monkeypatch):
    """Counted from the layers the plan gave a math kernel, at the lengths it covers: none beyond its limit."""
    model = build_model(speed.attnkit_config(TINY)).to(torch.bfloat16)
    limits = AttentionKernelLimits(decode_keys=TINY.seq_len + 2, pass_keys=0)
    use_math_kernel(model, MathKernel("cpu", torch.bfloat16, limits))
    copies = bench_decode_parts.cache_copies(model, TINY, torch.bfloat16)
    assert sorted(c.shape[2] for c in copies) == sorted([TINY.seq_len + 1, TINY.seq_len + 2] * 2 * 2)
    assert all(c.dtype == torch.bfloat16 and c.shape[:2] == (1, 2) for c in copies)
    assert bench_decode_parts.cache_copies(model, TINY, torch.float32) == []


def test_the_decode_parts_benchmark_refuses_a_case_of_several_rows():
    with pytest.raises(SystemExit):
        bench_decode_parts.main(["--case", "generate-small-b8"])
