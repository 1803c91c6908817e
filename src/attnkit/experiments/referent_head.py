"""A head from "it" finds what "it" refers to (COGS 150: "The animal didn't cross the street because it was tired":
attention helps identify relationships between elements of a sentence).

Templated sentences, two nouns and an adjective that decides which one "it" is (Winograd-style):

    the animal would not cross the street that day because it was tired     -> it = animal
    the street was avoided by the dog that day because it was wide          -> it = street

A noun is an agent (animal, dog, ...) or a place (street, road, ...); an adjective says what an agent was (tired,
afraid, ...) or what a place was (wide, busy, ...). The two templates put the agent first or second, so the referent's
position is decided by the adjective and the template together. A small encoder (2 layers of 4 heads, width 32) is
trained to name the referent at "it" (its masked-LM head's token there, the loss at "it" alone). Each (referent,
adjective) pairing with (noun index + adjective index) % 4 == 0 is held out of training, "animal ... tired" and
"street ... wide" among them; every noun and adjective is trained on in other pairings.

The first layer attends within a window of 3 tokens (Longformer's and Gemma 2's local layer; `attention_window=3,
global_every=2`): there "it" can read the adjective but no noun, and the adjective no noun, so the referent can only
be chosen by the second, global layer attending from "it". The claim predicts a head whose weight from "it" is more on
the referent than on the other noun in held-out sentences, more often than chance (0.5) and than in the same model
trained with the referent drawn at random (no signal in the adjective). The lecture says attention relates "it" to
"animal"; it names no share of sentences, so no higher bar is checked. The head is chosen on sentences of trained
pairings and scored on the held-out ones (`attnkit.inspect.referents.referent_accuracy`). That score is relative: a
head may weigh the referent above the other noun by looking away from the other noun, putting little weight on
either (seed 0's head puts 0.85 on "animal" for "tired" and 0.06 on "street" for "wide"), so the table gives the top
head's mean weight on the referent beside it.

A third model has two global layers. It names the referent as well, but it need not find it from "it": its table row
shows whether it does, and how often a head from the adjective picks the referent instead (the adjective can look up
the noun of its kind in the first layer, and "it" read the adjective in the second).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.checkpoint import load_weights, unique_state_dict
from attnkit.config import ModelConfig
from attnkit.experiments.arms import Arm
from attnkit.experiments.base import Check, Progress, Result, experiment
from attnkit.experiments.plots import new_figure, save
from attnkit.inspect.referents import referent_accuracy, referent_weight
from attnkit.inspect.tracing import trace
from attnkit.models.families import build_model
from attnkit.viz.head_view import draw_head_view

AGENTS = ("animal", "dog", "cat", "horse", "cow", "child", "man", "woman", "boy", "girl")
PLACES = ("street", "road", "river", "bridge", "field", "square", "track", "lane")
AGENT_ADJECTIVES = ("tired", "afraid", "lazy", "hungry", "scared", "sleepy", "weak", "slow")
PLACE_ADJECTIVES = ("wide", "busy", "crowded", "icy", "flooded", "muddy", "long", "narrow")
TEMPLATES = ("the {agent} would not cross the {place} that day because it was {adjective}",  # agent at 1, place at 6
             "the {place} was avoided by the {agent} that day because it was {adjective}")  # place at 1, agent at 6
AGENT_AT = (1, 6)  # the agent's position in each template; the place is at the other of 1 and 6
IT, ADJECTIVE, LENGTH = 10, 12, 13  # "it"'s position, the adjective's, the sentence's length
WORDS = tuple(sorted({w for t in TEMPLATES for w in t.split() if not w.startswith("{")}
                     | {*AGENTS, *PLACES, *AGENT_ADJECTIVES, *PLACE_ADJECTIVES}))
ID = {word: i for i, word in enumerate(WORDS)}
HELD_OUT_EVERY = 4  # a (referent, adjective) pairing is held out where (noun index + adjective index) % 4 == 0
WIDTH, HEADS, WINDOW = 32, 4, 3
STEPS = {"tiny": 15, "small": 400, "full": 1500}
CHANCE = 0.5  # the referent is first in half the sentences: a head that picks by position alone is right this often
BATCH, SCORED = 64, 400  # training sentences a step; sentences the heads are chosen on, and scored on
ARMS = {  # name: (the adjective decides the referent, first layer windowed)
    "adjective decides": (True, True),
    "referent at random": (False, True),
    "two global layers": (True, False),
}


@dataclass(frozen=True)
class Sentences:
    """Templated sentences and what "it" refers to in each."""

    ids: Tensor  # (N, T) word ids
    labels: Tensor  # (N, T): the referent's id at "it", -100 elsewhere (the loss at "it" alone)
    referent: Tensor  # (N,) the position of the noun "it" names (the label's noun)
    other: Tensor  # (N,) the other noun's position

    def words(self, row: int) -> list[str]:
        return [WORDS[i] for i in self.ids[row].tolist()]


def held_out(noun: int, adjective: int) -> bool:
    """Whether the pairing of the referent noun (its index in AGENTS or PLACES) and the adjective (its index in its
    list) is held out of training."""
    return (noun + adjective) % HELD_OUT_EVERY == 0


def sentence(agent: str, place: str, adjective: str, template: int) -> tuple[list[int], int, int]:
    """One sentence's ids, and the positions of the noun the adjective describes and of the other noun."""
    words = TEMPLATES[template].format(agent=agent, place=place, adjective=adjective).split()  # (T,)
    agent_at = AGENT_AT[template]
    place_at = 7 - agent_at
    described = agent_at if adjective in AGENT_ADJECTIVES else place_at
    return [ID[w] for w in words], described, agent_at + place_at - described


