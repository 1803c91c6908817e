"""`attnkit eval`: a trained or converted run scored on the user's own held-out files.

    language model   perplexity with a sliding window, per token, per character and as bits per byte (so models
                     with different tokenizers compare)
    translation      sacreBLEU (cased, detokenized), BLEU on the published lowercased protocol and chrF of the
                     run's translations of a TSV file or two line-aligned files, with the metrics' signatures
    classification   accuracy, macro-F1 and a confusion matrix (table and PNG) on labelled files

Sliding-window perplexity (the fixed-length-model method of Hugging Face's perplexity guide). A model reads at
most `window` tokens, so a long text is scored window by window; each window moves `stride` tokens on and scores
only the targets no earlier window scored, using the tokens before them as context:

    tokens   t0 t1 t2 t3 t4 t5 t6 t7 t8 t9            window 4, stride 2
    window 1 [t0 t1 t2 t3] -> scores t1 t2 t3 t4
    window 2       [t2 t3 t4 t5] -> scores t5 t6     (t4 already scored: context only)
    window 3             [t4 t5 t6 t7] -> scores t7 t8
    window 4                   [t6 t7 t8] -> scores t9

Every token but the first is scored once; a smaller stride gives each more context (stride 1: always a full
window) at more cost; stride = window gives the non-overlapping figure. A language model's own validation loss
during training is that non-overlapping figure.

This module never imports `attnkit.generate` (train/ and generate/ are siblings): translation takes the function
that translates texts as an argument, as `TranslateTask` does; the CLI passes the loaded pipeline's.

`attnkit eval` is `run_eval(EvalSettings(...))`: the settings' fields are the command's flags.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from attnkit.checkpoint import TOKENIZER_DIR, atomic_write, load_config, load_model, read_labels
from attnkit.data.batching import IGNORE_INDEX
from attnkit.data.labelled import LabelledData, LabelVocab, read_labelled
from attnkit.data.pairs import read_parallel, read_tsv_pairs
from attnkit.errors import ConfigError, InputError
from attnkit.models import family_of
from attnkit.textfiles import EncodingErrors, read_text
from attnkit.tokenize import Tokenizer, load_tokenizer
from attnkit.train.bleu import translation_scores
from attnkit.train.confusion import classification_scores, confusion_matrix, confusion_table, plot_confusion
from attnkit.train.job import pick_device
from attnkit.train.trainer import shows_progress

log = logging.getLogger(__name__)

TextTranslator = Callable[[list[str]], list[str]]  # source texts -> translations, in order
LOGITS_BUDGET = 1 << 26  # floats of (B, T, V) logits per forward pass in perplexity (256 MB in fp32)
REPORT_FILE = "eval.json"
CONFUSION_FILE = "confusion.png"


# Sliding-window perplexity -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """Inputs `ids[begin:end]`, targets `ids[begin + 1:end + 1]`, of which the last `n_new` are scored."""

    begin: int
    end: int
    n_new: int


def sliding_windows(n_tokens: int, *, window: int, stride: int) -> list[Window]:
    """The windows that score tokens 1 .. n_tokens - 1 once each (see the module docstring).

    Raises ConfigError unless 1 <= stride <= window, InputError for fewer than 2 tokens.
    """
    if window < 1 or not 1 <= stride <= window:
        raise ConfigError(f"stride={stride} must lie in [1, window={window}]; stride = window scores windows "
                          "that do not overlap")
    if n_tokens < 2:
        raise InputError(f"a text of {n_tokens} token(s) has nothing to predict; perplexity needs at least 2")
    windows, begin, scored = [], 0, 0  # scored: targets 1 .. scored are done
    while scored < n_tokens - 1:
        end = min(begin + window, n_tokens - 1)
        windows.append(Window(begin, end, end - scored))
        scored, begin = end, begin + stride
    return windows


@torch.inference_mode()
def sliding_window_nll(
    model: nn.Module,
    ids: Sequence[int] | Tensor,
    *,
    window: int,
    stride: int,
    batch_size: int = 1,
    progress: bool = False,
) -> float:
    """The summed negative log-likelihood (nats) of tokens 1 .. N-1 of `ids`, scored window by window,
    `batch_size` windows of one length per forward pass."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    device = next(model.parameters()).device
    windows = sliding_windows(len(ids), window=window, stride=stride)
    total = 0.0
    with tqdm(total=len(windows), desc="perplexity", unit="window", disable=not progress, leave=False) as bar:
        for group in _same_length_groups(windows, batch_size):
            x = torch.stack([ids[w.begin : w.end] for w in group]).to(device)  # (B, T)
            y = torch.stack([ids[w.begin + 1 : w.end + 1] for w in group])  # (B, T)
            for row, w in enumerate(group):
                y[row, : y.shape[1] - w.n_new] = IGNORE_INDEX  # context only: scored by an earlier window
            logits = model(x).logits.float()  # (B, T, V)
            total += F.cross_entropy(
                logits.flatten(0, 1), y.flatten().to(device), ignore_index=IGNORE_INDEX, reduction="sum"
            ).item()
            bar.update(len(group))
    return total


