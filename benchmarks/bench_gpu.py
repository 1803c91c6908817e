"""`python -m benchmarks gpu`: attnkit on one CUDA GPU against its peers, in one process, in about 10 minutes on an
H100 or H200 (planned: train, serve and decode took 251 s on an H200; variants, not yet run on a GPU, compiles ten
training rows, some 5 minutes). Every figure is a ratio against a peer timed in the same run, or a fraction of a
peak: the matrix product rate measured in this run, and the GPU's dense bf16 peak from its data sheet (989 TFLOP/s,
H100/H200 SXM).

    train   GPT-2 124M's shape (12 layers, width 768, 12 heads, batch 16 x 1,024, bf16 autocast): nanoGPT's model.py
            and train.py's step (`nanogpt.GPT`: biases, exact GELU, tied weights, its init; `logits, loss = model(X, Y)`
            with the loss inside `torch.compile(model)`; get_batch pinned and copied non_blocking; clipping; fused
            AdamW with its two decay groups) against
            attnkit's Trainer step as its plan runs it on this GPU (auto: compiled whole), attnkit eager
            (--compile off), and the Llama-2-style block (RoPE, RMSNorm, SwiGLU, 4 kv heads) at the same width;
            implementations take turns round by round; tokens/s, MFU and peak memory
    variants each attention variant's training step at the same shape (ALiBi, a sliding window of T/4, packed
            documents) through FlexAttention, SDPA with a dense bias and the reference path's plain products, against
            plain causal attention on SDPA (`variant_rows`; the CPU's small-shape run: `python -m benchmarks variants`)
    decode  gpt2-124m in bf16 at batch 1 and 8, 128 greedy tokens after 16: transformers eager and with its static
            cache compiled (its documented fastest path), attnkit eager and compiled (its static step, replayed from a
            CUDA graph); each in the speed suite's own way (`speed.run_one`)
    serve   `attnkit serve` on the GPU (`bench_serve`'s model, width 384), 1, 8 and 32 concurrent clients, each
            request exactly 64 tokens, with the scheduler's mean batch and time per iteration (the device's included)
            from the server's /metrics; targets: 8 clients >= 5x one client's tokens/s, 32 clients >= 12x

A row that fails records its error and the others go on (exit 1 where a row of the parts run failed); the parts run
in the order `--only` names them, and the results are written after each part (variants: after each variant).
Results: benchmarks/results/gpu-<device>.json and .md (or under --out), with the GPU's name, torch and CUDA versions;
`--append` keeps the other parts' rows of that report (benchmarks/gpu_session.sh runs one part a process). `--smoke`
runs every row at a tiny shape on whatever device there is (the CPU, in the test suite), to check this script where
no GPU is.

    python -m benchmarks gpu [--smoke] [--only train variants decode serve] [--append] [--rounds 2] [--steps 8]
                             [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import re
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnkit.outputs import atomic_write
from benchmarks.common import RESULTS
from benchmarks.nanogpt import GPT, GPTConfig, train_step

SPEC_PEAK_BF16 = 989e12  # H100 / H200 SXM, dense bf16 (the figure the issue and nanoGPT's MFU use)
PARTS = ("train", "variants", "decode", "serve")


@dataclass(frozen=True)
class TrainShape:
    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    seq_len: int
    batch_size: int

    def flops_per_token(self, n_params: int) -> float:
        """nanoGPT's `estimate_mfu`: 6 N per token for the weights, 12 L H Q T for attention's products."""
        head_dim = self.d_model // self.n_heads
        return 6 * n_params + 12 * self.n_layers * self.n_heads * head_dim * self.seq_len


GPT2 = TrainShape(12, 768, 12, 50257, 1024, 16)
SMOKE = TrainShape(2, 64, 4, 96, 32, 2)


def nanogpt_step(shape: TrainShape, stream: np.ndarray, device: torch.device, *, backend: str | Callable = "inductor"):
    """train.py's iteration (`nanogpt.train_step`) on model.py's GPT (`nanogpt.GPT`, the vocabulary padded to a
    multiple of 64, as for GPT-2's 50,304): get_batch from a uint16 token stream (pinned, copied non_blocking on
    CUDA), `torch.compile(model)`, under bf16 autocast `logits, loss = model(X, Y)`, clipping at 1.0, fused AdamW
    with its two decay groups and the learning rate set each iteration (get_lr's value past warmup, before decay at
    these step counts); TF32 on for fp32 products on CUDA, as train.py sets it. backend: torch.compile's backend (a
    test passes one that records the graphs). Returns (parameters counted as nanoGPT's get_num_params counts them,
    step)."""
    on_gpu = device.type == "cuda"
    config = GPTConfig(block_size=shape.seq_len, vocab_size=shape.vocab_size + (-shape.vocab_size % 64),
                       n_layer=shape.n_layers, n_head=shape.n_heads, n_embd=shape.d_model, bias=True)
    model = GPT(config).to(device)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)

    def get_batch() -> tuple[Tensor, Tensor]:
        ix = torch.randint(len(stream) - shape.seq_len, (shape.batch_size,))
        x = torch.stack([torch.from_numpy(stream[i : i + shape.seq_len].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(stream[i + 1 : i + 1 + shape.seq_len].astype(np.int64)) for i in ix])
        if on_gpu:
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    iteration = train_step(model, optimizer, get_batch, forward=torch.compile(model, backend=backend),
                           ctx=torch.autocast(device.type, dtype=torch.bfloat16), lr=lambda it: 6e-4, grad_clip=1.0)

    def step() -> None:
        with tf32(on_gpu):
            iteration()

    return model.get_num_params(), step


@contextmanager
def tf32(on: bool):
    """train.py's `torch.backends.cuda.matmul.allow_tf32 = True` for the peer's steps, restored after (the other
    rows' plans set their own)."""
    before = torch.get_float32_matmul_precision()
    if on:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def attnkit_step(shape: TrainShape, stream: np.ndarray, device: torch.device, *, block: str, compile: str,
                 run_dir: Path, overrides: dict | None = None, attention: str = "auto", packed: bool = False,
                 reference: bool = False):
    """attnkit's Trainer step, planned for this device (`attnkit train --dtype bf16 --compile ...
    --attention-kernel ...`).

    overrides: model config fields (a variant: position="alibi", attention_window=...); packed: rows of whole
    documents (`--pack`; the stream's documents end at the tokenizer's EOS); reference: attention through plain
    matrix products that form the (T, S) scores and weights (the reference path's cost) instead of the plan's
    kernel."""
    from attnkit import build_model, presets
    from attnkit.data import LMData
    from attnkit.layers.kernels import MathKernel
    from attnkit.machine import AttentionKernelLimits
    from attnkit.tasks.lm import LMTask, PackedLMTask
    from attnkit.tokenize import CharTokenizer
    from attnkit.train.plan import plan_training
    from attnkit.train.trainer import TrainConfig, Trainer

    sizes = dict(vocab_size=shape.vocab_size, n_layers=shape.n_layers, d_model=shape.d_model, n_heads=shape.n_heads,
                 d_ff=4 * shape.d_model, max_seq_len=shape.seq_len, dropout=0.0, **(overrides or {}))
    if block == "llama2":  # SwiGLU at 2/3 of 4C (Llama's width rule), 4 kv heads
        sizes.update(d_ff=int(8 * shape.d_model / 3) // 64 * 64 or 64, n_kv_heads=max(1, shape.n_heads // 3))
    config = presets.get("gpt2-124m" if block == "gpt2" else "llama2-7b", **sizes)
    tokenizer, data = CharTokenizer("ab"), LMData.from_ids(stream)
    task = (PackedLMTask(data, tokenizer=tokenizer, pack="files", batch_size=shape.batch_size, seq_len=shape.seq_len,
                         seed=0) if packed else
            LMTask(data, batch_size=shape.batch_size, seq_len=shape.seq_len, seed=0))
    settings = TrainConfig(batch_size=shape.batch_size, dtype="bf16", compile=compile, instruments=False,
                           eval_every=10**6, max_steps=10**6, lr=6e-4, attention_kernel=attention)
    model = build_model(config)
    plan = None
    if reference:
        plan = plan_training(model, family="decoder", device=device, dtype="bf16", compile=compile,
                             batch_tokens=shape.batch_size * shape.seq_len, attention="sdpa")
        every_key = AttentionKernelLimits(decode_keys=10**9, pass_keys=10**9)
        plan = dataclasses.replace(plan, math_kernel=MathKernel(device.type, torch.bfloat16, every_key))
    trainer = Trainer(model=model, config=config, task=task, settings=settings, run_dir=run_dir,
                      tokenizer=tokenizer, device=device, progress=False, plan=plan)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    if config.position == "learned":
        n_params -= trainer.model.stack.embeddings.positions.weight.numel()
    print(trainer.plan.explain(), flush=True)
    return n_params, trainer.train_step


def train_rows(shape: TrainShape, device: torch.device, *, rounds: int, steps: int, warmup: int) -> list[dict]:
    """The training rows: nanoGPT's step and attnkit's (planned, eager, the Llama-2 block)."""
    stream = token_stream(shape)
    builders = {
        "nanogpt-compiled": lambda d: nanogpt_step(shape, stream, device),
        "attnkit": lambda d: attnkit_step(shape, stream, device, block="gpt2", compile="auto", run_dir=d),
        "attnkit-eager": lambda d: attnkit_step(shape, stream, device, block="gpt2", compile="off", run_dir=d),
        "attnkit-llama2": lambda d: attnkit_step(shape, stream, device, block="llama2", compile="auto", run_dir=d),
    }
    return timed_rows("train", builders, shape, device, rounds=rounds, steps=steps, warmup=warmup)


VARIANTS = {  # name: (model overrides given the shape, packed rows)
    "ALiBi": (lambda shape: dict(position="alibi"), False),
    "sliding window": (lambda shape: dict(attention_window=shape.seq_len // 4), False),
    "packed documents": (lambda shape: {}, True),
}


def variant_rows(shape: TrainShape, device: torch.device, *, rounds: int, steps: int, warmup: int,
                 compile: str = "auto", done: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Each attention variant's training step (GPT-2's block at `shape`) three ways, against plain causal attention
    on SDPA: FlexAttention (the GPU plan's choice; it has no backward on the CPU, so those rows are skipped there),
    SDPA with the variant as a dense (T, S) bias, and plain products that form the scores and weights (the reference
    path's cost). Packed rows hold documents of seq_len / 3 tokens on average. One variant at a time: its three
    rows are built, then timed in turns with SDPA-causal's (built once), then handed with every row so far to `done`
    (which writes the report: a run stopped part-way keeps the variants it finished) and let go."""
    def build(overrides: dict, packed: bool, **kernel):
        stream = token_stream(shape, document_tokens=shape.seq_len // 3 if packed else 0)
        return lambda d: attnkit_step(shape, stream, device, block="gpt2", compile=compile, run_dir=d,
                                      overrides=overrides, packed=packed, **kernel)

    no_backward = (f"FlexAttention has no backward on the CPU in torch {torch.__version__.split('+')[0]}: measured on "
                   "a GPU only")
    base, rows = built_rows("variants", {"SDPA-causal": build({}, False)}, shape, device, warmup=warmup)
    for name, (overrides, packed) in VARIANTS.items():
        builders = {f"{name}, FlexAttention": (build(overrides(shape), packed, attention="flex")
                                               if device.type == "cuda" else lambda d: no_backward),
                    f"{name}, SDPA dense bias": build(overrides(shape), packed, attention="sdpa"),
                    f"{name}, reference": build(overrides(shape), packed, reference=True)}
        steps_of, variant = built_rows("variants", builders, shape, device, warmup=warmup)
        rows.update(variant)
        time_rows({**base, **steps_of}, rows, shape, device, rounds=rounds, steps=steps)
        done(list(rows.values()))
    return list(rows.values())


def variants_markdown(rows: list[dict], title: str) -> list[str]:
    """The variants' table: ms per step, against SDPA-causal's, and each kernel's speed-up over the reference."""
    base = next((r for r in rows if r["impl"] == "SDPA-causal" and "ms_per_step" in r), None)
    lines = [f"## {title}", "", "| variant, kernel | ms/step | time vs SDPA-causal | faster than its reference |",
             "|---|---|---|---|"]
    for r in rows:
        if "ms_per_step" not in r:
            lines.append(f"| {r['impl']} | {'skipped: ' + r['skipped'] if 'skipped' in r else 'failed: ' + r['error']} "
                         "| | |")
            continue
        reference = next((p for p in rows if p["impl"] == r["impl"].rsplit(", ", 1)[0] + ", reference"
                          and "ms_per_step" in p), None)
        versus = f"{r['ms_per_step'] / base['ms_per_step']:.2f}x" if base else "-"
        speedup = f"{reference['ms_per_step'] / r['ms_per_step']:.2f}x" if reference and r is not reference else "-"
        lines.append(f"| {r['impl']} | {r['ms_per_step']:.1f} | {versus} | {speedup} |")
    return [*lines, ""]


def token_stream(shape: TrainShape, *, document_tokens: int = 0) -> np.ndarray:
    """Random tokens of the shape's vocabulary, 2M or 2,000 batches' worth if fewer; with `document_tokens`, documents
    of about that many tokens on average (their lengths drawn geometric), each ended by the benchmark tokenizer's EOS
    (`attnkit_step`'s)."""
    rng = np.random.default_rng(0)
    stream = rng.integers(5, shape.vocab_size, min(2_000_000, 2000 * shape.batch_size * shape.seq_len), dtype=np.int64)
    if document_tokens:
        ends = np.cumsum(rng.geometric(1 / document_tokens, len(stream) // document_tokens))
        stream[ends[ends < len(stream)]] = 4  # the EOS of attnkit_step's tokenizer
    return stream.astype(np.uint16)


def timed_rows(part: str, builders: dict, shape: TrainShape, device: torch.device, *, rounds: int, steps: int,
               warmup: int) -> list[dict]:
    """Each builder's step built, warmed up (compiled), then timed `steps` steps at a time, taking turns for `rounds`
    rounds; the median round's ms per step. A builder that raises is a failed row; one that returns a string instead
    of a step is a skipped row with that reason."""
    steps_of, rows = built_rows(part, builders, shape, device, warmup=warmup)
    time_rows(steps_of, rows, shape, device, rounds=rounds, steps=steps)
    return list(rows.values())


def built_rows(part: str, builders: dict, shape: TrainShape, device: torch.device, *,
               warmup: int) -> tuple[dict[str, Callable[[], None]], dict[str, dict]]:
    """`timed_rows`' first half: each builder's step built and warmed up: (the steps by row, the rows by name)."""
    steps_of, rows = {}, {}
    for impl, build in builders.items():
        try:
            reset_peak(device)
            built = build(Path(tempfile.mkdtemp(prefix=f"attnkit-gpu-{impl}-")))
            if isinstance(built, str):
                rows[impl] = {"part": part, "impl": impl, "skipped": built}
                continue
            n_params, step = built
            start = time.perf_counter()
            for _ in range(warmup):
                step()
            synchronize(device)
            steps_of[impl] = step
            rows[impl] = {"part": part, "impl": impl, "params": n_params, "warmup_s": time.perf_counter() - start,
                          "flops_per_token": shape.flops_per_token(n_params), "round_ms": []}
        except Exception as err:  # noqa: BLE001 - a failed row is recorded, the others go on
            rows[impl] = failed(part, impl, err)
        rows[impl]["peak_gpu_gb"] = peak_gb(device)
    return steps_of, rows


def time_rows(steps_of: dict[str, Callable[[], None]], rows: dict[str, dict], shape: TrainShape,
              device: torch.device, *, rounds: int, steps: int) -> None:
    """`timed_rows`' second half: the steps take turns for `rounds` rounds, each round's ms per step added to its
    row, and every timed row's median, tokens/s and MFU set (again) from all its rounds."""
    for _ in range(rounds):
        for impl, step in steps_of.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize(device)
            rows[impl]["round_ms"].append(1000 * (time.perf_counter() - start) / steps)
    tokens = shape.batch_size * shape.seq_len
    for row in rows.values():
        if row.get("round_ms"):
            row["ms_per_step"] = statistics.median(row["round_ms"])
            row["tokens_per_s"] = tokens / row["ms_per_step"] * 1000
            row["mfu_spec"] = row["tokens_per_s"] * row["flops_per_token"] / SPEC_PEAK_BF16


def decode_rows(device: torch.device, *, smoke: bool) -> list[dict]:
    """gpt2-124m decoding rows, each timed by the speed suite's own `run_one` in this process."""
    from benchmarks import speed

    cases = ["generate-small-b1"] if smoke else ["generate-gpt2-124m-b1", "generate-gpt2-124m-b8"]
    impls = ["attnkit", "attnkit-compiled"] if smoke else ["transformers", "transformers-static", "attnkit",
                                                            "attnkit-compiled"]
    rows = []
    for case in cases:
        for impl in impls:
            try:
                result = speed.run_one(case, impl, "bf16", repeats=1 if smoke else 5, warmup=1, device=str(device))
                rows.append({"part": "decode", "impl": impl, "case": case, "tokens_per_s": result["tokens_per_s"],
                             "ms_per_token": result["ms_per_token"], "first_call_s": result["first_call_s"],
                             "peak_gpu_gb": result.get("peak_gpu_mb", 0) / 1024})
            except Exception as err:  # noqa: BLE001
                rows.append({**failed("decode", impl, err), "case": case})
    return rows


SERVE_TARGETS = {8: 5.0, 32: 12.0}  # clients -> tokens/s against one client's


def serve_rows(device: torch.device, *, smoke: bool) -> list[dict]:
    """`attnkit serve` on the device at 1, 8 and 32 concurrent clients (bench_serve's model and client), each row
    with what the scheduler did meanwhile: its mean batch and an iteration's time on the device."""
    from benchmarks import bench_serve

    rows = []
    try:
        run = bench_serve.make_run(Path(tempfile.mkdtemp(prefix="attnkit-gpu-serve-")))
        with bench_serve.Server(run, max_batch=32, threads=4, device=str(device)) as url:
            for clients in (1, *SERVE_TARGETS):
                result = asyncio.run(bench_serve.load(url, clients, 2 if smoke else 4, 8 if smoke else 64))
                rows.append({"part": "serve", "impl": "attnkit serve", **result})
    except Exception as err:  # noqa: BLE001
        rows.append(failed("serve", "attnkit serve", err))
    return rows


def failed(part: str, impl: str, err: Exception) -> dict:
    print(f"{part} {impl} failed:\n{traceback.format_exc()}", flush=True)
    return {"part": part, "impl": impl, "error": f"{type(err).__name__}: {err}"[:500]}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def machine(device: torch.device) -> dict:
    """What ran it: the GPU's name and memory, torch and CUDA versions, and the matrix product peak measured now."""
    from benchmarks.speed import matmul_peak

    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, memory_gb=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}")
        info["measured_bf16_tflops"] = matmul_peak(torch.bfloat16, str(device)) / 1e12
    return info


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# attnkit on {m.get('name', m['device'])}", "",
             f"torch {m['torch']}, CUDA {m['cuda']}; bf16 matrix product peak measured in this run: "
             f"{m.get('measured_bf16_tflops', float('nan')):.0f} TFLOP/s (data sheet: {SPEC_PEAK_BF16 / 1e12:.0f}). "
             f"Command: `{report['command']}`", ""]
    rows = report["results"]
    train = [r for r in rows if r["part"] == "train"]
    if train:
        base = next((r for r in train if r["impl"] == "nanogpt-compiled" and "tokens_per_s" in r), None)
        lines += [f"## Training ({report['train_shape']}, bf16 autocast)", "",
                  "| implementation | tokens/s | ms/step | vs nanoGPT | MFU (989 TFLOP/s) | peak GPU memory |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['impl']} | failed: {r['error']} | | | | |" if "error" in r else
                  f"| {r['impl']} | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:.1f} | {_versus(r, base)} | "
                  f"{100 * r['mfu_spec']:.1f}% | {_gb(r['peak_gpu_gb'])} |" for r in train]
        lines.append("")
    variants = [r for r in rows if r["part"] == "variants"]
    if variants:
        lines += variants_markdown(variants, f"Attention variants, training steps ({report['train_shape']}, bf16 "
                                             "autocast)")
    decode = [r for r in rows if r["part"] == "decode"]
    if decode:
        lines += ["## Decoding (gpt2-124m, bf16, 128 greedy tokens after 16)", "",
                  "| case | implementation | tokens/s | ms/token | vs transformers static+compiled |",
                  "|---|---|---|---|---|"]
        static = {p["case"]: p for p in reversed(decode) if p["impl"] == "transformers-static" and "tokens_per_s" in p}
        lines += [f"| {r['case']} | {r['impl']} | failed: {r['error']} | | |" if "error" in r else
                  f"| {r['case']} | {r['impl']} | {r['tokens_per_s']:,.1f} | {r['ms_per_token']:.2f} "
                  f"| {_versus(r, static.get(r['case']))} |" for r in decode]
        lines.append("")
    serve = [r for r in rows if r["part"] == "serve"]
    if serve:
        lines += ["## Serving (attnkit serve, width 384, 6 layers)", "",
                  "| clients | tokens/s | p50 | p99 | mean batch | ms per iteration | prefills |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| failed: {r['error']} | | | | | | |" if "error" in r else
                  f"| {r['clients']} | {r['tokens_per_s']:,.1f} | {r['p50_s']} s | {r['p99_s']} s | "
                  f"{r.get('mean_batch', '-')} | {r.get('ms_per_iteration', '-')} | {r.get('prefills', '-')} |"
                  for r in serve]
        by_clients = {r["clients"]: r for r in serve if "error" not in r}
        if 1 in by_clients:
            lines.append("")
            lines += [f"{clients} clients: {by_clients[clients]['tokens_per_s'] / by_clients[1]['tokens_per_s']:.2f}x "
                      f"one at a time (target >= {target:g}x)." for clients, target in SERVE_TARGETS.items()
                      if clients in by_clients]
    return "\n".join(lines) + "\n"


def _versus(row: dict, peer: dict | None) -> str:
    """The row's tokens/s as a multiple of its peer's ("1.25x"), "-" where the peer has none."""
    return f"{row['tokens_per_s'] / peer['tokens_per_s']:.2f}x" if peer else "-"


def _gb(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f} GB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gpu", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device: checks the script")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=2, help="rounds of timed training steps, implementations in turn")
    parser.add_argument("--steps", type=int, default=8, help="training steps timed per round")
    parser.add_argument("--warmup", type=int, default=3, help="training steps before timing (compilation)")
    parser.add_argument("--out", type=Path, help="folder for the results (default: benchmarks/results)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of other parts that an earlier run on this GPU wrote into --out's report "
                             "(one part a process, one report: benchmarks/gpu_session.sh)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        print("python -m benchmarks gpu measures a CUDA GPU, and torch sees none here; --smoke checks the script "
              "at tiny shapes on this machine", flush=True)
        return 2
    started = time.perf_counter()
    shape = SMOKE if args.smoke else GPT2
    out = args.out or (RESULTS if not args.smoke else Path(tempfile.mkdtemp(prefix="attnkit-gpu-smoke-")))
    about = {"machine": machine(device), "command": "python -m benchmarks gpu " + " ".join(argv or []),
             "train_shape": f"{shape.n_layers} layers, width {shape.d_model}, {shape.n_heads} heads, vocabulary "
                            f"{shape.vocab_size}, batch {shape.batch_size} x {shape.seq_len}"}
    stem = "gpu-smoke" if args.smoke else report_stem(about["machine"].get("name", "cuda"))
    rows: list[dict] = []

    def report(more: list[dict]) -> dict:
        """The rows so far with `more` (a part's, finished or not), written whole."""
        done = {**about, "seconds": round(time.perf_counter() - started, 1), "results": rows + more}
        write_report(done, out, stem)
        return done

    parts = {"train": lambda: train_rows(shape, device, rounds=args.rounds, steps=args.steps, warmup=args.warmup),
             "variants": lambda: variant_rows(shape, device, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                                              done=report),
             "decode": lambda: decode_rows(device, smoke=args.smoke),
             "serve": lambda: serve_rows(device, smoke=args.smoke)}
    if args.append:  # the other parts' rows of the report in --out, its command named beside this one
        earlier = earlier_report(out / f"{stem}.json", about["machine"])
        if earlier is None:
            return 2
        rows = [r for r in earlier["results"] if r["part"] not in args.only]
        if rows:
            about["command"] = f"{earlier['command']}; {about['command']}"
    for part in dict.fromkeys(args.only):  # in the order given: a run stopped part-way keeps the parts it did
        rows += parts[part]()
        written = report([])  # after each part
    print(markdown(written), flush=True)
    print(f"wrote {out / stem}.json and .md ({written['seconds']:.0f} s)", flush=True)
    # this run's rows alone: with --append, an earlier part's failed row is that part's exit status, not this one's
    return 0 if all("error" not in r for r in rows if r["part"] in args.only) else 1


def earlier_report(path: Path, machine: dict) -> dict | None:
    """The report at `path` (an empty one where there is none yet), checked to be this benchmark's report of the same
    GPU and torch; None, having said why, where it is not."""
    if not path.exists():
        return {"command": None, "results": []}
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        theirs = report["machine"]
        if not all(isinstance(r, dict) and r.get("part") in PARTS for r in report["results"]):
            raise ValueError("a row of no part")
    except (OSError, ValueError, KeyError, TypeError):
        print(f"--append: {path} is not a report of python -m benchmarks gpu; move it or leave out --append",
              flush=True)
        return None
    if (theirs.get("name"), theirs.get("torch")) != (machine.get("name"), machine.get("torch")):
        print(f"--append: {path} is a run on {theirs.get('name', theirs.get('device'))} with torch "
              f"{theirs.get('torch')}, this is {machine.get('name', machine['device'])} with torch {machine['torch']}: "
              "choose another --out", flush=True)
        return None
    return report


def report_stem(gpu_name: str) -> str:
    """The report's file name without suffix for a GPU's name: 'NVIDIA H200' -> 'gpu-nvidia-h200' (letters, digits,
    '.', '_' and '-' alone, so that any copy between machines keeps it)."""
    return "gpu-" + re.sub(r"[^a-z0-9._-]+", "-", gpu_name.lower()).strip("-")


def write_report(report: dict, out: Path, stem: str) -> None:
    """The report as JSON and Markdown, each written whole or not at all."""
    atomic_write(out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    atomic_write(out / f"{stem}.md", markdown(report))
