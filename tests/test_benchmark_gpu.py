"""`python -m benchmarks gpu`: it refuses without CUDA (saying how to check it anyway), reports each row against
its peer from the same run, adds one part's rows to an earlier report of the same GPU (`--append`), and runs end to
end at tiny shapes on the CPU (`--smoke`, slow)."""

import json
import tempfile

import numpy as np
import pytest
import torch

from benchmarks import bench_gpu
from benchmarks.nanogpt import GPT, GPTConfig, attnkit_state_dict


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
        {"part": "serve", "impl": "attnkit serve", "clients": 8, "tokens_per_s": 650.0, "p50_s": 0.2, "p99_s": 0.3,
         "mean_batch": 7.4, "ms_per_iteration": 1.2, "prefills": 20},
        {"part": "serve", "impl": "attnkit serve", "error": "RuntimeError: the server did not start"},
    ]
    report = {"machine": {"device": "cuda", "name": "NVIDIA H200", "torch": "2.x", "cuda": "13.0",
                          "measured_bf16_tflops": 700.0}, "command": "python -m benchmarks gpu",
              "train_shape": "12 layers", "results": rows}
    text = bench_gpu.markdown(report)
    assert "| attnkit | 500,000 | 32.0 | 1.25x | 50.0% | 11.0 GB |" in text
    assert "| attnkit-llama2 | failed: RuntimeError: out of memory |" in text
    assert "| generate-gpt2-124m-b1 | attnkit-compiled | 1,500.0 | 0.67 | 3.00x |" in text
    assert "| 8 | 650.0 | 0.2 s | 0.3 s | 7.4 | 1.2 | 20 |" in text
    assert "8 clients: 6.50x one at a time (target >= 5x)." in text and "32 clients" not in text  # not measured
    assert "| failed: RuntimeError: the server did not start |" in text


def _results_in(tmp_path, monkeypatch) -> None:
    """The benchmark's folders (named attnkit-gpu-...) under tmp_path; every other temporary folder (inductor's) as
    tempfile makes it."""
    make = tempfile.mkdtemp

    def mkdtemp(suffix=None, prefix=None, dir=None):
        return str(tmp_path / prefix) if prefix and prefix.startswith("attnkit-gpu") else make(suffix, prefix, dir)

    monkeypatch.setattr(bench_gpu.tempfile, "mkdtemp", mkdtemp)


@pytest.mark.slow
def test_smoke_run_times_every_training_row(tmp_path, monkeypatch, capsys):
    _results_in(tmp_path, monkeypatch)
    assert bench_gpu.main(["--smoke", "--only", "train", "--rounds", "1", "--steps", "1", "--warmup", "1"]) == 0
    report = json.loads((tmp_path / "attnkit-gpu-smoke-" / "gpu-smoke.json").read_text())
    assert {r["impl"] for r in report["results"]} == {"nanogpt-compiled", "attnkit", "attnkit-eager", "attnkit-llama2"}
    assert all(r["tokens_per_s"] > 0 for r in report["results"])