def _same_length_groups(windows: list[Window], size: int) -> list[list[Window]]:
    groups: list[list[Window]] = []
    for w in windows:
        if groups and len(groups[-1]) < size and groups[-1][0].end - groups[-1][0].begin == w.end - w.begin:
            groups[-1].append(w)
        else:
            groups.append([w])
    return groups


def perplexity_row(name: str, nll: float, tokens: int, chars: int, n_bytes: int) -> dict[str, Any]:
    """One report row: the summed NLL over `tokens` scored tokens that spell `chars` characters / `n_bytes` bytes."""
    return {
        "file": name, "tokens": tokens, "chars": chars, "bytes": n_bytes,
        "loss": nll / tokens, "ppl": math.exp(min(nll / tokens, 700.0)),
        "char_ppl": math.exp(min(nll / max(chars, 1), 700.0)), "bits_per_byte": nll / max(n_bytes, 1) / math.log(2),
        "nll": nll,
    }


def _scored_text_size(text: str, ids: list[int], tokenizer: Tokenizer) -> tuple[int, int]:
    """Characters and UTF-8 bytes of the text the scored tokens (all but the first) spell."""
    first = tokenizer.decode(ids[:1], skip_special=False)
    return max(len(text) - len(first), 1), max(len(text.encode()) - len(first.encode()), 1)


# The report ---------------------------------------------------------------------------------------------------
@dataclass
class EvalReport:
    """What `evaluate_run` found: one row per file (and an "all" row over several), plus the settings and
    extras of its kind (window and stride; the metrics' signatures; the confusion matrix)."""

    kind: str  # "perplexity" | "translation" | "classification"
    run: str
    rows: list[dict[str, Any]]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "run": self.run, "rows": self.rows, **self.details}

    def table(self) -> str:
        """The rows as an aligned text table (and, for classification, the confusion matrix under it)."""
        columns = {
            "perplexity": ("file", "tokens", "loss", "ppl", "chars", "char_ppl", "bits_per_byte"),
            "translation": ("file", "sentences", "bleu", "bleu_lowercased", "chrf"),
            "classification": ("file", "examples", "accuracy", "macro_f1"),
        }[self.kind]
        cells = [list(columns)] + [[_cell(row[c]) for c in columns] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                 for r in cells]
        if self.kind == "classification":
            lines += ["", confusion_table(self.details["confusion"], self.details["labels"])]
        if self.kind == "translation":
            lines += ["", f"BLEU: {self.details['bleu_signature']}",
                      f"BLEU lowercased (the published Multi30k protocol): {self.details['bleu_lowercased_signature']}",
                      f"chrF: {self.details['chrf_signature']}"]
        return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return str(value)


