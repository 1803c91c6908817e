"""What quantized decoding costs in quality, beside what it gains in speed: validation loss and perplexity of a trained
language model in fp32, bf16, int8 (weights int8, products bf16), int8-dynamic (weights and activations int8) and int4
(4-bit weights in groups of 32, products bf16); and, where llama-cpp-python is installed and llama.cpp runs the
model (`attnkit convert --to-gguf`: GPT-2, Llama and Mistral layouts with a byte-level BPE), the same weights in
llama.cpp at f32, q8_0 and q4_0 on the same validation tokens, as the reference for what 8 and 4 bits may cost.

    python -m benchmarks int8 [--run runs/default] [--data FILE] [--rounds 5] [--threads 1] [--name int8]

Speed: batch-1 greedy decoding (a 16-token prompt, then up to 128 tokens within the model's context) for every
form, attnkit's and llama.cpp's alike, timed in alternating rounds in this one process (each form once per round),
so a machine shared with other work moves them alike; each form reports its median round, and each llama.cpp type
is compared with attnkit's form of the same width (f32: fp32, q8_0: int8-dynamic, q4_0: int4) by the median of the
rounds' own ratios. The default run is the one `make run` trains (`runs/default`); any language model run and any
text file work. Results: benchmarks/results/<name>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.data import LMData
from attnkit.data.corpus import resolve_files
from attnkit.errors import AttnkitError
from attnkit.generate import load
from attnkit.generate.decoder import generate_tokens
from attnkit.machine import CpuCapabilities
from attnkit.tasks.lm import DEFAULT_STDLIB_BYTES
from benchmarks import peers
from benchmarks.common import RESULTS, ROOT

MODES = (("fp32", "fp32", None), ("bf16", "bf16", None), ("int8", "bf16", "int8"),
         ("int8-dynamic", "fp32", "int8-dynamic"), ("int4", "bf16", "int4"))  # name, weights' dtype, quantize
GGUF_TYPES = {"f32": "fp32", "q8_0": "int8-dynamic", "q4_0": "int4"}  # llama.cpp's type -> attnkit's form beside it
PROMPT_LEN = 16


def validation_loss(model: torch.nn.Module, data: LMData, seq_len: int, max_batches: int) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in data.iter_eval_batches("val", batch_size=16, seq_len=seq_len, max_batches=max_batches):
            loss = model(x, labels=y).loss
            total, count = total + float(loss) * y.numel(), count + y.numel()
    return total / count


def llama_cpp_validation_loss(runner: peers.LlamaCpp, data: LMData, seq_len: int, max_batches: int) -> float:
    """`validation_loss` over the same windows, every window's logits computed by llama.cpp."""
    total, count = 0.0, 0
    for x, y in data.iter_eval_batches("val", batch_size=16, seq_len=seq_len, max_batches=max_batches):
        for window, targets in zip(x.tolist(), y, strict=True):
            logits = torch.from_numpy(runner.sequence_logits(window)).double()  # (T, V)
            total += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += targets.numel()
    return total / count


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks int8", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "default")
    parser.add_argument("--data", type=Path, help="the text to score (default: the Python standard library's "
                        "source, as `make run` trains on, whose last 10%% validates)")
    parser.add_argument("--max-batches", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of decoding speed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="int8", help="results file name under benchmarks/results/")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not (args.run / "config.json").is_file():
        print(f"{args.run} is not a run directory; train one first: make run (or attnkit train --out {args.run})")
        return 2
    if args.data is not None and not args.data.is_file():
        print(f"--data {args.data} is not a text file; give the text to score")
        return 2
    cpu = CpuCapabilities.detect()
    results, speed = [], {}
    with tempfile.TemporaryDirectory() as cache:
        data = seq_len = None
        for mode, dtype, quantize in MODES:
            pipeline = load(args.run, device="cpu", dtype=dtype, quantize=quantize)
            if quantize is not None and pipeline.plan.linear != quantize:
                print(f"{mode} skipped: the plan chose {pipeline.plan.linear} on this CPU ({cpu.summary()})")
                continue
            if data is None:
                files = [args.data] if args.data is not None else resolve_files([], max_bytes=DEFAULT_STDLIB_BYTES)
                data = LMData.prepare(files, pipeline.tokenizer, Path(cache), progress=False)
                seq_len = pipeline.config.max_seq_len
            loss = validation_loss(pipeline.model, data, seq_len, args.max_batches)
            results.append({"mode": mode, "val_loss": loss, "val_ppl": math.exp(loss)})
            print(f"{mode}: val loss {loss:.4f} (ppl {math.exp(loss):.3f})", flush=True)
            speed[mode] = _attnkit_decoding(pipeline.model, seq_len)
        reason = peers.unavailable("llama.cpp")
        for gguf_type in GGUF_TYPES if reason is None else ():
            try:
                runner, new_tokens = _llama_cpp(args.run, gguf_type, seq_len, args.threads, Path(cache))
            except AttnkitError as err:  # a model or tokenizer llama.cpp does not run
                reason = str(err)
                break
            loss = llama_cpp_validation_loss(runner, data, seq_len, args.max_batches)
            name = f"llama.cpp {gguf_type}"
            results.append({"mode": name, "val_loss": loss, "val_ppl": math.exp(loss)})
            print(f"{name}: val loss {loss:.4f} (ppl {math.exp(loss):.3f})", flush=True)
            speed[name] = lambda runner=runner, n=new_tokens: runner.generate([[1] * PROMPT_LEN], n)
        if reason is not None:
            print(f"llama.cpp skipped: {reason}")
    rounds = _speed_rounds(speed, args.rounds)
    for result in results:
        times = rounds[result["mode"]]
        result["decode_tokens_per_s"] = _new_tokens(seq_len) / statistics.median(times)
        result["rounds_s"] = times
    for gguf_type, mode in GGUF_TYPES.items():
        ours, theirs = rounds.get(mode), rounds.get(f"llama.cpp {gguf_type}")
        if ours and theirs:
            ratio = statistics.median(t / o for o, t in zip(ours, theirs, strict=True))
            next(r for r in results if r["mode"] == mode)[f"speed_vs_llama_cpp_{gguf_type}"] = ratio
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {"run": str(args.run), "data": str(args.data or "the Python standard library"), "threads": args.threads,
              "cpu": cpu.to_dict(), "torch": torch.__version__, "load_average": os.getloadavg(),
              "command": "python -m benchmarks int8 " + " ".join(argv if argv is not None else []),
              "results": results}
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def _new_tokens(seq_len: int) -> int:
    return min(128, seq_len - PROMPT_LEN)