def sentences(n: int, generator: torch.Generator, *, held: bool, signal: bool = True) -> Sentences:
    """`n` sentences of the held-out pairings (`held`) or of the trained ones. `signal`: "it" names the noun the
    adjective describes; False: one of the two nouns drawn at random, whatever the adjective (the control)."""
    ids, referents, others = [], [], []
    sizes = (len(AGENTS), len(PLACES), 2, len(AGENT_ADJECTIVES), len(TEMPLATES), 2)
    while len(ids) < n:
        draws = torch.stack([torch.randint(k, (2 * n,), generator=generator) for k in sizes], dim=1)  # (2n, 6)
        for agent, place, kind, adjective, template, coin in draws.tolist():
            noun = agent if kind == 0 else place
            if len(ids) == n or held_out(noun, adjective) != held:
                continue
            words = (AGENT_ADJECTIVES if kind == 0 else PLACE_ADJECTIVES)[adjective]
            row, referent, other = sentence(AGENTS[agent], PLACES[place], words, template)
            if not signal and coin:
                referent, other = other, referent
            ids.append(row)
            referents.append(referent)
            others.append(other)
    ids_t = torch.tensor(ids)  # (N, T)
    labels = torch.full_like(ids_t, -100)
    rows = torch.arange(n)
    referent_t = torch.tensor(referents)
    labels[:, IT] = ids_t[rows, referent_t]
    return Sentences(ids_t, labels, referent_t, torch.tensor(others))


def config(*, windowed: bool) -> ModelConfig:
    return ModelConfig(family="encoder", encoder_head="mlm", vocab_size=len(WORDS), d_model=WIDTH, n_heads=HEADS,
                       n_layers=2, d_ff=2 * WIDTH, max_seq_len=LENGTH, position="learned",
                       attention_window=WINDOW if windowed else None, global_every=2 if windowed else 0)


