"""Devices: every command that runs a model takes `--device`, refuses one this machine lacks in one line, and runs on a
CUDA device where there is one. Tests marked `gpu` need CUDA; elsewhere conftest skips them with the reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cli_helpers import tiny_runs

import attnkit
from attnkit import cli
from attnkit.errors import ConfigError
from attnkit.machine import pick_device

TEXT = "the cat sat on the mat. the dog ate the log. " * 40
TINY_MODEL = ["--set", "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=32"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tiny_runs(tmp_path_factory.mktemp("device-runs"))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("device-text") / "text.txt"
    path.write_text(TEXT)
    return path


def _one_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2, argv
    printed = capsys.readouterr()
    errors = [line for line in printed.err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in printed.err, (argv, printed.err)
    return errors[0]


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "mps"])
def test_a_device_attnkit_does_not_run_on_is_refused_naming_the_choices(name):
    with pytest.raises(ConfigError, match="use cpu, cuda or cuda:N|runs on cpu and cuda"):
        pick_device(name)


def test_no_device_means_cuda_where_present_else_the_cpu():
    assert pick_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("command", ["generate", "serve", "eval", "train"])
def test_every_command_refuses_cuda_on_a_machine_without_it_in_one_line(command, runs, text_file, tmp_path, capsys):
    argv = {
        "generate": ["generate", str(runs["lm"]), "--prompt", "a"],
        "serve": ["serve", str(runs["lm"])],
        "eval": ["eval", str(runs["lm"]), "--data", str(text_file)],
        "train": ["train", "--out", str(tmp_path / "run"), "--data", str(text_file), "--max-steps", "1"],
    }[command]
    line = _one_error(capsys, [*argv, "--device", "cuda"])
    assert "no CUDA device" in line and "--device cpu" in line
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_load_refuses_cuda_on_a_machine_without_it(runs):
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    with pytest.raises(ConfigError, match="no CUDA device"):
        attnkit.load(runs["lm"], device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_on_cuda_saves_a_run_that_loads_on_the_cpu(dtype, text_file, tmp_path, capsys):
    """Each stage says what it saw when it fails: the command's exit code and output (with the training plan), the
    saved weights' dtypes and whether they are finite, and what generation returned."""
    out = tmp_path / "run"
    code = cli.main(["train", "--out", str(out), "--data", str(text_file), "--tokenizer", "char", "--max-steps", "3",
                     "--batch-size", "2", "--seq-len", "16", "--dtype", dtype, "--device", "cuda", "--explain",
                     "--no-progress", *TINY_MODEL])
    printed = capsys.readouterr()
    metrics = (out / "metrics.jsonl").read_text()[-2000:] if (out / "metrics.jsonl").exists() else "(none)"
    assert code == 0, f"attnkit train exited {code}\nstdout:\n{printed.out[-4000:]}\nstderr:\n{printed.err[-4000:]}" \
                      f"\nmetrics.jsonl (end):\n{metrics}"
    pipeline = attnkit.load(out, device="cpu")
    weights = pipeline.model.state_dict()
    odd = {name: (str(w.dtype), str(w.device)) for name, w in weights.items()
           if w.is_floating_point() and (w.dtype != torch.float32 or w.device.type != "cpu" or not w.isfinite().all())}
    assert pipeline.device.type == "cpu" and not odd, f"weights not float32, not on the CPU or not finite: {odd}"
    text = pipeline.generate("the ", max_new_tokens=4, temperature=0)
    assert text and all(isinstance(t, str) for t in text), f"generate returned {text!r}"


@pytest.mark.gpu
def test_greedy_generation_on_cuda_equals_the_cpu(runs):
    on_cpu = attnkit.load(runs["lm"], device="cpu")
    on_gpu = attnkit.load(runs["lm"], device="cuda")
    assert on_gpu.device.type == "cuda"
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    expected = on_cpu.model(ids).logits
    got = on_gpu.model(ids.cuda()).logits.cpu()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert on_gpu.generate("abc", max_new_tokens=8, temperature=0) == on_cpu.generate("abc", max_new_tokens=8,
                                                                                       temperature=0)


@pytest.mark.gpu
def test_evaluation_on_cuda_equals_the_cpu(runs, text_file):
    from attnkit.train.evaluate import evaluate_run

    cpu_loss, gpu_loss = (evaluate_run(runs["lm"], [text_file], device=device).rows[0]["loss"]
                          for device in ("cpu", "cuda"))
    assert abs(cpu_loss - gpu_loss) < 1e-3 * max(1.0, abs(cpu_loss))


@pytest.mark.gpu
def test_the_server_generates_on_cuda(runs):
    pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra")
    httpx = pytest.importorskip("httpx")
    from serve_helpers import running_server

    with running_server(runs["lm"], device="cuda") as (url, app):
        answer = httpx.post(f"{url}/v1/completions", json={"model": runs["lm"].name, "prompt": "abc", "max_tokens": 4,
                                                            "temperature": 0}, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4


@pytest.mark.gpu
def test_cuda_graph_decoding_gives_eager_decodings_tokens():
    """The compiled static step replayed from a CUDA graph (`GraphedStep`) chooses eager decoding's tokens, over
    several caches of one shape (a graph for each) and two batch sizes."""
    from generate_models import tiny_model

    from attnkit.generate import StaticDecoding, generate_tokens

    model, config = tiny_model(position="rope", seed=2, n_kv_heads=2)
    model = model.float().cuda()
    decoding = StaticDecoding(model)
    for prompts in ([[1, 2, 3]], [[4, 5, 6, 7]], [[1, 2, 3], [9, 8, 7, 6, 5]]):
        eager = generate_tokens(model, prompts, max_new_tokens=12, context_len=config.max_seq_len)
        graphed = generate_tokens(model, prompts, max_new_tokens=12, context_len=config.max_seq_len,
                                  decoding=decoding)
        assert graphed == eager
    assert decoding._graphs_fail is None and decoding._graphed is not None


@pytest.mark.gpu
@pytest.mark.parametrize("compile", ["model", "blocks"])
def test_compiled_training_on_cuda_follows_eager_training(compile, tmp_path):
    """The plan's compiled step (whole model, fullgraph; or per block) trains like the eager one: the same logged
    losses within bf16-free fp32 tolerance, every step read at the plan's host reads."""
    from test_train import request, train_losses

    from attnkit.train import prepare

    for name, setting in (("eager", "off"), ("compiled", compile)):
        trainer = prepare(dataclasses.replace(request(tmp_path / name, overrides=["dropout=0.0"], compile=setting),
                                              device="cuda"))
        assert trainer.plan.sync_every == trainer.settings.log_every
        trainer.fit()
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert [s for s, _ in compiled] == [s for s, _ in eager]
    for (_, a), (_, b) in zip(compiled, eager, strict=True):
        assert abs(a - b) < 2e-3 * max(1.0, abs(b))
