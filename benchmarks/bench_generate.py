"""Generation speed: attnkit's KV-cached greedy decoding beside Hugging Face `transformers` `generate`.

    python -m benchmarks.bench_generate [--repeats 3] [--threads 1] [--new-tokens 128] [--quick] [--device cpu]

Two decoder shapes, each built twice with random weights, once as an attnkit `DecoderLM` and once as a
`transformers` `GPT2LMHeadModel` of the same configuration (pre-norm, learned positions, tanh GELU, tied output):

    gpt2-124m   12 layers, width 768, 12 heads, vocabulary 50257
    small        6 layers, width 384,  6 heads, vocabulary 65     (nanoGPT's Shakespeare-char shape)

For fp32 and bf16, batch 1 and batch 8: a random prompt of 16 tokens, then `--new-tokens` greedy tokens (no stop
token on either side, so both produce exactly that many). The two implementations alternate inside every
repetition (which goes first alternates too), after one warm-up call each; the median of `--repeats` is kept.
Reported: tokens per second (batch x new tokens / wall time) and latency per token (wall time / new tokens),
prompt included, and the speed ratio from the medians and from each side's fastest run (on a shared machine the
fastest run is the least disturbed one). Results go to `benchmarks/results/generate-<device>.json` and a
markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit import ModelConfig, build_model
from attnkit.generate import generate_tokens
from attnkit.generate.pipeline import parse_dtype
from attnkit.generate.plan import prepare_for_inference
from attnkit.machine import CpuCapabilities
from attnkit.outputs import atomic_write
from benchmarks.common import RESULTS, synchronize

PROMPT_LEN = 16
SHAPES = {
    "gpt2-124m": dict(n_layers=12, d_model=768, n_heads=12, vocab_size=50257),
    "small": dict(n_layers=6, d_model=384, n_heads=6, vocab_size=65),
}
DTYPES = ("fp32", "bf16")  # the weight types measured (names as attnkit.load takes them)


def attnkit_config(shape: dict) -> ModelConfig:
    """The suite's GPT-2-style decoder of `shape` (one of SHAPES)."""
    return ModelConfig(
        family="decoder", d_ff=4 * shape["d_model"], position="learned", activation="gelu_tanh", norm="layer",
        norm_position="pre", max_seq_len=1024, dropout=0.0, bias=True, tie_embeddings=True, **shape,
    )


def attnkit_model(shape: dict, dtype: torch.dtype, device: str):
    model = build_model(attnkit_config(shape)).to(device=device, dtype=dtype)
    return prepare_for_inference(model, "decoder")  # as attnkit.load