def trained_model(arm: str, seed: int, steps: int, progress: Progress) -> nn.Module:
    """The arm's model for `seed`, trained `steps` (kept as an arm of `progress`, reused by a resumed run)."""
    signal, windowed = ARMS[arm]

    def built() -> nn.Module:
        torch.manual_seed(seed)
        return build_model(config(windowed=windowed))

    def train() -> tuple[nn.Module, Arm]:
        model = built()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(1000 + seed)
        for _ in progress.steps(steps, f"{arm}, seed {seed}"):
            batch = sentences(BATCH, generator, held=False, signal=signal)
            loss = model(batch.ids, labels=batch.labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model, Arm({}, unique_state_dict(model))

    def restored(saved: Arm) -> nn.Module:
        model = built()
        load_weights(model, saved.tensors, source=f"the saved {arm} model of seed {seed}")
        return model

    setting = {"arm": arm, "words": len(WORDS), "width": WIDTH, "heads": HEADS, "steps": steps, "seed": seed}
    return progress.arm(f"{arm}, seed {seed}", setting, train, restored).eval()


def patterns(model: nn.Module, ids: Tensor) -> Tensor:
    """(N, T) -> (N, L, H, T, S): every layer's attention weights."""
    names = [f"blocks.{i}.attn.pattern" for i in range(2)]
    read = trace(model, ids, names=names)
    return torch.stack([read[name] for name in names], dim=1)


def measure(model: nn.Module, seed: int) -> dict:
    """The answer's accuracy on held-out pairings, and the top head (chosen on trained pairings) from "it" and from
    the adjective, each with its referent accuracy on the held-out pairings; the top head from "it" with its mean
    weight on the referent there too (a head may pick the referent by looking away from the other noun)."""
    choose = sentences(SCORED, torch.Generator().manual_seed(2000 + seed), held=False)
    test = sentences(SCORED, torch.Generator().manual_seed(3000 + seed), held=True)
    chosen_on, scored_on = patterns(model, choose.ids), patterns(model, test.ids)  # (N, L, H, T, S)
    found = {}
    for reader, position in (("it", IT), ("adjective", ADJECTIVE)):
        at = torch.full((SCORED,), position)
        layer, head = divmod(int(referent_accuracy(chosen_on, at, choose.referent, choose.other).argmax()), HEADS)
        found[reader] = (layer, head, float(referent_accuracy(scored_on, at, test.referent, test.other)[layer, head]))
    layer, head, _ = found["it"]
    weight = referent_weight(scored_on, torch.full((SCORED,), IT), test.referent, test.other)[layer, head]
    with torch.no_grad():
        named = model(test.ids).logits[:, IT].argmax(-1)  # (N,)
    return {"answer": float((named == test.labels[:, IT]).float().mean()), "heads": found,
            "weight": float(weight)}


@experiment(
    "referent-head",
    claim="trained to say what 'it' refers to where an adjective decides (the animal ... because it was tired), a "
    "Transformer has a head whose attention from 'it' weighs the referent above the other noun in held-out pairings "
    "of nouns and adjectives, more often than chance; trained with the referent drawn at random, none does",
    lecture="COGS 150: attention identifies relationships between elements (\"The animal didn't cross the street "
    "because it was tired\")",
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    steps = STEPS[budget]
    found: dict[tuple[str, int], dict] = {}
    models = {}
    for seed in range(seeds):
        for arm in ARMS:
            progress.phase(f"{arm}, seed {seed}, {steps} steps")
            model = trained_model(arm, seed, steps, progress)
            found[(arm, seed)] = measure(model, seed)
            if seed == 0:
                models[arm] = model

    def per_seed(arm: str, what: str) -> list[float]:
        return [found[(arm, seed)][what] if what in ("answer", "weight") else found[(arm, seed)]["heads"][what][2]
                for seed in range(seeds)]

    columns = {"answer accuracy": "answer", "top head from 'it': referent accuracy": "it",
               "top head from 'it': weight on the referent": "weight",
               "top head from the adjective: referent accuracy": "adjective"}
    rows, spread = [], []
    for arm in ARMS:
        layer, head, _ = found[(arm, 0)]["heads"]["it"]
        rows.append({"model": arm, **{c: statistics.fmean(per_seed(arm, w)) for c, w in columns.items()},
                     "top head from 'it', seed 0": f"layer {layer} head {head}"})
        spread.append({c: per_seed(arm, w) for c, w in columns.items()})
    checks = claim_checks(per_seed("adjective decides", "it"), per_seed("referent at random", "it"))
    plots = [draw(models, {arm: found[(arm, 0)]["heads"]["it"][:2] for arm in ARMS}, out)]
    by_arm = {row["model"]: row for row in rows}
    head_column = "top head from 'it': referent accuracy"
    mean_signal, mean_control = by_arm["adjective decides"][head_column], by_arm["referent at random"][head_column]
    global_row = by_arm["two global layers"]
    reason = (f"on held-out pairings (each noun and adjective trained on, never together; 'animal ... tired' among "
              f"them), the top head from 'it' of the model trained where the adjective decides picks the referent in "
              f"{mean_signal:.0%} of sentences, against {mean_control:.0%} for the model trained with the referent "
              f"drawn at random (mean of {seeds} seeds, {steps} steps); with two global layers the answer is right in "
              f"{global_row['answer accuracy']:.0%}, its top head from 'it' picks the referent in "
              f"{global_row[head_column]:.0%} and its top head from the adjective in "
              f"{global_row['top head from the adjective: referent accuracy']:.0%}")
    return Result(checks, reason, f"{mean_signal:.0%} vs {mean_control:.0%} of held-out sentences", rows, plots,
                  spread)


def claim_checks(signal: list[float], control: list[float]) -> list[Check]:
    """The claim's two checks over seeds, from each seed's referent accuracy of the top head from "it" on held-out
    pairings (`signal`: the adjective decides; `control`: the referent at random): above the control's, and above
    chance. The lecture says attention relates "it" to "animal", not how often; chance is 0.5, the share of
    sentences whose referent sits where a head that looks by position alone looks (the two templates put it first
    and second equally often)."""
    return [
        Check.over("top head from 'it': referent accuracy on held-out pairings, adjective decides minus referent at "
                   "random", [s - c for s, c in zip(signal, control, strict=True)]),
        Check.over(f"top head from 'it': referent accuracy on held-out pairings minus chance ({CHANCE}), adjective "
                   "decides", [s - CHANCE for s in signal]),
    ]


def draw(models: dict[str, nn.Module], heads: dict[str, tuple[int, int]], out: Path) -> str:
    """Seed 0's models, one row each: its top head's attention from "it" over the lecture's sentence with "tired" and
    with "wide", as BertViz's head view draws one query's lines."""
    examples = [sentence("animal", "street", adjective, 0) for adjective in ("tired", "wide")]
    ids = torch.tensor([row for row, _, _ in examples])  # (2, T)
    fig, axes = new_figure(11, 4.2 * len(models), ncols=2, nrows=len(models))
    for index, (arm, model) in enumerate(models.items()):
        layer, head = heads[arm]
        weights = patterns(model, ids)[:, layer, head, IT]  # (2, S)
        for column, (row, referent, _) in enumerate(examples):
            draw_head_view(axes[2 * index + column], [WORDS[i] for i in row], weights[column].tolist(), IT,
                           title=f"{arm}: layer {layer} head {head}, from 'it'\n(it = {WORDS[row[referent]]}: "
                           "orange; a pairing held out of training)", marked=[referent])
    path = out / "referent.png"
    save(fig, path)
    return path.name
