"""`python -m benchmarks decode_parts` runs end to end on a tiny batch-1 case: the weights a token reads, counted
from the model's own linear layers, and each part's time, written to the results folder it is given; and
`python -m benchmarks decode_attention`: each attention kernel at each key count, and the token with the one-query
kernel off and on."""

import json

import pytest
import torch
from torch import nn

from attnkit import build_model
from attnkit.generate import native_gemv
from attnkit.layers.kernels import MathKernel, use_math_kernel
from attnkit.machine import AttentionKernelLimits
from benchmarks import bench_decode_attention, bench_decode_parts, common, speed

TINY = speed.Case("generate-tiny-b1", "generate", "decoder", 2, 32, 2, 40, 8, 1, new_tokens=4)


def run_on_tiny(benchmark, argv: list[str], results, monkeypatch) -> dict:
    """`benchmark.main(argv)` on the TINY case, two calls a timing, writing under `results`; the report it wrote."""
    if native_gemv.unavailable() is not None:
        pytest.skip(f"the native kernels cannot run here: {native_gemv.unavailable()}")
    monkeypatch.setattr(common, "RESULTS", results)
    monkeypatch.setattr(speed, "CASES", [*speed.CASES, TINY])
    monkeypatch.setattr(benchmark, "CALLS", 2)
    threads = torch.get_num_threads()
    try:
        assert benchmark.main(["--case", TINY.name, *argv]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmarks run on one thread
    return json.loads(next(results.glob("*.json")).read_text())


def test_the_decode_parts_benchmark_counts_the_weights_a_token_reads(tmp_path, monkeypatch):
    report = run_on_tiny(bench_decode_parts, ["--rounds", "1", "--dtypes", "fp32", "bf16"], tmp_path / "results",
                         monkeypatch)
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


def test_the_decode_attention_benchmark_times_each_kernel_and_the_token(tmp_path, monkeypatch):
    report = run_on_tiny(bench_decode_attention, ["--keys", "1", "5", "--rounds", "1", "--token-rounds", "2"],
                         tmp_path / "results", monkeypatch)
    assert {dtype: [row["keys"] for row in rows] for dtype, rows in report["kernels"].items()} == {
        "fp32": [1, 5], "bf16": [1, 5]}
    assert all(row[f"{kernel}_us"] > 0 for rows in report["kernels"].values() for row in rows
               for kernel in ("sdpa", "math", "native"))
    # bf16 has the one-query kernel where the machine's profile sends its decoding attention to the math kernel
    assert [row["dtype"] for row in report["tokens"]] in ([], ["bf16"])
    assert all(row["rounds"] == 2 and row["on_over_off_median"] > 0 for row in report["tokens"])


def test_the_decode_attention_benchmark_refuses_a_case_of_several_rows():
    with pytest.raises(SystemExit):
        bench_decode_attention.main(["--case", "generate-small-b8"])
