"""`python -m benchmarks gpu`: it refuses without CUDA (saying how to check it anyway), reports each row against
its peer from the same run, and runs end to end at tiny shapes on the CPU (`--smoke`, slow)."""

import json

import pytest
import torch

from benchmarks import bench_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the benchmark runs instead of refusing")
def test_refuses_without_cuda_and_names_the_smoke_run(capsys):
    assert bench_gpu.main([]) == 2
    assert "--smoke" in capsys.readouterr().out


def test_table_gives_each_row_against_its_peer_and_names_failures():
    rows = [
        {"part": "train", "impl": "nanogpt-compiled", "tokens_per_s": 400_000.0, "ms_per_step": 40.0,
         "mfu_spec": 0.4, "peak_gpu_gb": 12.0},
        {"part": "train", "impl": "attnkit", "tokens_per_s": 500_000.0, "ms_per_step": 32.0, "mfu_spec": 0.5,
         "peak_gpu_gb": 11.0},
        {"part": "train", "impl": "attnkit-llama2", "error": "RuntimeError: out of memory"},
        {"part": "decode", "impl": "transformers-static", "case": "generate-gpt2-124m-b1", "tokens_per_s": 500.0,
         "ms_per_token": 2.0},
        {"part": "decode", "impl": "attnkit-compiled", "case": "generate-gpt2-124m-b1", "tokens_per_s": 1500.0,
         "ms_per_token": 0.67},
        {"part": "serve", "impl": "attnkit serve", "clients": 1, "tokens_per_s": 100.0, "p50_s": 0.1, "p99_s": 0.2},
        {"part": "serve", "impl": "attnkit serve", "clients": 8, "tokens_per_s": 650.0, "p50_s": 0.2, "p99_s": 0.3},
    ]
    report = {"machine": {"device": "cuda", "name": "NVIDIA H200", "torch": "2.x", "cuda": "13.0",
                          "measured_bf16_tflops": 700.0}, "command": "python -m benchmarks gpu",
              "train_shape": "12 layers", "results": rows}
    text = bench_gpu.markdown(report)
    assert "| attnkit | 500,000 | 32.0 | 1.25x | 50.0% | 11.0 GB |" in text
    assert "| attnkit-llama2 | failed: RuntimeError: out of memory |" in text
    assert "| generate-gpt2-124m-b1 | attnkit-compiled | 1,500.0 | 0.67 | 3.00x |" in text
    assert "8 clients: 6.50x one at a time." in text


@pytest.mark.slow
def test_smoke_run_times_every_training_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_gpu.tempfile, "mkdtemp", lambda prefix="": str(tmp_path / prefix))
    assert bench_gpu.main(["--smoke", "--only", "train", "--rounds", "1", "--steps", "1", "--warmup", "1"]) == 0
    report = json.loads((tmp_path / "attnkit-gpu-smoke-" / "gpu-smoke.json").read_text())
    assert {r["impl"] for r in report["results"]} == {"nanogpt-compiled", "attnkit", "attnkit-eager", "attnkit-llama2"}
    assert all(r["tokens_per_s"] > 0 for r in report["results"])
