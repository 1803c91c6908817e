"""Sequence classification (`classify`: an encoder with a classifier head): one label per text.

Data: a `<label> <text>` file (SST-2), a CSV/TSV file with text and label columns, or JSON Lines with text and
label keys; `synthetic:ab`.
One loop, `predict_labels`, scores the validation set during training and labelled files in `attnkit eval`:
loss and accuracy, and for `attnkit eval` macro-F1 and a confusion matrix (table and PNG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from attnkit.data import LabelledBatch, LabelledData, LabelVocab, read_labelled
from attnkit.data.labelled import read_texts
from attnkit.errors import InputError
from attnkit.run_settings import InputSettings, read_inputs
from attnkit.tasks.common import (
    ONE_PROCESS,
    EpochTask,
    Shard,
    device_of,
    rows_of,
    split,
    summed_nll,
    synthetic_split,
    take_rows,
)
from attnkit.tasks.confusion import classification_scores, confusion_matrix, confusion_table, plot_confusion
from attnkit.tasks.layouts import check_layout
from attnkit.tasks.registry import EvalContext, HFClass, TaskCommand, TaskContext, TaskSpec, register
from attnkit.tasks.report import EvalReport

CONFUSION_FILE = "confusion.png"


@torch.inference_mode()
def predict_labels(model: nn.Module, data: LabelledData, *, progress: bool = False, shard: Shard = ONE_PROCESS
                   ) -> tuple[float, list[int], list[int]]:
    """Every example of `data` once (`shard`: this rank's examples of each batch, `rows_of`): the summed loss, the
    true label ids and the predicted ones."""
    device = device_of(model)
    total, truth, guesses, first = 0.0, [], [], 0  # first: the index of the batch's first example
    n_batches = -(-len(data) // data.batch_size)
    for batch in tqdm(data.eval_batches(), total=n_batches, desc="classify", unit="batch", disable=not progress,
                      leave=False):
        rows, counts = rows_of(shard, len(batch.labels), first)
        first += len(batch.labels)
        b = take_rows(batch, rows).to(device)
        out = model(b.ids, attention_mask=b.attention_mask)
        if counts:
            total += summed_nll(out.logits, b.labels)
            guesses += out.logits.argmax(-1).tolist()
            truth += b.labels.tolist()
    return total, truth, guesses


class ClassifyTask(EpochTask):
    """Sequence classification; scored by accuracy on the validation set."""

    name = "classify"
    padded = True  # the training plan's attention choice reads it: an attention mask over padded rows
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, train: LabelledData, val: LabelledData) -> None:
        super().__init__(train)
        self.val = val

    def loss(self, model: nn.Module, batch: LabelledBatch) -> Tensor:
        b = batch.to(device_of(model))
        return model(b.ids, attention_mask=b.attention_mask, labels=b.labels).loss

    def weight(self, batch: LabelledBatch) -> int:
        return len(batch.labels)

    def n_tokens(self, batch: LabelledBatch) -> int:
        return int(batch.attention_mask.sum())

    def evaluate(self, model: nn.Module, shard: Shard = ONE_PROCESS) -> dict[str, float]:
        """Loss and accuracy on the validation set; `shard`: this rank's share (sums and counts added up)."""
        total, truth, guesses = predict_labels(model, self.val, shard=shard)
        total, correct, count = shard.sum(total, sum(map(int.__eq__, truth, guesses)), len(truth))
        return {"val_loss": total / count, "accuracy": correct / count}


def labelled(data: Any, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The training and validation (text, label) examples the data settings name."""
    generated = synthetic_split(data, seed)
    if generated is not None:
        train, val = generated
        return train.labelled(), val.labelled()
    if len(data.data) != 1:
        raise InputError("--task classify needs --data FILE (a '<label> <text>' file, CSV/TSV with a header, or "
                         ".jsonl)")
    read = dict(encoding_errors=data.encoding_errors, bad_labels=data.bad_labels)
    train = read_labelled(data.data[0], **read)
    if data.val_data:
        known = LabelVocab.from_labels(label for _, label in train).labels
        return train, [e for path in data.val_data for e in read_labelled(path, **read, known=known)]
    return split(train, data.val_fraction, seed)


def _make(context: TaskContext) -> tuple[ClassifyTask, list[str]]:
    data = context.data
    train, val = labelled(data, context.seed)
    vocab = LabelVocab.from_labels((label for _, label in train), order=context.labels)
    if len(vocab) < 2:
        raise InputError(f"the training data ({', '.join(data.data)}) holds one class only, {vocab.labels[0]!r}: a "
                         f"classifier needs examples of two classes or more")
    batch = dict(batch_size=context.batch_size, seed=context.seed)
    return ClassifyTask(
        LabelledData.from_examples(train, context.tokenizer, label_vocab=vocab, max_len=context.seq_len,
                                   batch_tokens=data.batch_tokens, **batch),
        LabelledData.from_examples(val, context.tokenizer, label_vocab=vocab, max_len=context.seq_len, **batch),
    ), list(vocab.labels)


def _training_text(data: Any, seed: int) -> list[str]:
    return [text for text, _ in labelled(data, seed)[0]]


def _report(ctx: EvalContext) -> EvalReport:
    labels = ctx.labels if ctx.labels is not None else [str(i) for i in range(ctx.config.n_classes)]
    vocab = LabelVocab(tuple(labels))
    rows, total = [], [[0] * len(labels) for _ in labels]
    for path in ctx.files:
        check_layout(path, "labelled", encoding_errors=ctx.settings.encoding_errors)
        examples = _labelled_examples(path, vocab, ctx.settings.encoding_errors, ctx.settings.bad_labels)
        data = LabelledData.from_examples(examples, ctx.tokenizer, label_vocab=vocab, max_len=ctx.config.max_seq_len,
                                          batch_size=ctx.settings.batch_size)
        loss, truth, guesses = predict_labels(ctx.model, data, progress=ctx.progress)
        matrix = confusion_matrix(truth, guesses, len(labels))
        rows.append({"file": str(path), **classification_scores(matrix), "val_loss": loss / len(truth)})
        total = [[a + b for a, b in zip(r, s, strict=True)] for r, s in zip(total, matrix, strict=True)]
    if len(rows) > 1:
        rows.append({"file": "all", **classification_scores(total)})
    png = ctx.out / CONFUSION_FILE
    plot_confusion(total, labels, png, title=f"{Path(ctx.run).name}: {rows[-1]['examples']} examples")
    return EvalReport("classification", str(ctx.run), rows,
                      {"labels": labels, "confusion": total, "confusion_png": str(png)},
                      columns=("file", "examples", "accuracy", "macro_f1"), notes=[confusion_table(total, labels)])


def _labelled_examples(path, vocab: LabelVocab, encoding_errors, bad_labels) -> list[tuple[str, str]]:
    """The file's (text, label) examples; a label the run does not know is a bad label (`read_labelled`'s `known`),
    as is every label of unlabelled text."""
    try:
        return read_labelled(path, encoding_errors=encoding_errors, bad_labels=bad_labels, known=vocab.labels)
    except InputError as err:
        raise InputError(f"{err}. eval of a classifier needs labelled examples, not unlabelled text: '<label> <text>' "
                         f"lines, a CSV/TSV file with text and label columns or a .jsonl file, the labels being the "
                         f"run's ({', '.join(vocab.labels)})") from None


# The command (attnkit classify) ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ClassifySettings(InputSettings):
    """A classifier decodes nothing: the texts and the load options, no int8 weights or compilation."""


def run_classify(settings: ClassifySettings, load: Callable[[Any], Any]) -> int:
    """`attnkit classify`; `load(settings)` loads the run (the command line passes `attnkit.cli.load_pipeline`). An
    --input CSV, TSV or JSON Lines file gives the texts of its text column (`read_texts`), any other its lines."""
    texts = read_inputs(settings)  # the texts' file checked before the model loads
    column = read_texts(settings.input, encoding_errors=settings.encoding_errors) if settings.input not in (
        None, "-") else None
    if column == []:
        raise InputError(f"{settings.input} holds no texts below its header: add a line for each text")
    if column is not None:
        texts = column
    for result in load(settings).classify(texts, batch_size=settings.batch_size):
        print(f"{result.label}\t{result.probability:.4f}")
    return 0


CLASSIFY = register(TaskSpec(
    name="classify", help="a label per text (encoder)", families=("encoder",),
    seed_draws_validation="without_val_data",
    head={"encoder_head": "classify", "mlm_transform": False}, make=_make, evaluate_files=_report,
    method="classify", labelled=True, training_text=_training_text,
    options=("val_data", "val_fraction", "batch_tokens", "encoding_errors", "bad_labels"),
    default_model=dict(family="encoder", d_model=128, n_layers=2, n_heads=4, d_ff=512, position="learned",
                       norm="layer", norm_position="pre", activation="gelu", max_seq_len=128, dropout=0.1,
                       encoder_head="classify", pooling="mean"),
    hf_architectures=(HFClass("BertForSequenceClassification", "bert", {"pooler": True}),),
    eval_help="labelled files ('<label> <text>' lines, CSV/TSV, JSONL): accuracy, macro-F1, confusion matrix",
    eval_options=("batch_size", "bad_labels"),
    command=TaskCommand("classify", "label texts with a trained encoder classifier", ClassifySettings, run_classify),
))
