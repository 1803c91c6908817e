"""Compiled training against eager on this machine: `attnkit.train.Trainer` steps with `--compile off`, `model` and
`blocks`, taking turns round by round after a warm-up that compiles, in fp32 and bf16.

    python -m benchmarks train_plan [--threads 1] [--rounds 4] [--steps 5]

The model is the default run's shape (Llama-2 block, 4 layers, width 128, vocabulary 2,048, batch 8 x 128). What
it answers: whether `--compile` pays on this device once compiled (the training plan compiles on request on a CPU,
where a compilation per shape costs tens of seconds); the compile time itself is reported beside it. Results:
benchmarks/results/train-plan-cpu.json and .md.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time

import numpy as np

from benchmarks.common import parse_args, write_results

FORMS = ("off", "model", "blocks")


def trainer(compile: str, dtype: str, stream: np.ndarray):
    from attnkit import build_model, presets
    from attnkit.data import LMData
    from attnkit.tasks.lm import LMTask
    from attnkit.tokenize import CharTokenizer
    from attnkit.train.trainer import TrainConfig, Trainer

    config = presets.get("llama2-tiny", vocab_size=2048, d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, d_ff=344,
                         max_seq_len=128)
    task = LMTask(LMData.from_ids(stream), batch_size=8, seq_len=128, seed=0)
    settings = TrainConfig(batch_size=8, compile=compile, dtype=dtype, instruments=False, eval_every=10**6,
                           max_steps=10**6)
    return Trainer(model=build_model(config), config=config, task=task, run_dir=tempfile.mkdtemp(),
                   tokenizer=CharTokenizer("ab"), settings=settings, progress=False)


def main(argv: list[str] | None = None) -> int:
    from attnkit.machine import CpuCapabilities

    args = parse_args("train_plan", __doc__, argv, repeats=4)
    logging.disable(logging.WARNING)  # the trainer's CPU notes, once per trainer
    cpu = CpuCapabilities.detect().summary()
    stream = np.random.default_rng(0).integers(0, 2048, 500_000).astype(np.uint16)
    rows = []
    for dtype in ("fp32", "bf16"):
        steps, warm = {}, {}
        for form in FORMS:
            step = trainer(form, dtype, stream).train_step
            start = time.perf_counter()
            for _ in range(3):  # compiles (forward, backward) and settles
                step()
            steps[form], warm[form] = step, time.perf_counter() - start
        times = {form: [] for form in FORMS}
        for _ in range(args.repeats):
            for form, step in steps.items():
                start = time.perf_counter()
                for _ in range(5):
                    step()
                times[form].append((time.perf_counter() - start) / 5)
        eager = statistics.median(times["off"])
        for form in FORMS:
            median = statistics.median(times[form])
            rows.append({"dtype": dtype, "compile": form, "ms_per_step": 1000 * median,
                         "speed_vs_eager": eager / median, "warmup_s": warm[form], "cpu": cpu})
            print(f"{dtype} --compile {form}: {1000 * median:.1f} ms a step, {eager / median:.2f}x eager "
                  f"(first 3 steps {warm[form]:.1f} s)", flush=True)
    table = ["| dtype | --compile | ms / step | vs eager | first 3 steps (compiling) |", "|---|---|---|---|---|"]
    table += [f"| {r['dtype']} | {r['compile']} | {r['ms_per_step']:.1f} | {r['speed_vs_eager']:.2f}x | "
              f"{r['warmup_s']:.1f} s |" for r in rows]
    write_results("train-plan-cpu", "train_plan", args, argv, rows, [f"CPU: {cpu}", "", *table])
    return 0
