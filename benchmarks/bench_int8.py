"""What int8 decoding costs in quality: validation loss and perplexity of a trained language model in fp32, bf16,
int8 (weights int8, products bf16) and int8-dynamic (weights and activations int8), with batch-1 decoding speed
for each; and, where llama-cpp-python is installed and the model has GPT-2's block, the same weights in llama.cpp
at f32 and q8_0 on the same validation tokens, as the reference for what 8-bit quantization may cost.

    python -m benchmarks int8 [--run runs/bench-shakespeare-fp32] [--data ../shared/data/tinyshakespeare/input.txt]

The default run is the Tiny Shakespeare model that `python -m benchmarks train shakespeare` trains; any language
model run and any text file work. Results: benchmarks/results/int8.json (or --name).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.checkpoint import load_run_model
from attnkit.data import LMData
from attnkit.generate import load
from attnkit.generate.decoder import generate_tokens
from benchmarks import peers
from benchmarks.common import DATA, RESULTS, ROOT

MODES = (("fp32", "fp32", None), ("bf16", "bf16", None), ("int8", "bf16", "int8"),
         ("int8-dynamic", "fp32", "int8-dynamic"))  # name, weights' dtype, quantize


def validation_loss(model: torch.nn.Module, data: LMData, seq_len: int, max_batches: int) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data.iter_eval_batches("val", batch_size=16, seq_len=seq_len, max_batches=max_batches):
            loss = model(x, labels=y).loss
            total, count = total + float(loss) * y.numel(), count + y.numel()
    return total / count


def llama_cpp_validation_loss(run: Path, gguf_type: str, data: LMData, seq_len: int, max_batches: int,
                              threads: int) -> float:
    """`validation_loss` over the same windows, with the run's weights written as GGUF at `gguf_type` and every
    window's logits computed by llama.cpp."""
    model, _, _ = load_run_model(run, device="cpu")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.gguf"
        peers.write_gguf(model.eval(), path, gguf_type)
        runner = peers.LlamaCpp(path, batch_size=1, prompt_len=seq_len, new_tokens=0, threads=threads)
    total, count = 0.0, 0
    for x, y in data.iter_eval_batches("val", batch_size=16, seq_len=seq_len, max_batches=max_batches):
        for window, targets in zip(x.tolist(), y, strict=True):
            logits = torch.from_numpy(runner.sequence_logits(window)).double()  # (T, V)
            total += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += targets.numel()
    return total / count


def decode_speed(model: torch.nn.Module, context_len: int, new_tokens: int = 128, repeats: int = 3) -> float:
    prompt = [[1] * 16]
    generate_tokens(model, prompt, max_new_tokens=8, context_len=context_len)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        generate_tokens(model, prompt, max_new_tokens=new_tokens, context_len=context_len)
        times.append(time.perf_counter() - start)
    return new_tokens / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks int8", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "bench-shakespeare-fp32")
    parser.add_argument("--data", type=Path, default=DATA / "tinyshakespeare" / "input.txt")
    parser.add_argument("--max-batches", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="int8", help="results file name under benchmarks/results/")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not (args.run / "config.json").is_file():
        print(f"{args.run} is not a run directory; train one first: python -m benchmarks train shakespeare")
        return 2
    if not args.data.is_file():
        print(f"--data {args.data} is not a text file; give the text to score (default: Tiny Shakespeare, "
              f"{DATA / 'tinyshakespeare' / 'input.txt'})")
        return 2
    results = []
    with tempfile.TemporaryDirectory() as cache:
        data = None
        for mode, dtype, quantize in MODES:
            pipeline = load(args.run, device="cpu", dtype=dtype, quantize=quantize)
            data = data or LMData.prepare([args.data], pipeline.tokenizer, Path(cache), progress=False)
            seq_len = pipeline.config.max_seq_len
            loss = validation_loss(pipeline.model, data, seq_len, args.max_batches)
            speed = decode_speed(pipeline.model, seq_len)
            results.append({"mode": mode, "val_loss": loss, "val_ppl": math.exp(loss), "decode_tokens_per_s": speed})
            print(f"{mode}: val loss {loss:.4f} (ppl {math.exp(loss):.3f}), batch-1 decoding {speed:.0f} tok/s")
        reason = peers.unavailable("llama.cpp")
        for gguf_type in ("F32", "Q8_0") if reason is None else ():
            loss = llama_cpp_validation_loss(args.run, gguf_type, data, seq_len, args.max_batches, args.threads)
            results.append({"mode": f"llama.cpp {gguf_type.lower()}", "val_loss": loss, "val_ppl": math.exp(loss)})
            print(f"llama.cpp {gguf_type.lower()}: val loss {loss:.4f} (ppl {math.exp(loss):.3f})")
        if reason is not None:
            print(f"llama.cpp skipped: {reason}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {"run": str(args.run), "data": str(args.data), "threads": args.threads, "results": results}
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0
