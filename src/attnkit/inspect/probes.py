"""Linear probes per layer (lecture: "probing"): can a linear classifier read a word's label (its part of speech, its
entity tag) from a layer's states? With Hewitt and Liang's (2019) control task beside it, so that an accuracy is
read against what the probe could reach by memorising words.

    accuracy           a linear probe trained on the layer's states at each word's piece (`reading_piece`: the
                       last for a causal model, which there has seen the whole word; the first for a bidirectional
                       one, which sees the whole word everywhere), held-out words
    control accuracy   the same probe trained on control labels: each word type given one random label, drawn from
                       the real labels' distribution (a task only memorising word identity can solve)
    selectivity        accuracy - control accuracy: high when the layer encodes the label, not merely the word
    majority           always answering the commonest training label (and `control majority`: the same for the
                       control labels): with a skewed label set, read each accuracy against its baseline

Labels come from CoNLL / CoNLL-U files (`attnkit.tasks.conll.read_tagged`); words become pieces as the tagging task
lays them out (`attnkit.tasks.tag.align`), read as the model reads text: the running text's pieces where the tokenizer
writes a space into the word after it ('Ġlives'), as a language model and a tagger trained since they were recorded
read it; a tagger trained before reads each word on its own, as its task.json says (`word_pieces_of`). The
text is framed as the stack learned to read one (`text_frame`): a language model's without a start mark (BOS where its
tokenizer starts every text with one: a converted Llama), a converted tagger's as its own tokenizer frames it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data.labelled import frame_ids
from attnkit.errors import InputError
from attnkit.inspect.points import evaluated, module_of
from attnkit.inspect.tracing import trace
from attnkit.tasks.conll import Sentence
from attnkit.tasks.reading import Frame, reading_stack, text_frame, text_layout
from attnkit.tasks.tag import WordPieces, align
from attnkit.tokenize import Tokenizer


@dataclass(frozen=True)
class ProbeResult:
    """One probe's held-out accuracies; `majority` and `control_majority`: always answering the commonest training
    label of the real and of the control task."""

    layer: str
    accuracy: float
    control_accuracy: float
    majority: float
    control_majority: float

    @property
    def selectivity(self) -> float:
        return self.accuracy - self.control_accuracy

    def row(self) -> dict:
        return {"layer": self.layer, "accuracy": round(self.accuracy, 4),
                "control accuracy": round(self.control_accuracy, 4), "selectivity": round(self.selectivity, 4),
                "majority": round(self.majority, 4), "control majority": round(self.control_majority, 4)}


def control_labels(types: Tensor, labels: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
    """Hewitt and Liang's control task: each distinct type (N,) gets one label drawn from the empirical distribution
    of `labels` (N,); returns each item's control label (N,)."""
    distinct, which = types.unique(return_inverse=True)
    frequencies = torch.bincount(labels).float()
    drawn = torch.multinomial(frequencies, len(distinct), replacement=True, generator=generator)  # (types,)
    return drawn[which]


def fit_probe(features: Tensor, labels: Tensor, train: Tensor, *, steps: int = 300, lr: float = 0.05,
              weight_decay: float = 1e-3, seed: int = 0) -> float:
    """Train a linear softmax probe on the `train` rows of features (N, C) and labels (N,) (standardised by the
    training rows, full-batch Adam) and return its accuracy on the other rows."""
    if train.all() or not train.any():
        raise InputError("a probe needs both training and held-out items; give more sentences")
    x = features.float()
    mean, std = x[train].mean(0), x[train].std(0).clamp(min=1e-6)
    x = (x - mean) / std
    torch.manual_seed(seed)
    probe = nn.Linear(x.shape[1], int(labels.max()) + 1)
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(probe(x[train]), labels[train]).backward()
            optimizer.step()
    with torch.no_grad():
        return float((probe(x[~train]).argmax(-1) == labels[~train]).float().mean())


def probe(features: Tensor, labels: Tensor, types: Tensor, *, layer: str = "", train: Tensor | None = None,
          seed: int = 0, **fit) -> ProbeResult:
    """A probe on the real labels and one on their control task, over features (N, C), labels (N,) and each item's
    type (N,), e.g. its word's id. `train` (N,) bool marks the training items (default: a random 80%)."""
    generator = torch.Generator().manual_seed(seed)
    if train is None:
        train = torch.rand(len(labels), generator=generator) < 0.8
    control = control_labels(types, labels, generator=generator)
    return ProbeResult(layer, fit_probe(features, labels, train, seed=seed, **fit),
                       fit_probe(features, control, train, seed=seed, **fit), majority(labels, train),
                       majority(control, train))


def majority(labels: Tensor, train: Tensor) -> float:
    """The held-out accuracy of always answering the commonest training label: labels (N,), train (N,) bool."""
    return float((labels[~train] == torch.bincount(labels[train]).argmax()).float().mean())


@dataclass(frozen=True)
class WordStates:
    """Each layer's states at every word's `piece` (first or last, `reading_piece`): `states[layer]` (N, C); labels,
    types (word ids) and sentence (each word's sentence index), (N,) each."""

    states: dict[str, Tensor]
    labels: Tensor
    types: Tensor
    sentence: Tensor
    label_names: list[str]
    piece: str