def _attnkit_decoding(model: torch.nn.Module, seq_len: int):
    """One batch-1 greedy generation after a 16-token prompt, as the speed rounds time it."""
    return lambda: generate_tokens(model, [[1] * PROMPT_LEN], max_new_tokens=_new_tokens(seq_len),
                                   context_len=seq_len)


def _llama_cpp(run: Path, gguf_type: str, seq_len: int, threads: int, folder: Path):
    """The run written by `attnkit convert --to-gguf` at `gguf_type`, loaded in llama.cpp; and its tokens per
    generation."""
    from attnkit.interop.gguf import convert_to_gguf

    path = folder / f"model-{gguf_type}.gguf"
    convert_to_gguf(run, path, type=gguf_type)
    new_tokens = _new_tokens(seq_len)
    runner = peers.LlamaCpp(path, batch_size=1, prompt_len=seq_len, new_tokens=new_tokens, threads=threads)
    return runner, new_tokens


def _speed_rounds(speed: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of one generation per form and round, after one warm-up each; the order alternates by round."""
    for run in speed.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in speed}
    for n in range(rounds):
        for name in (list(speed) if n % 2 == 0 else list(reversed(speed))):
            times[name].append(timed(speed[name]))
    return times


def markdown(report: dict) -> str:
    cpu = CpuCapabilities.from_dict(report["cpu"])
    lines = [f"Run `{report['run']}`, text: {report['data']}; {cpu.summary()}, {report['threads']} thread(s), torch "
             f"{report['torch']}, load average at the end {report['load_average'][0]:.1f}. Command: "
             f"`{report['command']}`", "",
             "| form | validation loss | perplexity | batch-1 decoding tok/s (median round) | attnkit / llama.cpp "
             "(median of rounds) |", "|---|---|---|---|---|"]
    for r in report["results"]:
        against = [f"{v:.2f}x vs {k.removeprefix('speed_vs_llama_cpp_')}" for k, v in r.items()
                   if k.startswith("speed_vs_llama_cpp_")]
        lines.append(f"| {r['mode']} | {r['val_loss']:.4f} | {r['val_ppl']:.3f} | {r['decode_tokens_per_s']:.1f} | "
                     f"{', '.join(against)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
