"""The speed suite's figures do not mislead on any CPU: a row's utilisation divides by the peak of the arithmetic it
runs, ratios are taken round by round, and the table names the CPU's capabilities."""

import subprocess

import pytest
import torch

from attnkit.machine import CpuCapabilities
from benchmarks import speed
from benchmarks.speed import INT8_DYNAMIC, markdown_table, round_ratio, row_peak

AVX2 = CpuCapabilities(isa="AVX2", flags=frozenset({"avx2"}), name="AVX2-only CPU")
AVX512 = CpuCapabilities(isa="AVX512", flags=frozenset({"avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"}))
PEAKS = {"fp32_flops": 1e11, "bf16_flops": 2e9}  # bf16 far below fp32, as a CPU without bf16 kernels measures it


def _row(impl, dtype, **extra):
    return {"case": "generate-small-b1", "impl": impl, "dtype": dtype, "tokens_per_s": 10.0, **extra}


def test_each_row_divides_by_the_peak_of_its_own_arithmetic():
    assert row_peak(_row("attnkit", "fp32"), PEAKS, AVX2) == PEAKS["fp32_flops"]
    assert row_peak(_row("attnkit", "bf16"), PEAKS, AVX512) == PEAKS["bf16_flops"]
    assert row_peak(_row("attnkit", "bf16"), PEAKS, AVX2) == PEAKS["fp32_flops"]  # converted to fp32 inside
    assert row_peak(_row(INT8_DYNAMIC, "bf16"), PEAKS, AVX512) is None  # int8 products: no measured peak
    assert row_peak(_row("attnkit-int4", "bf16"), PEAKS, AVX512) == PEAKS["fp32_flops"]  # the int4 kernel's fp32 FMAs
    assert row_peak(_row("llama.cpp-q4_0", "bf16"), PEAKS, AVX512) is None
    assert row_peak(_row("attnkit", "bf16"), {"fp32_flops": 1e11}, AVX512) is None  # bf16 peak not measured


def test_ratios_are_the_median_of_each_rounds_own_ratio():
    ours = _row("attnkit", "fp32", rounds_tokens_per_s=[10.0, 30.0, 20.0])
    ref = _row("transformers", "fp32", rounds_tokens_per_s=[5.0, 30.0, 40.0])
    assert round_ratio(ours, ref) == pytest.approx(1.0)  # rounds 2.0, 1.0, 0.5: the median, 1.0
    assert round_ratio(_row("a", "fp32", tokens_per_s=9.0), _row("b", "fp32", tokens_per_s=3.0)) == pytest.approx(3.0)


def test_the_table_names_the_cpu_and_leaves_unmeasured_utilisation_blank():
    ours = {**_row(INT8_DYNAMIC, "bf16"), "peak_rss_mb": 100.0, "ms_per_token": 1.0}
    ref = {**_row("transformers", "bf16"), "peak_rss_mb": 120.0, "mfu": 0.01}
    report = {"machine": "m", "device": "cpu", "threads": 1, "torch": "2", "peaks": {"fp32_flops": 1e11},
              "command": "c", "results": [ours, ref], "cpu": AVX2.to_dict()}
    table = markdown_table(report)
    assert "AVX2-only CPU: AVX2 (avx2)" in table and "fp32 0.10 TFLOP/s" in table
    row = next(line for line in table.splitlines() if line.startswith("| generate-small-b1"))
    assert "| - | 1.0% |" in row


def test_isa_avx2_runs_the_suite_again_with_the_avx2_kernels_and_says_so(monkeypatch):
    """--isa avx2 starts the whole run again with PyTorch's and oneDNN's AVX2 kernels (its measured processes inherit
    them), naming the CPU's own level; the table then says the figures are emulated."""
    started = []
    monkeypatch.setattr(speed.subprocess, "run", lambda args, **kw: started.append((args, kw["env"])) or
                        subprocess.CompletedProcess(args, 0))
    assert speed.main(["--isa", "avx2", "--only", "generate-small-b1"]) == 0
    (args, env), = started
    assert args[1:3] == ["-m", "benchmarks.speed"]
    assert args[-2:] == ["--emulating", torch.backends.cpu.get_cpu_capability()]
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    report = {"machine": "m-avx2", "device": "cpu", "threads": 1, "torch": "2", "peaks": {"fp32_flops": 1e11},
              "command": "c", "results": [], "cpu": AVX2.to_dict(), "load_average": [3.0, 2.5, 2.0],
              "emulated": "AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2) on a CPU whose own level "
                          "is AVX512"}
    table = markdown_table(report)
    assert "Emulated: AVX2 kernels" in table and "own level is AVX512" in table and "load average" in table


def test_a_prefill_row_counts_the_prompts_tokens_and_chooses_one(monkeypatch):
    """tokens/s over the prompt's tokens (1,024), each repetition generating one token after it; peers as for
    generation."""
    asked = []
    monkeypatch.setattr(speed, "step_function",
                        lambda case, impl, dtype, device="cpu": (None, lambda: asked.append(case.new_tokens)))
    monkeypatch.setattr(speed, "timed_runs", lambda fn, repeats, warmup=0: [fn() or 0.5 for _ in range(repeats)])
    result = speed.run_one("prefill-small-1024", "attnkit", "fp32", repeats=3, warmup=1)
    assert result["tokens_per_s"] == pytest.approx(1024 / 0.5) and "ms_per_token" not in result
    case = next(c for c in speed.CASES if c.name == "prefill-small-1024")
    assert asked and set(asked) == {case.new_tokens} == {1}
    assert "llama.cpp" in speed.peer_impls(case, "fp32", compiled=False)
