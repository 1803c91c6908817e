"""Aten operations per eager prefill and decoding step of a 6x384 decoder, counted rather than timed.

    python -m benchmarks ops

A small model's eager decoding step costs more in launching its few hundred operations than in computing them, and
a count does not move with the machine's load, so a change to the forward pass (the masks, the position schemes)
can be held to "adds no operation" on a shared machine. Each aten operation that reaches the dispatcher is counted
once (a composite such as `linear` counts as the operations it runs), under inference mode, for a batch of one
unpadded prompt, a left-padded batch of two, ALiBi, Llama's parts, and sliding windows (every layer, and every
other layer as Gemma 2). Results go to benchmarks/results/ops-6x384.json and .md.
"""

from __future__ import annotations

from collections import Counter

import torch

# TorchDispatchMode sees each aten operation as it is dispatched; torch exports it from this module only (the
# profiler, the public alternative, records composite operations and their parts alike, counting them twice).
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import ModelConfig, build_model
from attnkit.generate.decoder import decode_one_token, left_pad, prefill
from benchmarks.common import parse_args, write_results

CASES = {  # name -> (config fields, prompts)
    "plain": ({}, [[1, 2, 3, 4, 5]]),
    "padded batch": ({}, [[1, 2, 3, 4, 5], [7, 8]]),
    "alibi": ({"position": "alibi"}, [[1, 2, 3, 4, 5]]),
    "llama": ({"position": "rope", "norm": "rms", "activation": "swiglu"}, [[1, 2, 3, 4, 5]]),
    "window 4": ({"position": "rope", "attention_window": 4}, [[1, 2, 3, 4, 5]]),
    "window 4, global every 2": ({"position": "rope", "attention_window": 4, "global_every": 2}, [[1, 2, 3, 4, 5]]),
}


class OperationCount(TorchDispatchMode):
    """Counts the aten operations dispatched while it is active, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def count(fields: dict, prompts: list[list[int]]) -> tuple[int, int]:
    """Operations of the prefill and of the second decoding step (the first after a warm-up step)."""
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", d_model=384, n_heads=6, n_layers=6, d_ff=1536, vocab_size=256,
                         max_seq_len=256, **fields)
    model = build_model(config).eval()
    window = left_pad(prompts, pad_id=0)
    cache = model.allocate_cache(len(prompts), 64)
    with OperationCount() as prefill_ops:
        logits = prefill(model, window, cache)
    window = window.append(logits.argmax(-1))
    decode_one_token(model, window, cache)
    window = window.append(torch.zeros(len(prompts), dtype=torch.long))
    with OperationCount() as step_ops:
        decode_one_token(model, window, cache)
    return sum(prefill_ops.counts.values()), sum(step_ops.counts.values())


def main(argv: list[str] | None = None) -> int:
    args = parse_args("ops", __doc__, argv, repeats=1)
    rows, table = [], ["| case | prefill ops | decoding step ops |", "|---|---|---|"]
    for name, (fields, prompts) in CASES.items():
        prefill_ops, step_ops = count(fields, prompts)
        rows.append({"case": name, "fields": fields, "prompts": prompts, "prefill": prefill_ops, "step": step_ops})
        table.append(f"| {name} | {prefill_ops} | {step_ops} |")
        print(f"{name:26s} prefill {prefill_ops:4d}  step {step_ops:4d}")
    write_results("ops-6x384", "ops", args, argv, rows, table)
    return 0
