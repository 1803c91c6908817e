"""Grouped-query attention: a smaller KV cache and faster decoding for little quality (Ainslie et al. 2023;
lecture: Llama 2's grouped-query attention).

With H query heads sharing Hkv key/value heads, the cache holds 2 * layers * Hkv * D numbers per token instead of
2 * layers * H * D: MHA (Hkv = H), GQA (1 < Hkv < H), MQA (Hkv = 1, Shazeer 2019). Decoding reads the whole cache
at every step, so a smaller cache is read faster once it is long. Each variant is trained on the same tokens over
several seeds (its validation loss), then the variants take turns timing greedy decoding with a KV cache (batch 8,
a 256-token cache), round after round: the budget's rounds, or as many as --seeds asks where that is more. The cache
size is read from the cache each model allocates.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from torch import nn

from attnkit.config import ModelConfig
from attnkit.experiments.base import Check, Progress, Result, Stored, experiment
from attnkit.experiments.lm_runs import char_corpus, train_lm
from attnkit.experiments.plots import fit_value_axis, new_figure, save, series, spread_legend
from attnkit.layers.kv_cache import kv_bytes_per_position

N_HEADS = 8
ROUNDS = {"tiny": 2, "small": 5, "full": 7}  # timing rounds of decoding, the models taking turns


@torch.inference_mode()
def decode_tokens_per_second(model: nn.Module, *, batch: int, prompt: int, new_tokens: int) -> float:
    """Greedy decoding with a preallocated KV cache; tokens generated per second over all sequences."""
    model.eval()
    ids = torch.randint(0, model.lm_head.out_features, (batch, prompt))
    cache = model.allocate_cache(batch, prompt + new_tokens)
    logits = model(ids, cache=cache).logits[:, -1]  # prefill: (B, V)
    start = time.perf_counter()
    for _ in range(new_tokens):
        token = logits.argmax(-1, keepdim=True)  # (B, 1)
        logits = model(token, cache=cache).logits[:, -1]
    return batch * new_tokens / (time.perf_counter() - start)


def decode_speeds(models: list[nn.Module], *, rounds: int, **decoding: int) -> list[list[float]]:
    """Each model's decoding speed (`decode_tokens_per_second`) in each of `rounds` rounds that take the models in
    turn: load from other work on a shared machine slows whichever model runs at that moment, so the models are
    interleaved and compared round by round. A first round, not returned, warms the kernels up."""
    speeds = []
    for round_index in range(rounds + 1):
        speed = [decode_tokens_per_second(model, **decoding) for model in models]
        if round_index:
            speeds.append(speed)
    return speeds


def plot(stored: Stored, out: Path) -> list[str]:
    """Cache size, decoding speed (median and each round) and validation loss (mean and each seed) per variant;
    sizes and speeds from 0, the loss on an axis at least 10% of its value tall."""
    rows = stored.rows
    names, indices = [r["attention"] for r in rows], range(len(rows))
    fig, axes = new_figure(15, 3.6, ncols=3)
    axes[0].bar(names, [r["KV bytes per token"] for r in rows])
    axes[0].set(ylabel="KV-cache bytes per token", title="cache size")
    speed = series(axes[1], names, [r["decode tokens/s"] for r in rows], unit="timing round",
                   seeds=stored.spread([(i, "decode tokens/s") for i in indices]))
    rounds = len(stored.per_seed[0]["decode tokens/s"]) if stored.per_seed else ROUNDS[stored.budget]
    axes[1].set(ylabel="tokens/s (batch 8, 256-token cache)", title="decoding speed")
    spread_legend(axes[1], over=f"median of {rounds} rounds", spread=speed)
    loss = series(axes[2], names, [r["val loss"] for r in rows], color="tab:red",
                  seeds=stored.spread([(i, "val loss") for i in indices]))
    axes[2].set(ylabel="validation loss (nats/char)", title="quality")
    spread_legend(axes[2], over=f"mean of {stored.seeds} seeds", spread=loss)
    for ax, scale in zip(axes, ("from zero", "from zero", "level"), strict=True):
        fit_value_axis(ax, scale)
    save(fig, out / "gqa.png")
    return ["gqa.png"]


@experiment(
    "gqa-memory",
    claim="grouped-query and multi-query attention shrink the KV cache by H / Hkv and speed up decoding, at little "
    "cost in quality",
    lecture="Llama 2: grouped-query attention (Ainslie et al. 2023; Shazeer 2019)",
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    steps = {"tiny": 3, "small": 200, "full": 800}[budget]
    new_tokens = {"tiny": 4, "small": 64, "full": 128}[budget]
    rounds = max(ROUNDS[budget], seeds)  # --seeds N: at least N rounds, the number an undecided speed check names
    corpus = char_corpus({"tiny": 20_000, "small": 300_000, "full": 1_000_000}[budget])
    rows, models, losses = [], [], []  # losses: per variant, per seed
    for kv_heads in (8, 4, 2, 1):
        config = ModelConfig(family="decoder", d_model=256, n_heads=N_HEADS, n_kv_heads=kv_heads, n_layers=2,
                             d_ff=512, position="rope", max_seq_len=512, vocab_size=corpus.vocab_size)
        kind = {N_HEADS: "MHA", 1: "MQA"}.get(kv_heads, "GQA")
        per_seed = []
        for seed in range(seeds):
            desc = f"{kind} {N_HEADS}/{kv_heads}, seed {seed}"
            progress.phase(f"training {desc}")
            log = train_lm(config, corpus, steps=steps, seq_len=64, lr=2e-3, seed=seed, progress=progress, desc=desc)
            per_seed.append(log.val_loss)
            if seed == 0:
                models.append(log.model)
        losses.append(per_seed)
        rows.append({"attention": f"{kind} {N_HEADS}/{kv_heads}",
                     "KV bytes per token": kv_bytes_per_position(models[-1]), "val loss": statistics.fmean(per_seed)})
    progress.phase(f"timing decoding: {rounds} rounds of the four models in turn")
    speeds = decode_speeds(models, rounds=rounds, batch=8, prompt=256 - new_tokens, new_tokens=new_tokens)
    for index, row in enumerate(rows):
        row["decode tokens/s"] = statistics.median(speed[index] for speed in speeds)

    mha, mqa = rows[0], rows[-1]
    checks = [
        Check.fact(f"MQA's KV cache is {N_HEADS}x smaller than MHA's",
                   mha["KV bytes per token"] == N_HEADS * mqa["KV bytes per token"]),
        Check.over("MQA's decoding speed over MHA's, minus 1", [speed[-1] / speed[0] - 1 for speed in speeds],
                   unit="rounds"),
        Check.over("little cost in quality: 0.1 nats minus MQA's validation loss above MHA's",
                   [0.1 - (q - m) for q, m in zip(losses[-1], losses[0], strict=True)]),
    ]
    reason = (f"MQA's cache is {mha['KV bytes per token'] // mqa['KV bytes per token']}x smaller; decoding "
              f"{mqa['decode tokens/s']:.0f} vs {mha['decode tokens/s']:.0f} tokens/s (median of {rounds} rounds); "
              f"validation loss {mqa['val loss']:.3f} vs {mha['val loss']:.3f} after {steps} steps (mean of {seeds} "
              "seeds)")
    key = f"MQA {mqa['decode tokens/s'] / mha['decode tokens/s']:.2f}x MHA's decoding speed, 8x smaller cache"
    per_seed = [{"val loss": loss, "decode tokens/s": [speed[index] for speed in speeds]}
                for index, loss in enumerate(losses)]
    return Result(checks, reason, key, rows, [], per_seed)
