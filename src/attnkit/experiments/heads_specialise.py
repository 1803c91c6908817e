"""Heads learn different jobs (lecture: "each head might learn to track different kinds of relationships"; Olsson et
al. 2022; Michel et al. 2019).

Two settings, each trained from scratch over several seeds and compared with the same model at initialisation:

    induction task   a two-layer attention-only decoder (4 + 4 heads) on repeated random tokens, where the repeated
                     half is predictable only by induction (`attnkit.inspect.induction`)
    real text        a two-layer decoder (4 + 4 heads) on the standard library's source, characters

What "different jobs" predicts, measured with `attnkit.inspect`: the heads' importance (the loss rise when one is
ablated) becomes unequal, a few heads carrying what the others do not (the most important head's rise minus the
median head's); and their attention patterns diverge in kind (on the induction task, one head's induction score
beyond the others'; on text, the spread across heads of the previous-token score). Each is measured trained minus at
initialisation, so that the spread random weights already show is not counted.

The circuit view reads the same models' weights (`attnkit.inspect.circuits`, Elhage et al. 2021): the K-composition
of each layer-0 head into each layer-1 head, at initialisation and trained. An induction head's keys read what a
previous-token head wrote, so training should raise the best layer-0 head's K-composition into the layer-1 head
with the highest induction score above what random weights give (the table's "induction head K-composition").
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.checkpoint import load_weights, unique_state_dict
from attnkit.config import ModelConfig
from attnkit.experiments.arms import Arm
from attnkit.experiments.base import Check, Progress, Result, experiment
from attnkit.experiments.lm_runs import Corpus, char_corpus, initial_model, train_lm
from attnkit.experiments.plots import heatmap_axes, new_figure, save
from attnkit.inspect.circuits import composition_scores
from attnkit.inspect.head_types import head_types, self_scores
from attnkit.inspect.importance import head_importance
from attnkit.inspect.induction import InductionTask, attention_only_decoder, train_induction
from attnkit.inspect.inputs import Batch, lm_batch
from attnkit.inspect.tracing import trace

HEADS, WIDTH, SEQ_LEN = 4, 32, 64
SETTINGS = {  # induction-task steps, text steps, corpus bytes
    "tiny": dict(induction=30, text=5, corpus=20_000),
    "small": dict(induction=400, text=300, corpus=300_000),
    "full": dict(induction=800, text=1500, corpus=1_000_000),
}
TASK = InductionTask(vocab_size=24, half=8, shortest=4, batch=32)


def importance_spread(scores: Tensor) -> float:
    """The most important head's loss rise minus the median head's, over every head of the model (nats)."""
    flat = scores.flatten()
    flat = flat[~flat.isnan()]
    return float(flat.max() - flat.median())


def induction_model(seed: int, steps: int, progress: Progress | None = None) -> nn.Module:
    """The attention-only decoder for `seed`, trained `steps` on the induction task (at initialisation for 0); a
    trained one is an arm of `progress` (kept, and reused by a resumed run)."""

    def built() -> nn.Module:
        torch.manual_seed(seed)
        return attention_only_decoder(vocab_size=TASK.vocab_size, d_model=WIDTH, n_heads=(HEADS, HEADS),
                                      max_seq_len=2 * TASK.half)

    def trained() -> tuple[nn.Module, Arm]:
        model = built()
        train_induction(model, TASK, steps=steps, lr=1e-2, seed=seed)
        return model, Arm({}, unique_state_dict(model))

    def restored(arm: Arm) -> nn.Module:
        model = built()
        load_weights(model, arm.tensors, source=f"the saved induction model of seed {seed}")
        return model

    if not steps:
        return built().eval()
    setting = {"task": repr(TASK), "width": WIDTH, "heads": HEADS, "steps": steps, "lr": 1e-2, "seed": seed}
    return (progress or Progress()).arm(f"induction task, seed {seed}", setting, trained, restored).eval()


def measure_induction(model: nn.Module, seed: int) -> dict:
    """The repeated half's loss, each head's induction score and importance on held-out repeated tokens."""
    ids = TASK.ids(torch.Generator().manual_seed(1000 + seed), batch=32)
    batch = lm_batch(ids)
    labels = batch.labels.clone()
    labels[:, : TASK.half] = -100  # the repeated half alone
    importance = head_importance(model, Batch(batch.args, labels))
    induction = head_types(model, ids).scores["induction"]  # (layers, H)
    best = induction.flatten().max()
    others = (induction.flatten().sum() - best) / (induction.numel() - 1)
    k_composition = composition_scores(model).table("k", "blocks.0.attn", "blocks.1.attn")  # (H layer 0, H layer 1)
    return {"loss": importance.baseline, "induction": induction, "importance": importance.scores,
            "induction margin": float(best - others), "importance spread": importance_spread(importance.scores),
            "K-composition": k_composition,
            "induction head K-composition": float(k_composition[:, int(induction[1].argmax())].max())}


def text_config() -> ModelConfig:
    return ModelConfig(family="decoder", d_model=WIDTH, n_heads=HEADS, n_layers=2, d_ff=4 * WIDTH, position="learned",
                       max_seq_len=SEQ_LEN)


def measure_text(model: nn.Module, corpus: Corpus, seed: int) -> dict:
    """Validation text: the loss, each head's previous-token score and importance."""
    generator = torch.Generator().manual_seed(2000 + seed)
    x, y = corpus.data.sample_batch("val", 16, SEQ_LEN, generator)  # (B, T), (B, T)
    model.eval()
    importance = head_importance(model, Batch((x,), y))
    read = trace(model, x, names=[f"blocks.{i}.attn.pattern" for i in range(2)])
    previous = torch.stack([self_scores(read[f"blocks.{i}.attn.pattern"], x)["previous"] for i in range(2)])
    return {"loss": importance.baseline, "previous": previous, "importance": importance.scores,
            "previous spread": float(previous.max() - previous.min()),
            "importance spread": importance_spread(importance.scores)}