def reading_piece(model: nn.Module) -> str:
    """Which piece of a word a probe reads: "last" in a causal stack (its first piece has seen only the word's
    start; a character model's, one letter), "first" in a bidirectional one (as the tagging task labels words)."""
    return "last" if reading_stack(model).causal else "first"


@torch.no_grad()
@evaluated
def word_states(model: nn.Module, tokenizer: Tokenizer, sentences: Sequence[Sentence], *, max_len: int,
                batch_size: int = 32, word_pieces: WordPieces = "running", frame: Frame = "attnkit") -> WordStates:
    """Run the model's reading stack over the sentences (pieces laid out as `align` does with `word_pieces`, framed
    as `text_frame` says with `frame`: a run's `frame_of`) and keep the stream after the embeddings and after each
    block at each word's piece (`reading_piece`)."""
    model = module_of(model)
    stack = reading_stack(model)
    last = reading_piece(model) == "last"
    before, after = text_frame(model, tokenizer, frame)
    own = frame == "own" or text_layout(model) != "marked"  # align's framing, its marks replaced by before and after
    laid_before, laid_after = frame_ids(tokenizer, own=own)
    room = max_len - len(before) - len(after) + len(laid_before) + len(laid_after)
    shift = len(before) - len(laid_before)  # from a piece's place in align's row to its place in the stack's
    n_blocks = len(stack.blocks)
    names = ["blocks.0.resid_pre", *(f"blocks.{i}.resid_post" for i in range(n_blocks))]
    label_names = sorted({tag for _, tags in sentences for tag in tags})
    index = {tag: i for i, tag in enumerate(label_names)}
    vocabulary: dict[str, int] = {}
    aligned = [align(tokenizer, words, [index[t] for t in tags], room, word_pieces, "own" if own else "attnkit")
               for words, tags in sentences]
    device = next(stack.parameters()).device
    states: dict[str, list[Tensor]] = {n: [] for n in names}
    labels, types, sentence = [], [], []
    for start in range(0, len(aligned), batch_size):
        chunk = aligned[start:start + batch_size]
        texts = [[*before, *a.ids[len(laid_before):len(a.ids) - len(laid_after)], *after] for a in chunk]
        length = max(map(len, texts))
        ids = torch.zeros(len(chunk), length, dtype=torch.long)
        mask = torch.zeros(len(chunk), length, dtype=torch.bool)
        for row, text in enumerate(texts):
            ids[row, :len(text)], mask[row, :len(text)] = torch.tensor(text, dtype=torch.long), True
        read = trace(stack, ids.to(device), names=names, attention_mask=mask.to(device))
        for row, a in enumerate(chunk):
            words = sentences[start + row][0]
            widths = _widths(tokenizer, words[:max_len], word_pieces) if last else None  # later words are cut off
            kept = [(w, p, p + shift + (widths[i] - 1 if last else 0))
                    for i, (w, p) in enumerate(zip(words, a.firsts, strict=True)) if p is not None]
            positions = [read_at for _, _, read_at in kept]
            for name in names:
                states[name].append(read[name][row, positions].float().cpu())  # (words, C)
            labels += [a.labels[first] for _, first, _ in kept]  # a word's label sits at its first piece
            types += [vocabulary.setdefault(w.lower(), len(vocabulary)) for w, _, _ in kept]
            sentence += [start + row] * len(kept)
    if not labels:
        raise InputError("no word kept its label; give sentences that fit the model's length")
    return WordStates({n: torch.cat(v) for n, v in states.items()}, torch.tensor(labels), torch.tensor(types),
                      torch.tensor(sentence), label_names, "last" if last else "first")


def _widths(tokenizer: Tokenizer, words: Sequence[str], word_pieces: WordPieces) -> list[int]:
    """How many pieces each word has as `align` lays it out with `word_pieces` (a word with none stands as UNK)."""
    running = word_pieces == "running" and tokenizer.space_starts_word
    encoded = tokenizer.encode_words(list(words)) if running else tokenizer.encode_batch(list(words))
    return [len(pieces) or 1 for pieces in encoded]


def probe_layers(model: nn.Module, tokenizer: Tokenizer, sentences: Sequence[Sentence], *, max_len: int,
                 seed: int = 0, word_pieces: WordPieces = "running", frame: Frame = "attnkit", **fit
                 ) -> list[ProbeResult]:
    """One probe per layer (the embeddings' output, then each block's) on the sentences' word labels, words read as
    `word_pieces` lays them out and framed as `frame` says (`word_states`); training and held-out words from different
    sentences (80% / 20%)."""
    found = word_states(model, tokenizer, sentences, max_len=max_len, word_pieces=word_pieces, frame=frame)
    generator = torch.Generator().manual_seed(seed)
    train_sentences = torch.rand(len(sentences), generator=generator) < 0.8
    train = train_sentences[found.sentence]
    return [probe(states, found.labels, found.types, layer=name, train=train, seed=seed, **fit)
            for name, states in found.states.items()]