@pytest.mark.parametrize("bias", [True, False], ids=["biases (GPT-2, the GPU's peer)", "no biases (shakespeare_char)"])
def test_the_peer_has_attnkits_gpt2_loss_and_gradients_on_the_same_weights(bias):
    """nanoGPT's model (exact GELU, tied weights, its init; with biases as GPT-2 and the GPU benchmark run it, without
    as its shakespeare_char setting and the CPU recipes' row run it) and attnkit's GPT-2 block with exact GELU give the
    same loss and the same gradient for every weight: the peer computes what attnkit computes."""
    from attnkit import build_model, presets

    torch.manual_seed(0)
    vocab, length, width, heads, layers = 96, 16, 32, 4, 2
    peer = GPT(GPTConfig(block_size=length, vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=width, bias=bias))
    config = presets.get("gpt2-124m", vocab_size=vocab, n_layers=layers, d_model=width, n_heads=heads,
                         d_ff=4 * width, max_seq_len=length, dropout=0.0, activation="gelu", bias=bias)
    ours = build_model(config)
    missing, unexpected = ours.load_state_dict({k: v.detach() for k, v in attnkit_state_dict(peer).items()},
                                               strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the token embedding
    x, y = torch.randint(0, vocab, (3, length)), torch.randint(0, vocab, (3, length))
    _, peer_loss = peer(x, y)
    our_loss = ours(x, labels=y).loss
    torch.testing.assert_close(our_loss, peer_loss)
    peer_loss.backward()
    our_loss.backward()
    ours_by_name = dict(ours.named_parameters())
    expected = attnkit_state_dict(peer)
    for name, peer_param in expected.items():
        q_k_v = name.split(".")[-2] in ("q_proj", "k_proj", "v_proj")
        if q_k_v:  # c_attn's gradient is q's, k's and v's side by side
            continue
        torch.testing.assert_close(ours_by_name[name].grad, peer_param.grad, msg=name)
    for i, block in enumerate(peer.transformer.h):
        for kind in ("weight", "bias") if bias else ("weight",):
            joined = torch.cat([ours_by_name[f"stack.blocks.{i}.self_attn.{n}_proj.{kind}"].grad for n in "qkv"])
            torch.testing.assert_close(joined, getattr(block.attn.c_attn, kind).grad)


def test_the_peers_step_compiles_its_loss_into_the_one_forward_graph():
    """train.py's `logits, loss = model(X, Y)` through `torch.compile(model)`: the step's forward is one graph, and
    the cross-entropy is in it (a backend that records what Dynamo hands it)."""
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    stream = np.random.default_rng(0).integers(0, bench_gpu.SMOKE.vocab_size, 4_000).astype(np.uint16)
    _, step = bench_gpu.nanogpt_step(bench_gpu.SMOKE, stream, torch.device("cpu"), backend=recording)
    step()
    step()
    assert len(graphs) == 1, [g.code for g in graphs]
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert torch.nn.functional.cross_entropy in targets, targets


@pytest.mark.slow  # seven trainers built and stepped: about 15 s on 2 cores
def test_smoke_run_times_each_variant_against_sdpa_causal_and_says_why_flex_is_skipped(tmp_path, monkeypatch):
    """`--only variants` at the tiny shape on the CPU: every variant's SDPA and reference rows are timed, and
    FlexAttention's are skipped with the reason (no backward on the CPU), not failed."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU FlexAttention's rows run")
    _results_in(tmp_path, monkeypatch)
    assert bench_gpu.main(["--smoke", "--only", "variants", "--rounds", "1", "--steps", "1", "--warmup", "1"]) == 0
    report = json.loads((tmp_path / "attnkit-gpu-smoke-" / "gpu-smoke.json").read_text())
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"SDPA-causal"} | {f"{name}, {kernel}" for name in bench_gpu.VARIANTS
                                           for kernel in ("FlexAttention", "SDPA dense bias", "reference")}
    assert all("no backward on the CPU" in rows[f"{name}, FlexAttention"]["skipped"] for name in bench_gpu.VARIANTS)
    assert all(r["ms_per_step"] > 0 for impl, r in rows.items() if not impl.endswith("FlexAttention"))
    table = (tmp_path / "attnkit-gpu-smoke-" / "gpu-smoke.md").read_text()
    assert "| SDPA-causal |" in table and "| ALiBi, FlexAttention | skipped: FlexAttention has no backward" in table


def test_the_variants_table_gives_each_row_against_sdpa_causal_and_its_reference():
    rows = [{"part": "variants", "impl": "SDPA-causal", "ms_per_step": 100.0},
            {"part": "variants", "impl": "ALiBi, FlexAttention", "ms_per_step": 120.0},
            {"part": "variants", "impl": "ALiBi, reference", "ms_per_step": 480.0},
            {"part": "variants", "impl": "sliding window, FlexAttention", "error": "RuntimeError: boom"}]
    text = "\n".join(bench_gpu.variants_markdown(rows, "Variants"))
    assert "| ALiBi, FlexAttention | 120.0 | 1.20x | 4.00x |" in text
    assert "| ALiBi, reference | 480.0 | 4.80x | - |" in text
    assert "| sliding window, FlexAttention | failed: RuntimeError: boom | | |" in text


@pytest.mark.parametrize("block, kernel", [("gpt2", {"attention": "sdpa"}),
                                           ("llama2", {"reference": True, "packed": True})])
def test_each_attnkit_row_builds_its_trainer_and_takes_a_step(tmp_path, block, kernel):
    """The benchmark's own step builder, eager at the tiny shape on the CPU: the rows the GPU run times are built as
    the trainer takes its settings today (the slow smoke runs above would be the first to find a renamed setting,
    and on a GPU every attnkit row would fail)."""
    shape = bench_gpu.SMOKE
    stream = bench_gpu.token_stream(shape, document_tokens=shape.seq_len // 3 if kernel.get("packed") else 0)
    n_params, step = bench_gpu.attnkit_step(shape, stream, torch.device("cpu"), block=block, compile="off",
                                            run_dir=tmp_path, **kernel)
    assert n_params > 0
    step()


def test_append_keeps_the_report_of_the_same_gpu_and_refuses_another(tmp_path, capsys):
    """`--append` (one process a part, benchmarks/gpu_session.sh): the rows an earlier part wrote are read back from
    a report of the same GPU and torch; a report of another GPU, or a file that is no report, is refused by name."""
    machine = {"device": "cuda", "name": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0"}
    path = tmp_path / "gpu-nvidia-h200.json"
    assert bench_gpu.earlier_report(path, machine) == {"command": None, "results": []}  # nothing yet
    rows = [{"part": "train", "impl": "attnkit", "tokens_per_s": 5e5, "ms_per_step": 32.0, "mfu_spec": 0.5,
             "peak_gpu_gb": 9.8}, {"part": "serve", "impl": "attnkit serve", "error": "RuntimeError: no server"}]
    bench_gpu.write_report({"machine": machine, "command": "python -m benchmarks gpu --only train serve",
                            "train_shape": "12 layers", "results": rows}, tmp_path, "gpu-nvidia-h200")
    assert bench_gpu.earlier_report(path, machine)["results"] == rows
    assert bench_gpu.earlier_report(path, {**machine, "name": "NVIDIA H100 80GB HBM3"}) is None
    assert "is a run on NVIDIA H200 with torch 2.11.0+cu130, this is NVIDIA H100" in capsys.readouterr().out
    path.write_text('{"results": [{"part": "nothing"}], "machine": {}}')
    assert bench_gpu.earlier_report(path, machine) is None
    assert "is not a report of python -m benchmarks gpu" in capsys.readouterr().out


def test_variants_hand_over_their_rows_one_variant_at_a_time():
    """A variants run cut at its time limit keeps the variants it finished: after each variant its rows, timed in
    turns with SDPA-causal's (built once), go to `done` with every row before them (main writes the report there)."""
    handed = []
    rows = bench_gpu.variant_rows(bench_gpu.SMOKE, torch.device("cpu"), rounds=1, steps=1, warmup=1, compile="off",
                                  done=lambda so_far: handed.append([dict(r) for r in so_far]))
    names = [[r["impl"] for r in so_far] for so_far in handed]
    assert names == [[r["impl"] for r in rows][: 1 + 3 * n] for n in (1, 2, 3)]
    assert names[0] == ["SDPA-causal", "ALiBi, FlexAttention", "ALiBi, SDPA dense bias", "ALiBi, reference"]
    assert all(r["ms_per_step"] > 0 for r in handed[0] if "skipped" not in r)  # timed before it is handed over
    assert len(handed[-1][0]["round_ms"]) == 3  # SDPA-causal took its turn beside each variant


def test_append_exits_on_this_parts_rows_alone(tmp_path, monkeypatch):
    """With --append, a part that succeeds exits 0 although an earlier part's row in the same report failed (the
    GPU session notes each stage's exit status: the earlier failure is the earlier stage's), and both rows stay."""
    train = {"part": "train", "impl": "attnkit", "error": "RuntimeError: out of memory"}
    bench_gpu.write_report({"machine": bench_gpu.machine(torch.device("cpu")), "command": "python -m benchmarks gpu "
                            "--smoke --only train", "train_shape": "2 layers", "results": [train]}, tmp_path,
                           "gpu-smoke")
    serve = {"part": "serve", "impl": "attnkit serve", "clients": 1, "tokens_per_s": 100.0, "p50_s": 0.1, "p99_s": 0.2}
    monkeypatch.setattr(bench_gpu, "serve_rows", lambda device, smoke: [serve])
    assert bench_gpu.main(["--smoke", "--only", "serve", "--append", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "gpu-smoke.json").read_text())["results"] == [train, serve]
    failing = {**serve, "error": "RuntimeError: the server did not start"}
    monkeypatch.setattr(bench_gpu, "serve_rows", lambda device, smoke: [failing])
    assert bench_gpu.main(["--smoke", "--only", "serve", "--append", "--out", str(tmp_path)]) == 1
