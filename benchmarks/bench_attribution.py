"""Attribution patching against activation patching over every head of `gpt2-124m` (random weights at its shape:
12 layers x 12 heads, width 768), on 8 texts of 64 tokens with a few tokens substituted.

    python -m benchmarks attribution [--threads 2] [--repeats 1]

Attribution patching (`attnkit.inspect.attribution.attribute_heads`) is one clean forward pass and one corrupted
forward and backward pass for all 144 heads; activation patching, its peer in the same run, is one corrupted forward
pass per head: it is timed on the 12 heads of the last layer (each patched as `patching.patch_heads` does) and its time
for all 144 is that per-head time times 144. The two are compared on those 12 heads by their rank correlation.
Written to benchmarks/results/attribution-gpt2.json and .md.
"""

from __future__ import annotations

import time

import torch

from attnkit import presets
from attnkit.inspect import patch
from attnkit.inspect.attribution import attribute_heads
from attnkit.inspect.inputs import Batch
from attnkit.inspect.patching import logit_difference, share
from attnkit.models import build_model
from benchmarks.common import median_seconds, parse_args, write_results

TEXTS, LENGTH, SUBSTITUTED = 8, 64, 4
LAYER = 11  # activation patching is timed on the last layer's heads, which write the logits directly


def _ranks(values: torch.Tensor) -> torch.Tensor:
    _, inverse, counts = values.unique(return_inverse=True, return_counts=True)
    return (counts.cumsum(0) - (counts + 1) / 2).double()[inverse]


def main(argv: list[str] | None = None) -> int:
    args = parse_args("attribution", __doc__, argv, repeats=1)
    torch.manual_seed(0)
    config = presets.get("gpt2-124m", dropout=0.0)
    model = build_model(config).eval()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (TEXTS, LENGTH), generator=generator)  # (B, T)
    corrupted_ids = ids.clone()
    corrupted_ids[:, 10:10 + SUBSTITUTED] = torch.randint(0, config.vocab_size, (TEXTS, SUBSTITUTED),
                                                          generator=generator)
    clean, corrupted = Batch((ids,)), Batch((corrupted_ids,))
    with torch.no_grad():
        top = model(ids).logits[:, -1].topk(2).indices  # (B, 2): the answer and its runner-up
    target = {"answer": top[:, 0], "wrong": top[:, 1]}
    found = {}
    estimated_seconds = median_seconds(lambda: found.update(estimate=attribute_heads(model, clean, corrupted,
                                                                                     **target)), args.repeats)
    estimate = found["estimate"]
    print(f"attribution patching, all {estimate.restored.numel()} heads: {estimated_seconds:.2f} s", flush=True)
    site = f"blocks.{LAYER}.attn.z"
    source = clean.run(model, names=[site])[site]  # (B, T, H, D)
    start = time.perf_counter()
    patched = torch.tensor([share(logit_difference(corrupted.logits(corrupted.run(model, edits={
        site: patch(source, head=h)}).output), top[:, 0], top[:, 1]), estimate.clean, estimate.corrupted)
        for h in range(source.shape[2])])
    per_head = (time.perf_counter() - start) / source.shape[2]
    patched_seconds = per_head * estimate.restored.numel()
    sample = estimate.restored[LAYER]
    correlation = float(torch.corrcoef(torch.stack([_ranks(sample), _ranks(patched)]))[0, 1])
    row = {"model": "gpt2-124m (random weights)", "heads": int(estimate.restored.numel()), "texts": TEXTS,
           "tokens": LENGTH, "attribution_patching_s": estimated_seconds, "activation_patching_s_per_head": per_head,
           "activation_patching_s": patched_seconds, "speedup": patched_seconds / estimated_seconds,
           "rank_correlation_layer": LAYER, "rank_correlation": correlation}
    print(f"activation patching {per_head:.2f} s a head, {patched_seconds:.0f} s for all ({row['speedup']:.0f}x); "
          f"rank correlation over layer {LAYER}'s heads {correlation:.3f}", flush=True)
    table = ["| model | heads | texts x tokens | attribution patching s | activation patching s (per head x 144) | "
             "speedup | rank correlation (one layer's heads) |", "|---|---|---|---|---|---|---|",
             f"| {row['model']} | {row['heads']} | {TEXTS} x {LENGTH} | {estimated_seconds:.1f} | "
             f"{patched_seconds:.0f} ({per_head:.2f} x 144) | {row['speedup']:.0f}x | {correlation:.3f} "
             f"(layer {LAYER}) |"]
    write_results("attribution-gpt2", "attribution", args, argv, [row], table)
    return 0