def transformers_model(shape: dict, dtype: torch.dtype, device: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=shape["vocab_size"], n_positions=1024, n_embd=shape["d_model"], n_layer=shape["n_layers"],
        n_head=shape["n_heads"], activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    model = GPT2LMHeadModel(config).to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def runner(impl: str, model, prompt: torch.Tensor) -> Callable[[int], int]:
    """A function generating n greedy tokens after `prompt` (B, T); it returns how many it made per row."""
    if impl == "attnkit":
        rows = prompt.tolist()
        return lambda n: len(generate_tokens(model, rows, max_new_tokens=n, context_len=1024)[0])
    mask = torch.ones_like(prompt)

    def run(n: int) -> int:
        with torch.inference_mode():
            out = model.generate(prompt, attention_mask=mask, max_new_tokens=n, do_sample=False)
        return out.shape[1] - prompt.shape[1]

    return run


def measure(shape_name: str, dtype_name: str, batch: int, new_tokens: int, repeats: int, device: str) -> dict:
    shape, dtype = SHAPES[shape_name], parse_dtype(dtype_name)
    prompt = torch.randint(0, shape["vocab_size"], (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    torch.manual_seed(0)
    runs = {
        "attnkit": runner("attnkit", attnkit_model(shape, dtype, device), prompt),
        "transformers": runner("transformers", transformers_model(shape, dtype, device), prompt),
    }
    for run in runs.values():  # warm-up
        run(4)
    times: dict[str, list[float]] = {impl: [] for impl in runs}
    for rep in range(repeats):
        order = list(runs) if rep % 2 == 0 else list(reversed(runs))
        for impl in order:
            synchronize(device)
            start = time.perf_counter()
            made = runs[impl](new_tokens)
            synchronize(device)
            times[impl].append(time.perf_counter() - start)
            if made != new_tokens:
                raise RuntimeError(f"{impl} made {made} tokens instead of {new_tokens}")
    row = {"shape": shape_name, "dtype": dtype_name, "batch": batch, "new_tokens": new_tokens}
    for impl, samples in times.items():
        wall = statistics.median(samples)
        row[impl] = {
            "seconds": round(wall, 4),
            "tokens_per_s": round(batch * new_tokens / wall, 1),
            "ms_per_token": round(1000 * wall / new_tokens, 2),
            "samples": [round(s, 4) for s in samples],
        }
    row["speedup"] = round(row["transformers"]["seconds"] / row["attnkit"]["seconds"], 2)
    best = {impl: min(samples) for impl, samples in times.items()}
    row["speedup_best"] = round(best["transformers"] / best["attnkit"], 2)  # fastest run each: least disturbed
    print(
        f"{shape_name:10s} {dtype_name} batch {batch}: attnkit {row['attnkit']['tokens_per_s']:8.1f} tok/s "
        f"({row['attnkit']['ms_per_token']:7.2f} ms/token)   transformers {row['transformers']['tokens_per_s']:8.1f} "
        f"tok/s ({row['transformers']['ms_per_token']:7.2f} ms/token)   attnkit/transformers speed x{row['speedup']}",
        flush=True,
    )
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"Greedy generation, prompt {PROMPT_LEN} tokens; {meta['device']}, {meta['threads']} torch thread(s); "
        f"torch {meta['torch']}, transformers {meta['transformers']}; median of {meta['repeats']}."
        + (f" Machine: {meta['machine']}." if meta.get("machine") else "")
        + (" 1-minute load average at the start and the end: {:.1f}, {:.1f} ({} cores).".format(
            *meta["load_average"], meta["cores"]) if meta.get("load_average") else ""),
        "",
        "| shape | dtype | batch | new tokens | attnkit tok/s | transformers tok/s | attnkit ms/token "
        "| transformers ms/token | attnkit speed vs transformers (median / best run) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, t = r["attnkit"], r["transformers"]
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['batch']} | {r['new_tokens']} | {a['tokens_per_s']} | "
            f"{t['tokens_per_s']} | {a['ms_per_token']} | {t['ms_per_token']} | "
            f"x{r['speedup']} / x{r['speedup_best']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (fixed for the whole run)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gpt2-new-tokens", type=int, help="gpt2-124m new tokens (default: --new-tokens)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="small shape, 16 new tokens, 1 repeat: a smoke run")
    parser.add_argument("--out", type=Path, help="JSON path (default: benchmarks/results/generate-<device>.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes, args.new_tokens, args.repeats = ["small"], 16, 1
    torch.set_num_threads(args.threads)
    device_name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name(args.device).replace(" ", "-")
    import transformers

    meta = {
        "device": device_name if args.device != "cpu" else f"CPU ({platform.processor() or platform.machine()})",
        "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(), "cores": os.cpu_count(),
        "machine": CpuCapabilities.detect().summary() if args.device == "cpu" else device_name,
    }
    load_at_start = os.getloadavg()[0]
    rows = []
    with torch.inference_mode():
        for shape in args.shapes:
            new_tokens = args.gpt2_new_tokens if shape == "gpt2-124m" and args.gpt2_new_tokens else args.new_tokens
            for dtype in args.dtypes:
                for batch in args.batches:
                    rows.append(measure(shape, dtype, batch, new_tokens, args.repeats, args.device))
    meta["load_average"] = [load_at_start, os.getloadavg()[0]]  # other work on a shared machine slows both sides
    out = args.out or RESULTS / f"generate-{device_name.lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    atomic_write(out.with_suffix(".md"), markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