@experiment(
    "heads-specialise",
    claim="trained heads take different jobs: a few carry what the others do not (their ablation costs more), and "
    "their attention patterns diverge in kind (an induction head on repeated tokens; previous-token heads on text)",
    lecture="Multi-head attention: each head might track a different relationship (probing and mechanistic "
    "interpretability)",
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    s = SETTINGS[budget]
    corpus = char_corpus(s["corpus"])
    rows, found = [], {}
    for seed in range(seeds):
        for steps in (0, s["induction"]):
            progress.phase(f"induction task, seed {seed}, {steps} steps")
            found[("induction", seed, steps)] = m = measure_induction(induction_model(seed, steps, progress), seed)
            rows.append({"setting": "induction task", "seed": seed, "steps": steps, "loss": m["loss"],
                         "importance spread": m["importance spread"], "induction margin": m["induction margin"],
                         "induction head K-composition": m["induction head K-composition"],
                         "previous spread": None})
        for steps in (0, s["text"]):
            progress.phase(f"real text, seed {seed}, {steps} steps")
            if steps:
                model = train_lm(text_config(), corpus, steps=steps, seq_len=SEQ_LEN, batch_size=16, lr=3e-3,
                                 warmup=max(steps // 10, 1), seed=seed, eval_batches=2, progress=progress,
                                 desc=f"text, seed {seed}").model
            else:
                model = initial_model(text_config(), corpus, seed)
            found[("text", seed, steps)] = m = measure_text(model, corpus, seed)
            rows.append({"setting": "real text", "seed": seed, "steps": steps, "loss": m["loss"],
                         "importance spread": m["importance spread"], "induction margin": None,
                         "induction head K-composition": None, "previous spread": m["previous spread"]})

    def gain(setting: str, key: str, steps: int) -> list[float]:
        return [found[(setting, seed, steps)][key] - found[(setting, seed, 0)][key] for seed in range(seeds)]

    checks = [
        Check.over("induction task: most important head's loss rise minus the median head's, trained minus at "
                   "initialisation (nats)", gain("induction", "importance spread", s["induction"])),
        Check.over("induction task: best induction score minus the other heads' mean, trained minus at "
                   "initialisation", gain("induction", "induction margin", s["induction"])),
        Check.over("real text: most important head's loss rise minus the median head's, trained minus at "
                   "initialisation (nats)", gain("text", "importance spread", s["text"])),
        Check.over("real text: spread of the previous-token score across heads, trained minus at initialisation",
                   gain("text", "previous spread", s["text"])),
    ]
    plots = [_plot(found, s, out)]
    trained = found[("induction", 0, s["induction"])]
    margin = statistics.fmean(gain("induction", "induction margin", s["induction"]))
    return Result(
        checks=checks,
        reason=(f"after {s['induction']} steps on repeated tokens the best induction head's score exceeds the other "
                f"heads' mean by {margin:+.2g} more than at initialisation (seed 0: repeated-half loss "
                f"{trained['loss']:.2f} nats against ln {TASK.vocab_size} = {math.log(TASK.vocab_size):.2f} "
                f"by chance); on text, after {s['text']} steps, the previous-token score's spread across heads "
                f"changes by {statistics.fmean(gain('text', 'previous spread', s['text'])):+.2g}"),
        key_number=f"induction margin {margin:+.2g} over initialisation",
        rows=rows,
        plots=plots,
    )


def _plot(found: dict, s: dict, out: Path) -> str:
    """Seed 0's trained models: the induction task's induction scores and importance, text's previous-token scores
    and importance, each layer x head; then the induction model's K-composition (layer-0 heads into layer-1 heads) at
    initialisation and trained."""
    fig, axes = new_figure(10, 9, ncols=2, nrows=3)
    induction, text = found[("induction", 0, s["induction"])], found[("text", 0, s["text"])]
    untrained = found[("induction", 0, 0)]
    layers = ["layer 0", "layer 1"]
    heads = [str(h) for h in range(HEADS)]
    rise = "loss rise when ablated\n(nats; a fall drawn as 0)"
    panels = [(induction["induction"], "induction task: induction score"),
              (induction["importance"].clamp(min=0), f"induction task: {rise}"),
              (text["previous"], "real text: previous-token score"),
              (text["importance"].clamp(min=0), f"real text: {rise}")]
    for ax, (values, title) in zip(axes[:4], panels, strict=True):
        heatmap_axes(ax, values, title=title, xlabel="head", ylabel="", xticklabels=heads, yticklabels=layers)
    senders = [f"layer 0 head {h}" for h in heads]
    top = max(float(m["K-composition"].max()) for m in (untrained, induction))
    for ax, (model, when) in zip(axes[4:], ((untrained, "at initialisation"), (induction, "trained")), strict=True):
        heatmap_axes(ax, model["K-composition"], title=f"induction task: K-composition, {when}",
                     xlabel="layer-1 head (receiver)", ylabel="", xticklabels=heads, yticklabels=senders)
        ax.images[0].set_clim(0, top)  # one scale for both, so that the two can be compared
    path = out / "heads.png"
    save(fig, path)
    return path.name
