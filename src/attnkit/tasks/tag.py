"""Token classification (`tag`: an encoder with a tagger head): a label per word, such as named entities (BIO or
BIOES tags) or parts of speech.

Words become subword pieces; a word's label sits on its first piece, and the loss skips continuation pieces,
CLS/SEP and padding (label -100, as Devlin et al. 2019 tag CoNLL-2003). Where the tokenizer writes a space into the
word after it (byte-level BPE 'Ġ', SentencePiece '▁'), the words are the running text's pieces (`align`); WordPiece
and characters encode each word on its own, what they make of a space between:

    words    John         lives    in    Paris                 John        lives   in   Paris
    pieces   BOS Jo hn    Ġlives   Ġin   ĠPar is   EOS         CLS Jo ##hn lives   in   Par ##is SEP
    labels   -   B  -     O        O     B    -    -           -   B  -    O       O    B   -    -

A run records which in its task.json (`word_pieces`); a tagger trained before it did reads each word on its own, the
tokenizer's space between ('Ġ' for byte-level BPE), as it learned to.

One loop, `tag_predictions`, scores the validation data during training and tagged files in `attnkit eval`:
entity precision, recall and F1 by seqeval (the CoNLL evaluation; entity tags only) and word accuracy.
Files: CoNLL or CoNLL-U (`attnkit.tasks.conll`); the tags of the training data are checked for BIO/BIOES
consistency before training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from attnkit.checkpoint import TASK_FILE
from attnkit.data import IGNORE_INDEX, BucketedData, LabelVocab, pad
from attnkit.data.labelled import frame_ids
from attnkit.errors import CheckpointError, InputError
from attnkit.run_settings import InputSettings, read_inputs, text_list
from attnkit.tasks.common import (
    ONE_PROCESS,
    EpochTask,
    Shard,
    check_outputs,
    device_of,
    rows_of,
    split,
    summed_nll,
    synthetic_name,
)
from attnkit.tasks.conll import Sentence, check_scheme, read_tagged, tag_scheme
from attnkit.tasks.layouts import check_layout, layout_of
from attnkit.tasks.reading import FRAME, Frame, frame_of
from attnkit.tasks.registry import (
    EvalContext,
    HFClass,
    TaskCommand,
    TaskContext,
    TaskSpec,
    register,
    task_record,
)
from attnkit.tasks.report import EvalReport
from attnkit.textfiles import EncodingErrors, format_suffix
from attnkit.tokenize import Tokenizer, require_id

log = logging.getLogger(__name__)


# Words -> pieces, labels on first pieces --------------------------------------------------------------------------
@dataclass(frozen=True)
class Aligned:
    """One sentence as model input: ids (T,), labels (T,) (-100 where no loss), and each word's first-piece
    position (None for a word cut off by `max_len`)."""

    ids: list[int]
    labels: list[int]
    firsts: list[int | None]


WordPieces = Literal["own", "running"]
WORD_PIECES = "word_pieces"  # the task.json key that says which a run's tagger reads


def align(tokenizer: Tokenizer, words: Sequence[str], tag_ids: Sequence[int] | None, max_len: int,
          word_pieces: WordPieces = "own", frame: Frame = "attnkit") -> Aligned:
    """`CLS pieces(w1) pieces(w2) ... SEP` (BOS/EOS without CLS), or with `frame` "own" the tokens the tokenizer's own
    post-processor puts around a text (nothing for GPT-2's; `attnkit.data.labelled.frame_ids`). `word_pieces`:
    "running", the pieces of the running text for a tokenizer that writes a space into the word after it
    (`HFTokenizer.encode_words`: 'Ġbe', '▁be'), each word encoded on its own otherwise; "own" (runs trained before the
    choice was recorded), each word encoded on its own and `sep`, what the tokenizer makes of a space, between them
    (nothing for WordPiece, 'Ġ' for byte-level BPE). Words that do not fit in `max_len` are cut off; once no word could
    fit, the rest are cut off without being encoded (a text of a million words costs what one of `max_len` does)."""
    first, last = frame_ids(tokenizer, own=frame == "own")
    running = word_pieces == "running" and tokenizer.space_starts_word
    between = [] if running else tokenizer.encode(" ")
    unknown = [tokenizer.unk_id] if tokenizer.unk_id is not None else []
    ids, labels, firsts = list(first), [IGNORE_INDEX] * len(first), []
    for start in range(0, len(words), max_len):  # encoded max_len words at a time: no more than that many fit
        if len(ids) + (len(between) if start else 0) + 1 + len(last) > max_len:  # full: no one-piece word fits
            break
        chunk = list(words[start:start + max_len])
        if running:  # after the first chunk, from the word before it: its first word's pieces carry their space
            encoded = tokenizer.encode_words(list(words[start - 1:start + max_len]))[1:] if start else (
                tokenizer.encode_words(chunk))
        else:
            encoded = tokenizer.encode_batch(chunk)
        for i, pieces in enumerate(encoded, start):
            pieces = pieces or unknown  # a word the tokenizer has no piece for stands as UNK
            gap = between if i else []
            if not pieces or len(ids) + len(gap) + len(pieces) + len(last) > max_len:
                firsts.append(None)
                continue
            ids += gap
            labels += [IGNORE_INDEX] * len(gap)
            firsts.append(len(ids))
            labels += [tag_ids[i] if tag_ids is not None else IGNORE_INDEX] + [IGNORE_INDEX] * (len(pieces) - 1)
            ids += pieces
    firsts += [None] * (len(words) - len(firsts))
    return Aligned([*ids, *last], [*labels, *[IGNORE_INDEX] * len(last)], firsts)


def word_pieces_of(record: Mapping[str, Any], where: str | Path) -> WordPieces:
    """How a run's words become pieces, as its task.json (`record`, read from `where`) says; "own" for a tagger
    whose task.json names its task without saying (trained before it said: each word on its own, what that run's
    model learned from); "running" for a model with no task.json (converted from Hugging Face: trained on words given
    with `is_split_into_words`, each with its leading space, which the running text's pieces come nearest to) and for
    a run of another task (it read running text)."""
    if record.get("task", "tag") != "tag":
        return "running"
    found = record.get(WORD_PIECES, "own" if "task" in record else "running")
    if found not in get_args(WordPieces):
        raise CheckpointError(f"{where} has {WORD_PIECES}={found!r}, which is none of "
                              f"{', '.join(get_args(WordPieces))}: the file is damaged; put back the run's own one")
    return found


@dataclass(frozen=True)
class TaggedBatch:
    ids: Tensor  # (B, T) int64
    attention_mask: Tensor  # (B, T) bool, True = real token
    labels: Tensor  # (B, T) int64: a word's tag id at its first piece, -100 elsewhere

    def to(self, device: torch.device | str) -> TaggedBatch:
        return TaggedBatch(self.ids.to(device), self.attention_mask.to(device), self.labels.to(device))


class TaggedData(BucketedData[TaggedBatch]):
    """Tagged sentences as padded, bucketed batches (`BucketedData`), with their words' tags kept for scoring."""

    def __init__(self, sentences: Sequence[Sentence], aligned: Sequence[Aligned], *, pad_id: int,
                 label_vocab: LabelVocab, **kwargs) -> None:
        self.sentences, self.aligned = list(sentences), list(aligned)
        self.pad_id, self.label_vocab = pad_id, label_vocab
        super().__init__([len(a.ids) for a in self.aligned], **kwargs)

    @classmethod
    def from_sentences(cls, sentences: Sequence[Sentence], tokenizer: Tokenizer, *, label_vocab: LabelVocab,
                       max_len: int, word_pieces: WordPieces = "own", frame: Frame = "attnkit", **kwargs
                       ) -> TaggedData:
        """Align each sentence (`align`); remaining keyword arguments go to `BucketedData` (batch_size, seed, ...)."""
        aligned = [align(tokenizer, words, [label_vocab.encode(t) for t in tags], max_len, word_pieces, frame)
                   for words, tags in sentences]
        cut = sum(f is None for a in aligned for f in a.firsts)
        if cut:
            log.warning("%d words lie beyond max_seq_len=%d pieces: the model does not read them, and scores count "
                        "them as tagged %r (an entity among them missed); split long sentences, or train with a "
                        "longer --seq-len / max_seq_len", cut, max_len, cut_off_label(label_vocab.labels))
        return cls(sentences, aligned, pad_id=require_id(tokenizer, "pad"), label_vocab=label_vocab, **kwargs)

    def collate(self, indices: Sequence[int]) -> TaggedBatch:
        ids, mask = pad([self.aligned[i].ids for i in indices], self.pad_id)  # (B, T)
        labels, _ = pad([self.aligned[i].labels for i in indices], IGNORE_INDEX)  # (B, T)
        return TaggedBatch(ids, mask, labels)


# The one evaluation loop --------------------------------------------------------------------------------------------
@torch.inference_mode()
def tag_predictions(model: nn.Module, data: TaggedData, *, progress: bool = False, shard: Shard = ONE_PROCESS
                    ) -> tuple[float, int, list[list[str] | None]]:
    """Every sentence of `data` once: the summed loss over labelled pieces, their number, and the predicted tags of
    each sentence's words, in order (a word cut off by max_len gets `O`, or the first label without one). `shard`:
    this rank scores its sentences of each batch (`rows_of`); the others' predictions are None."""
    device = device_of(model)
    fallback = cut_off_label(data.label_vocab.labels)
    predicted: list[list[str] | None] = [None for _ in data.sentences]
    total, count = 0.0, 0
    order = np.argsort(data.lengths, kind="stable")
    starts = range(0, len(order), data.batch_size)
    for first in tqdm(starts, desc="tag", unit="batch", disable=not progress, leave=False):
        whole = order[first:first + data.batch_size]
        rows, counts = rows_of(shard, len(whole), first)
        chunk = whole[rows]
        b = data.collate(chunk).to(device)
        out = model(b.ids, attention_mask=b.attention_mask)
        if not counts:
            continue
        total, count = total + summed_nll(out.logits, b.labels), count + int((b.labels != IGNORE_INDEX).sum())
        guesses = out.logits.argmax(-1).tolist()  # (B, T)
        for row, index in enumerate(chunk):
            predicted[index] = [data.label_vocab.decode(guesses[row][f]) if f is not None else fallback
                                for f in data.aligned[index].firsts]
    return total, count, predicted


def tag_counts(gold: list[list[str]], predicted: list[list[str]], scheme: str | None) -> list[int]:
    """What the scores are ratios of, so they add up over sentences (and ranks): words tagged right, words, and for
    entity tags the entities (seqeval's `get_entities`) predicted right, predicted, and in the gold."""
    pairs = [(g, p) for gs, ps in zip(gold, predicted, strict=True) for g, p in zip(gs, ps, strict=True)]
    counts = [sum(g == p for g, p in pairs), len(pairs)]
    if scheme is not None:
        from seqeval.metrics.sequence_labeling import get_entities

        entities = [(set(get_entities(gs)), set(get_entities(ps))) for gs, ps in zip(gold, predicted, strict=True)]
        counts += [sum(len(g & p) for g, p in entities), sum(len(p) for _, p in entities),
                   sum(len(g) for g, _ in entities)]
    return counts


def scores_of_counts(counts: Sequence[float]) -> dict[str, float]:
    """Word accuracy, and for entity tags seqeval's entity precision, recall and F1 (CoNLL's, micro-averaged, 0
    where undefined), from `tag_counts` (summed)."""
    words_right, words, *entities = counts
    scores = {"accuracy": words_right / max(words, 1)}
    if entities:
        right, found, real = entities
        scores.update(precision=right / found if found else 0.0, recall=right / real if real else 0.0,
                      f1=2 * right / (found + real) if found + real else 0.0)
    return scores


def tag_scores(gold: list[list[str]], predicted: list[list[str]], scheme: str | None) -> dict[str, float]:
    """Word accuracy, and for entity tags seqeval's entity precision, recall and F1 (CoNLL's, micro-averaged)."""
    return scores_of_counts(tag_counts(gold, predicted, scheme))


def score_tagged(model: nn.Module, data: TaggedData, scheme: str | None, *, progress: bool = False,
                 shard: Shard = ONE_PROCESS) -> dict[str, float]:
    """`tag_predictions` and `tag_scores` over `data`, with the loss: what training and attnkit eval report
    (`shard`: this rank's share of the sentences; the loss and counts are summed over the ranks)."""
    total, count, predicted = tag_predictions(model, data, progress=progress, shard=shard)
    mine = [i for i, tags in enumerate(predicted) if tags is not None]
    counts = tag_counts([data.sentences[i][1] for i in mine], [predicted[i] for i in mine], scheme)
    total, count, *counts = shard.sum(total, count, *counts)
    return {"val_loss": total / max(count, 1), **scores_of_counts(counts)}


# Options, the training task ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TagOptions:
    """What tagging alone reads (`TaskSpec.own_options`): flags of train and eval, --set and --config keys."""

    tag_column: str = "upos"  # .conllu files: the column of tags (upos, xpos, deprel, or a MISC key such as NER)


class TagTask(EpochTask):
    """Token classification; the best checkpoint is the one of highest entity F1 (word accuracy for plain tags)."""

    name = "tag"
    padded = True  # the training plan's attention choice reads it: an attention mask over padded rows
    higher_is_better = True

    def __init__(self, train: TaggedData, val: TaggedData, *, scheme: str | None, word_pieces: WordPieces,
                 frame: Frame = "attnkit") -> None:
        super().__init__(train)
        self.val, self.scheme = val, scheme
        self.metric = "f1" if scheme is not None else "accuracy"
        self.record = {WORD_PIECES: word_pieces, FRAME: frame}  # saved in task.json beside the task's name

    def loss(self, model: nn.Module, batch: TaggedBatch) -> Tensor:
        b = batch.to(device_of(model))
        return model(b.ids, attention_mask=b.attention_mask, labels=b.labels).loss

    def weight(self, batch: TaggedBatch) -> int:
        return int((batch.labels != IGNORE_INDEX).sum())

    def n_tokens(self, batch: TaggedBatch) -> int:
        return int(batch.attention_mask.sum())

    def evaluate(self, model: nn.Module, shard: Shard = ONE_PROCESS) -> dict[str, float]:
        """Loss, word accuracy and entity scores on the validation set; `shard`: this rank's share."""
        return score_tagged(model, self.val, self.scheme, shard=shard)


def tagged(data: Any, seed: int) -> tuple[list[Sentence], list[Sentence]]:
    """The training and validation sentences the data settings name (files: `read_tagged`)."""
    if synthetic_name(data) is not None or not data.data:
        raise InputError("--task tag needs --data FILE... of tagged sentences: CoNLL (a token and its tag per line, "
                         "a blank line between sentences) or .conllu (--tag-column names the column)")
    read = dict(column=data.options.tag_column, encoding_errors=data.encoding_errors)
    train = [s for path in data.data for s in read_tagged(path, **read)]
    if data.val_data:
        return train, [s for path in data.val_data for s in read_tagged(path, **read)]
    return split(train, data.val_fraction, seed)


def checked_scheme(sentences: Sequence[Sentence], where: str) -> str | None:
    """The tags' scheme (BIO, BIOES, or None for plain labels), after checking the sentences keep to it."""
    scheme = tag_scheme({t for _, tags in sentences for t in tags})
    if scheme is not None:
        check_scheme(sentences, scheme, where)
    return scheme


def _make(context: TaskContext) -> tuple[TagTask, list[str]]:
    data = context.data
    train, val = tagged(data, context.seed)
    scheme = checked_scheme(train, ", ".join(data.data))
    vocab = LabelVocab.from_labels((t for _, tags in train for t in tags), order=context.labels)
    unknown = sorted({t for _, tags in val for t in tags} - set(vocab.labels))
    if unknown:
        raise InputError(f"the validation data has tags the training data lacks: {', '.join(unknown)}; add "
                         "sentences with them to the training data")
    if len(vocab) < 2:
        raise InputError(f"the training data holds one tag only, {vocab.labels[0]!r}: a tagger needs two or more")
    batch = dict(batch_size=context.batch_size, seed=context.seed)
    source = context.record or {}  # a tagger resumed or fine-tuned keeps the pieces its model learned from
    word_pieces = word_pieces_of(source, "the run's task.json")
    frame = frame_of(source, "the run's task.json")
    make = dict(label_vocab=vocab, max_len=context.seq_len, word_pieces=word_pieces, frame=frame)
    return TagTask(
        TaggedData.from_sentences(train, context.tokenizer, **make, batch_tokens=data.batch_tokens, **batch),
        TaggedData.from_sentences(val, context.tokenizer, **make, **batch), scheme=scheme,
        word_pieces=word_pieces, frame=frame,
    ), list(vocab.labels)


def _training_text(data: Any, seed: int) -> list[str]:
    return [" ".join(words) for words, _ in tagged(data, seed)[0]]


# attnkit eval -------------------------------------------------------------------------------------------------------
def _report(ctx: EvalContext) -> EvalReport:
    labels = ctx.labels if ctx.labels is not None else [str(i) for i in range(ctx.config.n_classes)]
    vocab = LabelVocab(tuple(labels))
    rows, gold_all, predicted_all = [], [], []
    scheme = tag_scheme(set(labels))
    word_pieces = word_pieces_of(task_record(ctx.run), ctx.run / TASK_FILE)
    frame = frame_of(task_record(ctx.run), ctx.run / TASK_FILE)
    for path in ctx.files:
        check_layout(path, "tagged", encoding_errors=ctx.settings.encoding_errors)
        sentences = read_tagged(path, column=ctx.options.tag_column, encoding_errors=ctx.settings.encoding_errors)
        unknown = sorted({t for _, tags in sentences for t in tags} - set(labels))
        if unknown:
            raise InputError(f"{path} has tags the run does not know: {', '.join(unknown)} (the run's: "
                             f"{', '.join(labels)})")
        if scheme is not None:  # tags that training would refuse are refused here too
            check_scheme(sentences, scheme, str(path))
        data = TaggedData.from_sentences(sentences, ctx.tokenizer, label_vocab=vocab, max_len=ctx.config.max_seq_len,
                                         word_pieces=word_pieces, frame=frame, batch_size=ctx.settings.batch_size)
        total, count, predicted = tag_predictions(ctx.model, data, progress=ctx.progress)
        gold = [tags for _, tags in sentences]
        rows.append({"file": str(path), "sentences": len(sentences), "words": sum(map(len, gold)),
                     "val_loss": total / max(count, 1), **tag_scores(gold, predicted, scheme)})
        gold_all += gold
        predicted_all += predicted
    if len(rows) > 1:
        rows.append({"file": "all", "sentences": len(gold_all), "words": sum(map(len, gold_all)),
                     **tag_scores(gold_all, predicted_all, scheme)})
    details: dict[str, Any] = {"labels": labels, "scheme": scheme}
    notes = []
    if scheme is not None:
        from seqeval.metrics import classification_report

        details["entities"] = classification_report(gold_all, predicted_all, output_dict=True, zero_division=0)
        notes.append(classification_report(gold_all, predicted_all, digits=4, zero_division=0).rstrip())
    columns = ("file", "sentences", "words", "precision", "recall", "f1", "accuracy") if scheme else (
        "file", "sentences", "words", "accuracy")
    return EvalReport("tagging", str(ctx.run), rows, _plain(details), columns=columns, notes=notes)


def _plain(value: Any) -> Any:
    """seqeval's report with numpy numbers made plain, for eval.json."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


# The pipeline method ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaggedWord:
    """One word of a tagged text: its label and the label's probability. `cut_off`: the word lies past the model's
    max_seq_len and was not read; its label is `cut_off_label`'s, with probability 0."""

    word: str
    label: str
    probability: float
    cut_off: bool = False


@torch.inference_mode()
def tag(pipeline: Any, texts: str | Sequence[str] | Sequence[Sequence[str]], *, batch_size: int = 32
        ) -> list[list[TaggedWord]]:
    """Label every word of each text (a string, split at whitespace, or a list of words), `batch_size` texts per
    forward pass. Words beyond the model's max_seq_len pieces are labelled as `tag_predictions` labels them, marked
    `cut_off` (and logged)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r} must be a positive integer")
    texts = text_list(texts, words=True)
    sentences = [text.split() if isinstance(text, str) else list(text) for text in texts]
    results: list[list[TaggedWord]] = []
    fallback = cut_off_label(pipeline.labels)
    word_pieces = word_pieces_of(pipeline.record, "the run's task.json")
    frame = frame_of(pipeline.record, "the run's task.json")
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start:start + batch_size]
        aligned = [align(pipeline.tokenizer, words, None, pipeline.config.max_seq_len, word_pieces, frame)
                   for words in chunk]
        pad_id = pipeline.tokenizer.pad_id if pipeline.tokenizer.pad_id is not None else 0
        # a text of no words framed with nothing (a converted GPT-2 tagger's) has no ids: a pad stands in, no word's
        ids, mask = pad([a.ids or [pad_id] for a in aligned], pad_id, device=pipeline.device)  # (B, T)
        probs = pipeline.model(ids, attention_mask=mask).logits.float().softmax(-1)  # (B, T, n_labels)
        check_outputs(probs, pipeline.model, what=f"texts {start} to {start + len(chunk) - 1}")
        best, where = probs.max(-1)  # (B, T) each
        for row, (words, a) in enumerate(zip(chunk, aligned, strict=True)):
            if None in a.firsts:
                log.warning("text %d: %d of its %d words lie past the model's %d tokens and are not read",
                            start + row, a.firsts.count(None), len(words), pipeline.config.max_seq_len)
            results.append([
                TaggedWord(word, pipeline.labels[int(where[row, f])], float(best[row, f])) if f is not None
                else TaggedWord(word, fallback, 0.0, cut_off=True)
                for word, f in zip(words, a.firsts, strict=True)
            ])
    return results


def cut_off_label(labels: Sequence[str]) -> str:
    """The label a word cut off by max_seq_len gets: `O` (outside any entity), or the first label without one."""
    return "O" if "O" in labels else labels[0]


def conll_words(path: str, encoding_errors: EncodingErrors) -> list[list[str]] | None:
    """The words of each sentence of a file of tagged sentences, or None for a file of texts: one laid out so
    (`layout_of`) and named so (.conll, .conllu) or tagged so (BIO/BIOES tags in its last column), which lines of two
    words apiece between blank lines are not; a file named so too short for its layout to tell (a sentence of one
    word) when it reads as tagged sentences."""
    found = layout_of(path, encoding_errors=encoding_errors)
    named = format_suffix(path) in (".conll", ".conllu")
    if found is None and named:
        try:
            return [words for words, _ in read_tagged(path, column="form", encoding_errors=encoding_errors)]
        except InputError:  # words without tags: lines of text
            return None
    if found is None or found[0] != "tagged":
        return None
    sentences = read_tagged(path, column="form", encoding_errors=encoding_errors)  # words alone: any file has them
    if not named and tag_scheme({tag for _, tags in read_tagged(path, encoding_errors=encoding_errors)
                                 for tag in tags}) is None:
        return None
    return [words for words, _ in sentences]


# The command (attnkit tag) -----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TagSettings(InputSettings):
    """A tagger labels each word of a text (words split at whitespace)."""

    format: Literal["pairs", "conll"] = "pairs"
    """pairs: each text on one line as word/LABEL; conll: a word and its label per line, a blank line after each text
    (an --input CoNLL or .conllu file gives its sentences' words)"""


def run_tag(settings: TagSettings, load: Callable[[Any], Any]) -> int:
    """`attnkit tag`; `load(settings)` loads the run (the command line passes `attnkit.cli.load_pipeline`). An --input
    of tagged sentences gives its sentences' words, not its lines (`conll_words`)."""
    texts: list[Any] = read_inputs(settings)
    if settings.input not in (None, "-"):
        texts = conll_words(settings.input, settings.encoding_errors) or texts
    for words in load(settings).tag(texts, batch_size=settings.batch_size):
        if settings.format == "conll":
            print("".join(f"{w.word}\t{w.label}\n" for w in words))
        else:
            print(" ".join(f"{w.word}/{w.label}" for w in words))
    return 0


TAG = register(TaskSpec(
    name="tag", help="a label per word: named entities (BIO/BIOES), parts of speech (encoder, decoder)",
    seed_draws_validation="without_val_data",
    families=("encoder", "decoder"), head={"encoder_head": "tag", "decoder_head": "tag", "mlm_transform": False},
    make=_make, evaluate_files=_report, method="tag",
    pipeline=tag, labelled=True, training_text=_training_text,
    options=("val_data", "val_fraction", "batch_tokens", "encoding_errors"), own_options=TagOptions,
    default_model=dict(family="encoder", d_model=128, n_layers=2, n_heads=4, d_ff=512, position="learned",
                       norm="layer", norm_position="pre", activation="gelu", max_seq_len=128, dropout=0.1,
                       encoder_head="tag"),
    hf_architectures=(HFClass("BertForTokenClassification", "bert", {"pooler": False}, drops=("bert.pooler", "cls.")),
                      HFClass("GPT2ForTokenClassification", "gpt2"), HFClass("LlamaForTokenClassification", "llama")),
    eval_help="CoNLL or .conllu files: entity precision, recall, F1 (seqeval) and word accuracy",
    eval_options=("batch_size",),
    command=TaskCommand("tag", "label each word of texts with a trained tagger (named entities, parts of speech)",
                        TagSettings, run_tag),
))