# Evaluating a run -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalSettings:
    """What `attnkit eval` scores and how; each field is one of its flags.

    Raises:
        ConfigError: on a value out of range, naming the field and a sensible value.
    """

    run: str  # run directory: config.json, model.safetensors, tokenizer/ (a converted Hugging Face run too)
    data: tuple[str, ...]  # text files (LM), a TSV or two line-aligned files (translator), labelled files (classifier)
    window: int | None = None  # perplexity: tokens the model reads at once; None: its max_seq_len
    stride: int | None = None  # perplexity: tokens each window moves on; None: half the window; = window: no overlap
    batch_size: int = 32  # classification and translation: examples per forward pass
    beam_size: int = 1  # translation: 1 is greedy
    average_last: int = 0  # > 0: score the mean of the run's last N checkpoints (written to RUN/average-last-N)
    out: str | None = None  # directory for eval.json (and confusion.png); None: RUN/eval
    device: str | None = None  # cpu, cuda or cuda:N; None: CUDA when available, else the CPU
    encoding_errors: EncodingErrors = "strict"  # strict: a file that is not UTF-8 is an error; replace: U+FFFD
    progress: bool | None = None  # progress bars on long files; None: when stderr is a terminal
    bad_labels: Literal["error", "skip"] = "error"
    """classification: lines whose label is not among the run's (missing, mistyped): error | skip (left out, counted)"""
    int8: bool = False  # score the model with int8 weights, as generate --int8 runs it
    int8_dynamic: bool = False  # score it with int8 weights and activations, as generate --int8-dynamic runs it (CPU)

    def __post_init__(self) -> None:
        if self.int8 and self.int8_dynamic:
            raise InputError("--int8 and --int8-dynamic are two forms of int8 weights; give one")
        if not self.data:
            raise InputError("eval needs --data FILE...: text files (language model), a TSV file or two line-aligned "
                             "files (translation), or labelled files (classifier)")
        for name in ("window", "stride"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}={value!r} must be a positive number of tokens (or unset)")
        for name in ("batch_size", "beam_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if isinstance(self.average_last, bool) or not isinstance(self.average_last, int) or self.average_last < 0:
            raise ConfigError(f"average_last={self.average_last!r} must be a number of checkpoints (0: none)")
        if self.encoding_errors not in ("strict", "replace"):
            raise ConfigError(f"encoding_errors={self.encoding_errors!r}: choose strict or replace")
        if self.bad_labels not in ("error", "skip"):
            raise ConfigError(f"bad_labels={self.bad_labels!r}: choose error or skip")


    @property
    def quantize(self) -> str | None:
        """The `quantize` argument of `attnkit.load` these flags stand for."""
        return "int8" if self.int8 else "int8-dynamic" if self.int8_dynamic else None


def run_eval(
    settings: EvalSettings,
    *,
    translate: TextTranslator | None = None,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
) -> EvalReport:
    """`attnkit eval`: `evaluate_run` with `settings` (see it for `translate`, `prepare` and what is raised)."""
    return evaluate_run(
        settings.run, list(settings.data), device=pick_device(settings.device), window=settings.window,
        stride=settings.stride, batch_size=settings.batch_size, translate=translate, out_dir=settings.out,
        encoding_errors=settings.encoding_errors, bad_labels=settings.bad_labels,
        progress=shows_progress(settings.progress), prepare=prepare,
        details={"quantize": settings.quantize} if settings.quantize else None,
    )


_KIND_FOR_TASK = {"lm": "perplexity", "translate": "translation", "classify": "classification"}


def evaluate_run(
    run_dir: str | Path,
    data: Sequence[str | Path],
    *,
    device: torch.device | str = "cpu",
    window: int | None = None,
    stride: int | None = None,
    batch_size: int = 32,
    translate: TextTranslator | None = None,
    out_dir: str | Path | None = None,
    encoding_errors: EncodingErrors = "strict",
    bad_labels: Literal["error", "skip"] = "error",
    progress: bool = False,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    details: dict[str, Any] | None = None,
) -> EvalReport:
    """Score the run in `run_dir` on the files `data`, by what the model does (module docstring).

    window / stride: perplexity only; default the model's max_seq_len and half of it.
    translate: the function that translates texts (needed for an encoder-decoder run).
    prepare: applied to the loaded model before scoring (the CLI passes int8 quantization); details: added to
        the report (e.g. {"quantize": "int8"}) and to eval.json.
    out_dir: where eval.json (and confusion.png) go; default `run_dir/eval`.
    bad_labels: classification: a line whose label is not among the run's is an error, or "skip"ped.
    Raises InputError / ConfigError / CheckpointError naming what is wrong and how to fix it.
    """
    run_dir = Path(run_dir)
    if not data:
        raise InputError("eval needs --data FILE...: text files (language model), a TSV file or two line-aligned "
                         "files (translation), or labelled files (classifier)")
    config = load_config(run_dir)
    kind = next((_KIND_FOR_TASK[task] for task in family_of(config).tasks if task in _KIND_FOR_TASK), None)
    head = getattr(config, "encoder_head", "classify")  # an encoder scores as a classifier with a classifier head
    if kind is None or head != "classify":
        raise InputError(
            f"eval scores language models, translators and classifiers; {run_dir} holds a {config.family} "
            f"with head {head!r}. Fine-tune it first, e.g. attnkit train --task classify "
            f"--init-from {run_dir} ..."
        )
    tokenizer = _run_tokenizer(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "eval"
    if kind == "translation":
        if translate is None:
            raise ConfigError("evaluating a translation run needs translate= (the CLI passes the loaded pipeline's)")
        report = _translation_report(run_dir, data, translate, encoding_errors)
    else:
        model, _ = load_model(run_dir, device=device)
        model = prepare(model) if prepare is not None else model
        if kind == "perplexity":
            window = window or config.max_seq_len
            report = _perplexity_report(run_dir, data, model, tokenizer, window=window,
                                        stride=stride or max(window // 2, 1), encoding_errors=encoding_errors,
                                        progress=progress)
        else:
            report = _classification_report(run_dir, data, model, tokenizer, batch_size=batch_size,
                                             max_len=config.max_seq_len, encoding_errors=encoding_errors,
                                             bad_labels=bad_labels, progress=progress, png=out_dir / CONFUSION_FILE)
    report.details.update(details or {})
    atomic_write(out_dir / REPORT_FILE, json.dumps(report.to_dict(), indent=1) + "\n")
    report.details["json"] = str(out_dir / REPORT_FILE)
    return report


def _run_tokenizer(run_dir: Path) -> Tokenizer:
    if not (run_dir / TOKENIZER_DIR).is_dir():
        raise InputError(f"{run_dir} has no tokenizer/ directory, so its model cannot read text files; save the "
                         "tokenizer it was trained with there")
    return load_tokenizer(run_dir / TOKENIZER_DIR)


def _perplexity_report(run_dir, data, model, tokenizer, *, window, stride, encoding_errors, progress) -> EvalReport:
    rows = []
    for path in data:
        text = read_text(path, errors=encoding_errors)
        ids = tokenizer.encode(text)
        nll = sliding_window_nll(model, ids, window=window, stride=stride, progress=progress,
                                 batch_size=max(1, LOGITS_BUDGET // (window * tokenizer.vocab_size)))
        chars, n_bytes = _scored_text_size(text, ids, tokenizer)
        rows.append(perplexity_row(str(path), nll, len(ids) - 1, chars, n_bytes))
    if len(rows) > 1:
        rows.append(perplexity_row("all", *(sum(r[k] for r in rows) for k in ("nll", "tokens", "chars", "bytes"))))
    return EvalReport("perplexity", str(run_dir), rows, {"window": window, "stride": stride})


def _translation_report(run_dir, data, translate: TextTranslator, encoding_errors) -> EvalReport:
    if len(data) == 1:
        pairs = read_tsv_pairs(data[0], encoding_errors=encoding_errors)
    elif len(data) == 2:
        pairs = read_parallel(data[0], data[1], encoding_errors=encoding_errors)
    else:
        raise InputError(f"translation eval reads one TSV file (source<TAB>target) or two line-aligned files "
                         f"(source first); got {len(data)} files")
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    scores = translation_scores(translate(sources), references)
    row = {"file": " + ".join(map(str, data)), "sentences": len(pairs), "bleu": scores["bleu"],
           "bleu_lowercased": scores["bleu_lowercased"], "chrf": scores["chrf"]}
    details = {k: scores[k] for k in ("bleu_signature", "bleu_lowercased_signature", "chrf_signature")}
    return EvalReport("translation", str(run_dir), [row], details)


def _classification_report(run_dir, data, model, tokenizer, *, batch_size, max_len, encoding_errors, bad_labels,
                           progress, png: Path) -> EvalReport:
    labels = _run_labels(run_dir, model)
    vocab = LabelVocab(tuple(labels))
    rows, total = [], [[0] * len(labels) for _ in labels]
    for path in data:
        examples = _labelled_examples(path, vocab, encoding_errors, bad_labels)
        data_set = LabelledData.from_examples(examples, tokenizer, label_vocab=vocab, max_len=max_len,
                                              batch_size=batch_size)
        truth, guesses = _predict(model, data_set, progress=progress)
        matrix = confusion_matrix(truth, guesses, len(labels))
        rows.append({"file": str(path), **classification_scores(matrix)})
        total = [[a + b for a, b in zip(r, s, strict=True)] for r, s in zip(total, matrix, strict=True)]
    if len(rows) > 1:
        rows.append({"file": "all", **classification_scores(total)})
    plot_confusion(total, labels, png, title=f"{Path(run_dir).name}: {rows[-1]['examples']} examples")
    return EvalReport("classification", str(run_dir), rows,
                      {"labels": labels, "confusion": total, "confusion_png": str(png)})


@torch.inference_mode()
def _predict(model: nn.Module, data: LabelledData, *, progress: bool) -> tuple[list[int], list[int]]:
    device = next(model.parameters()).device
    truth, guesses = [], []
    n_batches = -(-len(data) // data.batch_size)
    for batch in tqdm(data.eval_batches(), total=n_batches, desc="classify", unit="batch", disable=not progress,
                      leave=False):
        b = batch.to(device)
        guesses += model(b.ids, attention_mask=b.mask).logits.argmax(-1).tolist()
        truth += b.labels.tolist()
    return truth, guesses


def _run_labels(run_dir: Path, model: nn.Module) -> list[str]:
    labels = read_labels(run_dir)
    return labels if labels is not None else [str(i) for i in range(model.classifier.out_features)]


def _labelled_examples(path, vocab: LabelVocab, encoding_errors, bad_labels) -> list[tuple[str, str]]:
    """The file's (text, label) examples; a label the run does not know is a bad label (`read_labelled`'s `known`),
    as is every label of unlabelled text."""
    try:
        return read_labelled(path, encoding_errors=encoding_errors, bad_labels=bad_labels, known=vocab.labels)
    except InputError as err:
        raise InputError(f"{err}. eval of a classifier needs labelled examples, not unlabelled text: '<label> <text>' "
                         f"lines or a CSV/TSV file with text and label columns, the labels being the run's "
                         f"({', '.join(vocab.labels)})") from None
