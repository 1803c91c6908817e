"""Language modelling (`lm`: next token, decoders) and masked language modelling (`mlm`: BERT's pre-training).

    task  batch                        loss (inside the model)          evaluation (training and attnkit eval)
    lm    random windows of a stream   next-token cross-entropy         loss and perplexity, window by window
          (--pack: random rows of whole documents, a document mask; `data/packing.py`)
    mlm   random windows, 15% masked   cross-entropy at masked tokens   loss and accuracy at masked tokens

Both read a token stream: text files, folders or globs (none: the Python standard library's source), validated on
its last `val_fraction`. One evaluation loop serves training and `attnkit eval`: `sliding_window_nll` for `lm`
(training scores its validation split with windows that do not overlap, stride = window; `attnkit eval --stride`
may give each token more context), `masked_lm_scores` for `mlm` (each window masked from a generator seeded by the
run's seed and the window's index, so the figures compare across evaluations, and with `attnkit eval` whatever its
batch size).

Sliding-window perplexity (the fixed-length-model method of Hugging Face's perplexity guide). A model reads at
most `window` tokens, so a long text is scored window by window; each window moves `stride` tokens on and scores
only the targets no earlier window scored, using the tokens before them as context:

    tokens   t0 t1 t2 t3 t4 t5 t6 t7 t8 t9            window 4, stride 2
    window 1 [t0 t1 t2 t3] -> scores t1 t2 t3 t4
    window 2       [t2 t3 t4 t5] -> scores t5 t6     (t4 already scored: context only)
    window 3             [t4 t5 t6 t7] -> scores t7 t8
    window 4                   [t6 t7 t8] -> scores t9

Every token but the first is scored once; a smaller stride gives each more context (stride 1: always a full
window) at more cost; stride = window gives the non-overlapping figure.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from attnkit.chat_format import ChatTemplate
from attnkit.data import IGNORE_INDEX, LMData, make_task
from attnkit.data.corpus import resolve_files
from attnkit.data.labelled import frame_ids
from attnkit.data.lm import token_cache
from attnkit.data.masking import mask_tokens
from attnkit.data.packing import PackedBatch, PackMode, document_ends, pack_rows, pieces
from attnkit.errors import ConfigError, InputError
from attnkit.grammars import lark_grammar, regex_grammar
from attnkit.run_settings import (
    API_ONLY_BESIDE_BEAMS,
    API_ONLY_BESIDE_DRAFT,
    NOT_BESIDE_BEAMS,
    NOT_BESIDE_DRAFT,
    SAMPLED_BEAMS_TAKE,
    DecodeSettings,
    InputSettings,
    beams_asked,
    check_beams_fit_context,
    check_draft_fits_context,
    check_prompt_bytes,
    check_search,
    draft_tokens_flag,
    read_inputs,
    read_stdin,
    refuse_beside_beams,
    refuse_beside_draft,
    text_list,
)
from attnkit.tasks import common
from attnkit.tasks.best_of import best_of_n, check_best_of
from attnkit.tasks.common import (
    ONE_PROCESS,
    Shard,
    check_outputs,
    decode_tensor,
    device_of,
    encode_tensor,
    rows_of,
    summed_nll,
    synthetic_name,
)
from attnkit.tasks.reading import FRAME
from attnkit.tasks.registry import EvalContext, HFClass, TaskCommand, TaskContext, TaskSpec, register
from attnkit.tasks.report import EvalReport
from attnkit.textfiles import EncodingErrors, read_text
from attnkit.tokenize import SPECIAL_ROLES, Tokenizer

log = logging.getLogger(__name__)

DEFAULT_STDLIB_BYTES = 3_000_000  # the default corpus: enough Python for a few minutes of CPU training
LOGITS_BUDGET = 1 << 26  # floats of (B, T, V) logits per forward pass in perplexity (256 MB in fp32)
STREAM_OPTIONS = ("max_bytes", "val_fraction", "eval_batches", "encoding_errors")


# Sliding-window perplexity: the one loop of training's and attnkit eval's lm scores -----------------------------
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
    ids: Sequence[int] | Tensor | np.ndarray,
    *,
    window: int,
    stride: int,
    batch_size: int = 1,
    progress: bool = False,
    shard: Shard = ONE_PROCESS,
) -> float:
    """The summed negative log-likelihood (nats) of tokens 1 .. N-1 of `ids`, scored window by window,
    `batch_size` windows of one length per forward pass; with several ranks, each scores its windows of every
    such batch (`rows_of`) and the sums are added up over the ranks."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64) if isinstance(ids, np.ndarray) else ids, dtype=torch.int64)
    device = device_of(model)
    windows = sliding_windows(len(ids), window=window, stride=stride)
    total, first = 0.0, 0  # first: the index of the group's first window
    with tqdm(total=len(windows), desc="perplexity", unit="window", disable=not progress, leave=False) as bar:
        for whole in _same_length_groups(windows, batch_size):
            rows, counts = rows_of(shard, len(whole), first)
            group, first = [whole[r] for r in rows], first + len(whole)
            x = torch.stack([ids[w.begin : w.end] for w in group]).to(device)  # (B, T)
            y = torch.stack([ids[w.begin + 1 : w.end + 1] for w in group])  # (B, T)
            for row, w in enumerate(group):
                y[row, : y.shape[1] - w.n_new] = IGNORE_INDEX  # context only: scored by an earlier window
            logits = model(x).logits.float()  # (B, T, V)
            if counts:
                total += F.cross_entropy(
                    logits.flatten(0, 1), y.flatten().to(device), ignore_index=IGNORE_INDEX, reduction="sum"
                ).item()
            bar.update(len(whole))
    return shard.sum(total)[0]


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


# The training tasks ---------------------------------------------------------------------------------------------
class LMTask:
    """Language modelling: windows of `seq_len + 1` tokens drawn at random positions (nanoGPT's sampler)."""

    name = "lm"
    metric = "val_loss"
    higher_is_better = False

    def __init__(self, data: LMData, *, batch_size: int, seq_len: int, seed: int, eval_batches: int = 50) -> None:
        self.data, self.batch_size, self.seq_len, self.eval_batches = data, batch_size, seq_len, eval_batches
        self.generator = torch.Generator().manual_seed(seed)
        data.check_windows(self.window)  # before training starts, not at the first batch or evaluation

    @property
    def window(self) -> int:
        """Tokens of a window drawn from the stream (its targets are the window one token on)."""
        return self.seq_len

    def next_batch(self) -> tuple[Tensor, Tensor]:
        return self.data.sample_batch("train", self.batch_size, self.seq_len, self.generator)  # (B, T), (B, T)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = (t.to(device_of(model)) for t in batch)
        return model(x, labels=y, return_logits=False).loss  # chunked loss: no (B, T, V) logits kept

    def weight(self, batch: tuple[Tensor, Tensor]) -> int:
        return batch[1].numel()

    def n_tokens(self, batch: tuple[Tensor, Tensor]) -> int:
        return batch[0].numel()

    def val_ids(self) -> np.ndarray:
        """The validation tokens an evaluation scores: the split's first `eval_batches` batches of windows."""
        return np.asarray(self.data.val[: self.eval_batches * self.batch_size * self.seq_len + 1], dtype=np.int64)

    def evaluate(self, model: nn.Module, shard: Shard = ONE_PROCESS) -> dict[str, float]:
        """Mean next-token loss over `val_ids()` in windows that do not overlap; perplexity = e^loss. `shard`: this
        rank's share of the windows (the loss is summed over the ranks)."""
        ids = self.val_ids()
        loss = sliding_window_nll(model, ids, window=self.seq_len, stride=self.seq_len,
                                  batch_size=self.batch_size, shard=shard) / (len(ids) - 1)
        return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}

    def prompt_ids(self, n_tokens: int = 24) -> list[int]:
        """The first tokens of the validation split: a prompt for a sample of generated text, at most half a training
        window (a model of a short context reads it whole and has room to continue)."""
        return [int(i) for i in self.data.val[:min(n_tokens, max(1, self.seq_len // 2))]]

    def data_state(self) -> dict[str, Any]:
        """The window sampler's generator, and whether the stream puts BOS at each file's start (`bos_first`)."""
        return {"generator": encode_tensor(self.generator.get_state()), "bos_first": self.data.bos_first}

    def load_data_state(self, state: dict[str, Any]) -> None:
        """Resume the sampler; a warning where the run's stream was built without the BOS it has now (a converted
        Llama's run trained before each file was started with BOS): its windows are not the ones it trained on."""
        self.generator.set_state(decode_tensor(state["generator"]))
        if self.data.bos_first and not state.get("bos_first", False):
            log.warning("this run's training data was tokenized without BOS at the start of each file, where its "
                        "tokenizer starts every text with one; it is tokenized with it now, as the model is prompted, "
                        "so the resumed run's windows differ from those it trained on")


@dataclass(frozen=True)
class LMOptions:
    """What next-token training alone reads (`TaskSpec.own_options`)."""

    pack: PackMode = field(default="off", metadata={"const": "files"})
    """training: files (bare --pack): rows packed with whole documents (the corpus's files) and a document mask, so
    no token attends across documents and positions restart at each, instead of windows that run across them; lines:
    each line a document; off: random windows of the stream. Evaluation reads the stream window by window either way"""


class PackedLMTask(LMTask):
    """Language modelling on packed rows (`data/packing.py`): random rows of the training split's documents, each
    position attending within its own document. Evaluation is the stream's, window by window, as without packing."""

    packed = True  # the training plan's attention choice reads it: a document mask in every batch

    def __init__(self, data: LMData, *, tokenizer: Tokenizer, pack: PackMode, batch_size: int, seq_len: int,
                 seed: int, eval_batches: int = 50) -> None:
        super().__init__(data, batch_size=batch_size, seq_len=seq_len, seed=seed, eval_batches=eval_batches)
        train = np.asarray(data.train)
        self.rows = pack_rows(train, pieces(document_ends(train, tokenizer, pack), seq_len), seq_len)
        if len(self.rows.labels) == 0:
            raise InputError("--pack found no document of two tokens or more in the training split: give more text")

    def next_batch(self) -> PackedBatch:
        picks = torch.randint(len(self.rows.labels), (self.batch_size,), generator=self.generator).numpy()
        return self.rows.batch(picks)  # (B, T) each

    def loss(self, model: nn.Module, batch: PackedBatch) -> Tensor:
        device = device_of(model)
        return model(batch.input_ids.to(device), labels=batch.labels.to(device),
                     position_ids=batch.position_ids.to(device), document_ids=batch.document_ids.to(device),
                     return_logits=False).loss

    def weight(self, batch: PackedBatch) -> int:
        return int((batch.labels != IGNORE_INDEX).sum())

    def n_tokens(self, batch: PackedBatch) -> int:
        """The real tokens (padding not counted), so tokens/s compares with unpacked training."""
        return self.weight(batch)


class MaskedWindows:
    """Windows of a token stream framed as `CLS tokens SEP` (or `BOS tokens EOS`) and masked as BERT masks them
    (`attnkit.data.masking`)."""

    def __init__(self, tokenizer: Tokenizer, seq_len: int) -> None:
        if seq_len < 3:
            raise ConfigError(f"--task mlm needs seq_len >= 3 (CLS, a token, SEP); got {seq_len}")
        if tokenizer.mask_id is None:
            raise ConfigError("--task mlm needs a tokenizer with a mask token; train one with --tokenizer bpe or char")
        try:  # framed as a classifier's text is, which a fine-tuned encoder reads (`frame_ids`)
            (self.first,), (self.last,) = frame_ids(tokenizer)
        except InputError as missing:
            raise ConfigError(f"--task mlm frames its windows as CLS ... SEP (or BOS ... EOS): {missing}") from None
        self.window = seq_len - 2  # the stream's tokens in a window: seq_len less the framing
        self.masking = dict(mask_id=tokenizer.mask_id, vocab_size=tokenizer.vocab_size,
                            special_ids={i for role in SPECIAL_ROLES if (i := tokenizer.token_id(role)) is not None})

    def __call__(self, windows: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """(B, window) stream tokens -> inputs (B, T), labels (B, T) (the original id where masked, else -100)."""
        b = windows.shape[0]
        ids = torch.cat([torch.full((b, 1), self.first), windows, torch.full((b, 1), self.last)], dim=1)  # (B, T)
        return mask_tokens(ids, generator=generator, **self.masking)


@torch.inference_mode()
def masked_lm_scores(model: nn.Module, batches: Iterator[tuple[Tensor, Tensor]],
                     shard: Shard = ONE_PROCESS) -> dict[str, float]:
    """Loss, perplexity and accuracy at the masked tokens of `batches` of (inputs, labels); with several ranks, each
    scores its windows of every batch (`rows_of`) and the loss sums and counts are added up over the ranks."""
    total, correct, count, first = 0.0, 0, 0, 0  # first: the index of the batch's first window
    device = device_of(model)
    for whole in batches:
        rows, counts = rows_of(shard, len(whole[0]), first)
        first += len(whole[0])
        inputs, labels = (t[rows].to(device) for t in whole)  # (B, T) each
        out = model(inputs)
        masked = labels != IGNORE_INDEX
        if counts and masked.any():
            total += summed_nll(out.logits, labels)
            correct += int((out.logits.argmax(-1)[masked] == labels[masked]).sum())
            count += int(masked.sum())
    total, correct, count = shard.sum(total, correct, count)
    if count == 0:
        raise InputError("no token was masked: the text is too short to score a masked language model")
    return {"val_loss": total / count, "val_ppl": math.exp(min(total / count, 50.0)), "accuracy": correct / count}


def masked_batches(data: LMData, masking: MaskedWindows, *, batch_size: int, seed: int,
                   max_batches: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """The validation split's windows in order, each masked from a generator of its own seeded with `seed` and its
    index, so the masks do not depend on how the windows are batched."""
    index = 0
    for windows, _ in data.iter_eval_batches("val", batch_size=batch_size, seq_len=masking.window,
                                             max_batches=max_batches):
        rows = [masking(window[None], torch.Generator().manual_seed(seed * 1_000_003 + index + i))
                for i, window in enumerate(windows)]
        index += len(rows)
        yield torch.cat([inputs for inputs, _ in rows]), torch.cat([labels for _, labels in rows])  # (B, T) each


class MLMTask(LMTask):
    """Masked language modelling (BERT): windows masked afresh each batch from the task's generator, which also
    draws the windows, so a resumed run masks the same tokens (the generator's state is the data state)."""

    name = "mlm"

    def __init__(
        self, data: LMData, *, tokenizer: Tokenizer, batch_size: int, seq_len: int, seed: int, eval_batches: int = 50
    ) -> None:
        self.masking = MaskedWindows(tokenizer, seq_len)
        super().__init__(data, batch_size=batch_size, seq_len=seq_len, seed=seed, eval_batches=eval_batches)
        self.seed = seed
        self.record = {FRAME: "attnkit"}  # saved in task.json: the windows are framed by `frame_ids`

    @property
    def window(self) -> int:
        return self.masking.window

    def next_batch(self) -> tuple[Tensor, Tensor]:
        windows, _ = self.data.sample_batch("train", self.batch_size, self.window, self.generator)
        return self.masking(windows, self.generator)  # inputs (B, T), labels (B, T)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, labels = (t.to(device_of(model)) for t in batch)
        return model(inputs, labels=labels).loss

    def weight(self, batch: tuple[Tensor, Tensor]) -> int:
        return int((batch[1] != IGNORE_INDEX).sum())

    def evaluate(self, model: nn.Module, shard: Shard = ONE_PROCESS) -> dict[str, float]:
        """Loss and accuracy at the masked tokens of (up to `eval_batches` batches of) the validation split;
        `shard`: this rank's share of the windows."""
        return masked_lm_scores(model, masked_batches(self.data, self.masking, batch_size=self.batch_size,
                                                      seed=self.seed, max_batches=self.eval_batches), shard)


# Reading the stream ---------------------------------------------------------------------------------------------
def stream_files(data: Any) -> list[Path]:
    """The text files of a stream task's data settings (none given: the standard library's source)."""
    max_bytes = data.max_bytes if data.max_bytes is not None or data.data else DEFAULT_STDLIB_BYTES
    return resolve_files(list(data.data), max_bytes=max_bytes)


def _stream(context: TaskContext) -> LMData:
    data = context.data
    name = synthetic_name(data)
    if name is not None:
        return LMData.from_ids(make_task(name, common.SYNTHETIC_SIZES[0], context.seed).lm_ids(context.tokenizer),
                               val_fraction=data.val_fraction)
    files = context.files or stream_files(data)
    cache = context.on_rank_0(partial(token_cache, files, context.tokenizer, context.cache,
                                      encoding_errors=data.encoding_errors, progress=context.progress),
                              "the token cache")  # tokenized and hashed once, not on every rank
    return LMData.prepare(files, context.tokenizer, context.cache, val_fraction=data.val_fraction,
                          encoding_errors=data.encoding_errors, cache=cache)


def _stream_args(context: TaskContext) -> dict[str, Any]:
    return dict(batch_size=context.batch_size, seq_len=context.seq_len, seed=context.seed,
                eval_batches=context.data.eval_batches)


def _make_lm(context: TaskContext) -> tuple[LMTask, None]:
    pack = context.data.options.pack if context.data.options is not None else "off"
    if pack != "off":
        if not hasattr(context.config, "n_heads"):  # a recurrent LM: no attention to mask
            raise ConfigError(f"--pack trains a Transformer decoder on rows of whole documents with a document mask; "
                              f"a {context.config.family} model has no attention to mask: drop --pack")
        return PackedLMTask(_stream(context), tokenizer=context.tokenizer, pack=pack, **_stream_args(context)), None
    return LMTask(_stream(context), **_stream_args(context)), None


def _make_mlm(context: TaskContext) -> tuple[MLMTask, None]:
    """The masked-LM task; a warning where a run pre-trained before its task.json recorded the frame goes on from a
    tokenizer with CLS but no SEP: its windows were BOS ... EOS then and are CLS ... EOS now (`frame_ids`)."""
    record, tokenizer = context.record or {}, context.tokenizer
    if record.get("task") == "mlm" and FRAME not in record and tokenizer.cls_id is not None and (
            tokenizer.sep_id is None):
        log.warning("this masked-LM run was trained on windows framed BOS ... EOS (its task.json records no frame); "
                    "they are framed CLS ... EOS from here on, as a classifier fine-tuned from it reads its texts")
    return MLMTask(_stream(context), tokenizer=tokenizer, **_stream_args(context)), None


# attnkit eval ---------------------------------------------------------------------------------------------------
def _perplexity_report(ctx: EvalContext) -> EvalReport:
    window = ctx.settings.window or ctx.config.max_seq_len
    if window > ctx.config.max_seq_len:
        context = ctx.config.max_seq_len
        raise ConfigError(f"--window {window} is longer than the model's context (max_seq_len={context}): it never "
                          f"read that many tokens at once; give --window {context} or less")
    stride = ctx.settings.stride or max(window // 2, 1)
    rows = []
    for path in ctx.files:
        text = _scored_text(path, ctx.settings.encoding_errors)
        ids = ctx.tokenizer.encode(text)
        if len(ids) < 2:
            raise InputError(f"{path} holds {len(ids)} token(s), and perplexity predicts each token from those "
                             "before it, so it needs at least 2: give --data a longer text")
        nll = sliding_window_nll(ctx.model, ids, window=window, stride=stride, progress=ctx.progress,
                                 batch_size=max(1, LOGITS_BUDGET // (window * ctx.tokenizer.vocab_size)))
        chars, n_bytes = _scored_text_size(text, ids, ctx.tokenizer)
        rows.append(perplexity_row(str(path), nll, len(ids) - 1, chars, n_bytes))
    if len(rows) > 1:
        rows.append(perplexity_row("all", *(sum(r[k] for r in rows) for k in ("nll", "tokens", "chars", "bytes"))))
    return EvalReport("perplexity", str(ctx.run), rows, {"window": window, "stride": stride},
                      columns=("file", "tokens", "loss", "ppl", "chars", "char_ppl", "bits_per_byte"))


def _scored_text(path: Path, errors: EncodingErrors) -> str:
    """The text of an `attnkit eval --data` file; InputError naming the file when it holds none (empty, or only
    white space, which would be scored as if it were text)."""
    text = read_text(path, errors=errors)
    if not text.strip():
        raise InputError(f"{path} holds no text ({'it is empty' if not text else 'only white space'}): give --data a "
                         "file with the text to score")
    return text


def _masked_lm_report(ctx: EvalContext) -> EvalReport:
    """Each file's tokens as one stream, in windows of `--window` tokens (default max_seq_len), masked from a
    generator seeded with `--seed` as training's evaluation masks its validation split."""
    seq_len = ctx.settings.window or ctx.config.max_seq_len
    masking = MaskedWindows(ctx.tokenizer, seq_len)
    rows = []
    for path in ctx.files:
        ids = ctx.tokenizer.encode(_scored_text(path, ctx.settings.encoding_errors))
        if len(ids) < masking.window + 1:  # a window's stream tokens, and one after them (`LMData` windows)
            fix = f"or --window {len(ids) + 1} or less" if len(ids) >= 2 else "(the shortest window, 3, needs 2)"
            raise InputError(f"{path} holds {len(ids)} tokens, fewer than a window of {seq_len} needs "
                             f"({masking.window + 1}): give a longer file, {fix}")
        stream = LMData(np.asarray(ids, dtype=np.int64), n_train=0)  # all of it is the split scored
        scores = masked_lm_scores(ctx.model, masked_batches(stream, masking, batch_size=ctx.settings.batch_size,
                                                            seed=ctx.settings.seed, max_batches=None))
        rows.append({"file": str(path), "tokens": len(ids), **scores})
    return EvalReport("masked-lm", str(ctx.run), rows, {"seq_len": seq_len, "seed": ctx.settings.seed},
                      columns=("file", "tokens", "val_loss", "val_ppl", "accuracy"))


# fill_mask: the masked-LM run's pipeline method -----------------------------------------------------------------
@dataclass(frozen=True)
class MaskFill:
    """The `top_k` likeliest tokens at one mask, likeliest first: (token text, probability)."""

    position: int  # the mask's index among the text's masks
    candidates: list[tuple[str, float]]


MASK_WORDS = ("[MASK]", "<mask>")  # how a text may write a mask, besides the tokenizer's own mask token


@torch.inference_mode()
def fill_mask(pipeline: Any, texts: str | Sequence[str], *, top_k: int = 5) -> list[list[MaskFill]]:
    """For each text, the `top_k` likeliest tokens at each of its masks (written `[MASK]`, `<mask>` or as the
    tokenizer writes its mask token), never the mask token itself. Where the tokenizer writes a space into the word
    after it (byte-level BPE), a mask takes the space before it, as RoBERTa's does: it stands for ' cat'. Raises
    InputError for a text without a mask or a bad `top_k`."""
    tok = pipeline.tokenizer
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"top_k={top_k!r} must be a positive integer")
    texts = text_list(texts)
    own = tok.pieces([tok.mask_id])[0] if tok.mask_id is not None else None
    words = tuple(dict.fromkeys(w for w in (own, *MASK_WORDS) if w))
    masking = MaskedWindows(tok, pipeline.config.max_seq_len)
    results = []
    for index, text in enumerate(texts):
        parts = _split_at_masks(text, words)
        if len(parts) < 2:
            raise InputError(f"text {index} holds no mask; write {MASK_WORDS[0]} where a token is to be filled in")
        if getattr(tok, "space_starts_word", False):  # the mask stands for a word with its space ('Ġcat')
            parts = [part.removesuffix(" ") for part in parts[:-1]] + parts[-1:]
        ids = [masking.first]
        for i, part in enumerate(parts):
            ids += ([tok.mask_id] if i else []) + (tok.encode(part) if part else [])
        ids.append(masking.last)
        if len(ids) > pipeline.config.max_seq_len:
            raise InputError(f"text {index} has {len(ids)} tokens; the model reads at most "
                             f"{pipeline.config.max_seq_len}")
        logits = pipeline.model(torch.tensor([ids], device=pipeline.device)).logits[0].float()  # (T, V)
        where = [t for t, i in enumerate(ids) if i == tok.mask_id]
        probs = logits[where].softmax(-1)  # (masks, V)
        check_outputs(probs, pipeline.model, what=f"text {index}")
        probs[:, tok.mask_id] = 0.0  # the mask token is no fill of itself (its probability is left out, not spread)
        best = probs.topk(min(top_k, probs.shape[-1] - 1), dim=-1)
        results.append([
            MaskFill(n, [(tok.decode([i], skip_special=False), p) for i, p in
                         zip(best.indices[n].tolist(), best.values[n].tolist(), strict=True)])
            for n in range(len(where))
        ])
    return results


def _split_at_masks(text: str, words: tuple[str, ...]) -> list[str]:
    """The text between masks: n masks give n + 1 pieces (empty where a mask touches an end or another mask)."""
    return re.split("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)), text)


# The command (attnkit generate, attnkit fill-mask) -----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SamplingSettings(DecodeSettings):
    """How a text is drawn: the options `attnkit generate` and `attnkit chat` share (`sampling`)."""

    max_new_tokens: int = 200  # tokens to generate after the prompt
    min_new_tokens: int = 0  # no EOS (nor stop token) among the first this many tokens; 0: off
    temperature: float = 1.0  # 0 is greedy
    top_k: int | None = None  # sample among the k most likely tokens
    top_p: float | None = None  # sample among the most likely tokens that reach probability p
    repetition_penalty: float = 1.0  # > 1 discourages repeats; 1: off
    presence_penalty: float = 0.0  # -2 to 2: a token's logit less by this once the reply holds it (OpenAI's); 0: off
    frequency_penalty: float = 0.0  # -2 to 2: a token's logit less by this times its count in the reply; 0: off
    min_p: float = 0.0  # drop the tokens less likely than min_p times the likeliest (0.05 is usual); 0: off
    no_repeat_ngram_size: int = 0  # never repeat n tokens in a row that the prompt or text holds (3 is usual); 0: off
    seed: int | None = None  # same seed, same text
    stop: tuple[str, ...] = ()  # end the text at any of these strings (repeatable)

    def sampling(self) -> dict[str, Any]:
        """These settings as `Pipeline.generate`'s keyword arguments: the fields this class adds to loading's
        (`DecodeSettings`), `stop` left to the caller, which adds its own."""
        not_sampling = {f.name for f in dataclasses.fields(DecodeSettings)} | {"stop"}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(SamplingSettings)
                if f.name not in not_sampling}


@dataclass(frozen=True, kw_only=True)
class GenerateSettings(SamplingSettings):
    prompt: str  # the prompt; "-" reads it from stdin; "" starts from BOS
    num_samples: int = 1  # independent continuations of the prompt
    stream: bool = True  # print tokens as they come (one sample only)
    echo: bool = True  # print the prompt before its continuation (--no-echo: the new text alone, e.g. JSON to parse)
    max_prompt_bytes: int = 1_000_000  # --prompt -: read at most this many bytes of standard input
    json_schema: str | None = None  # a JSON schema file: the text is JSON valid under it (the structured extra)
    json: bool = False  # the text is one JSON object, any (JSON mode; the structured extra)
    regex: str | None = None  # the text matches this regular expression whole (the structured extra)
    grammar: str | None = None  # a Lark grammar file (llguidance's syntax) the text follows (the structured extra)
    num_beams: int = 1  # beam search over this many hypotheses (transformers' num_beams); 1: greedy or sampling
    length_penalty: float = 1.0  # beam score = summed log p / new tokens ** this (> 0 favours longer texts)
    early_stopping: bool = False  # beam search ends at num-beams finished texts (off: while a live beam could win)
    num_return_sequences: int = 1  # beam search: the n best texts, best first (n <= --num-beams)
    do_sample: bool = False
    """beam search: sample the beams (transformers' do_sample=True beside num_beams), warped by --temperature,
    --top-k, --top-p and --min-p, seeded by --seed"""
    draft: str | None = None
    """a smaller decoder run with the same tokenizer: speculative decoding, the same text (greedy) or distribution
    (sampled) as this run alone, faster where the draft agrees; the acceptance rate is logged"""
    draft_tokens: int | None = None  # --draft: the tokens the draft proposes a round (default 4; 2 to 6 is usual)
    chat: bool = False
    """the prompt is a user's turn, rendered with the run's chat template and its special tokens (its own, else
    attnkit's System:/User:/Assistant: format) as attnkit serve's /v1/chat/completions renders a chat; the reply
    ends at the template's end of turn and is printed alone"""
    system: str | None = None  # --chat: a system turn before the user's (a system prompt)
    best_of: int = 1
    """best-of-N (rejection sampling, Llama 2 sec. 3.2.3): draw N samples and print the one the --reward run scores
    highest, each candidate's reward logged (every text too with -v); 1: off"""
    reward: str | None = None  # --best-of: the reward run (attnkit train --task reward) that scores the candidates
    candidates_json: bool = False  # --best-of: print one JSON object, every candidate with its reward, not the text

    @property
    def beams(self) -> bool:
        """Whether the settings ask for beam search (`beams_asked`)."""
        return beams_asked(self.num_beams, self.num_return_sequences)


def check_beam_flags(settings: GenerateSettings) -> None:
    """InputError, before the model loads, naming the flags: bad beam settings (`check_search`; a --num-beams
    wider than the vocabulary is refused once it is known), given without beams as well (a --length-penalty nan
    that no search reads is still a mistake; a valid one is said to be ignored), or flags given beside --num-beams
    that beam search does not take (`refuse_beside_beams`)."""
    check_search(settings.num_beams, settings.length_penalty, early_stopping=settings.early_stopping,
                 num_return_sequences=settings.num_return_sequences, beam="num_beams", what="prompt", flags=True)
    if not settings.beams:
        return
    taken = API_ONLY_BESIDE_BEAMS | (SAMPLED_BEAMS_TAKE if settings.do_sample else frozenset())
    refuse_beside_beams(f"--num-beams {settings.num_beams}", {
        name: getattr(settings, name) for name in NOT_BESIDE_BEAMS if name not in taken}, flags=True)


def read_constraint(settings: GenerateSettings) -> dict[str, Any]:
    """What the text must follow, as Pipeline.generate takes it ({} for free text; json_schema=, regex= or lark=),
    files read and an expression or grammar checked by llguidance before the model loads. Raises InputError for
    more than one of --json, --json-schema, --regex and --grammar, a file that cannot be read (a schema file that
    holds no JSON object), or an expression or grammar llguidance finds malformed (naming the flag)."""
    flags = (("--json", settings.json or None), ("--json-schema", settings.json_schema), ("--regex", settings.regex),
             ("--grammar", settings.grammar))
    given = [flag for flag, value in flags if value is not None]
    if len(given) > 1:
        raise InputError(f"give one of --json (any JSON object), --json-schema FILE, --regex and --grammar FILE, not "
                         f"{', '.join(given[:-1])} and {given[-1]} together")
    if settings.regex is not None:
        return {"regex": _well_formed(regex_grammar, settings.regex, "--regex")}
    if settings.grammar is not None:
        text = read_text(settings.grammar, fix="save the grammar as UTF-8")
        return {"lark": _well_formed(lark_grammar, text, f"--grammar {settings.grammar}")}
    schema = read_schema(settings)
    return {} if schema is None else {"json_schema": schema}


def _well_formed(build: Callable[[str], str], source: str, flag: str) -> str:
    """`source`, once `build` (grammars.regex_grammar or lark_grammar) finds it well formed; InputError naming
    `flag` and llguidance's reason otherwise."""
    try:
        build(source)
    except InputError as error:
        raise InputError(f"{flag}: {error}") from None
    return source


def read_schema(settings: GenerateSettings) -> dict | None:
    """The JSON schema that --json-schema FILE or --json asks for (None: free text). Raises InputError for a file
    that cannot be read or holds no JSON object."""
    if settings.json:
        return {"type": "object"}
    if settings.json_schema is None:
        return None
    try:
        schema = json.loads(read_text(settings.json_schema, fix="save the schema as UTF-8, as JSON is written"))
    except json.JSONDecodeError as err:
        raise InputError(f"{settings.json_schema} is not JSON ({err}): a JSON schema file holds one JSON "
                         "object") from None
    if not isinstance(schema, dict):
        raise InputError(f"{settings.json_schema} holds a JSON {type(schema).__name__}; a JSON schema is an object")
    return schema


def shares_a_terminal(stream: Any, other: Any) -> bool:
    """Whether two open streams write to one terminal (both ttys on the same device), as stdout and stderr do when
    neither is redirected; False for a file, a pipe or an in-memory stream."""
    try:
        return (stream.isatty() and other.isatty()
                and os.path.samestat(os.fstat(stream.fileno()), os.fstat(other.fileno())))
    except (AttributeError, OSError, ValueError):
        return False


class StreamedText:
    """`attnkit generate`'s streamed text on stdout: the prompt (`head`) sent with the first piece, so that a setting
    refused before it prints its error alone, then each piece as it comes, then a newline. stdout is the data
    channel and holds exactly that. Where a log handler writes to the terminal stdout writes to, a record logged
    while the text's line is open (the warning that a text ended before its schema was complete) first ends that
    line on the handler's own stream, so it stands on its own line instead of running on from the text; a stdout
    redirected to a file or a pipe is never written to by a log record."""

    def __init__(self, head: str) -> None:
        self.unsent = [head]
        self.line_ended = False  # the terminal's line was ended by a log record's newline on stderr

    def write(self, _: int, piece: str) -> None:
        sys.stdout.write("".join(self.unsent) + piece)
        sys.stdout.flush()
        self.unsent.clear()
        self.line_ended = False

    def end_line_on(self, stream: Any) -> Callable[[logging.LogRecord], bool]:
        """A logging filter for a handler writing to `stream`, stdout's terminal (it lets every record through):
        ends the text's open line on that stream first."""

        def end_line(_: logging.LogRecord) -> bool:
            if not self.unsent and not self.line_ended:
                stream.write("\n")
                stream.flush()
                self.line_ended = True
            return True

        return end_line

    @contextmanager
    def own_lines(self) -> Iterator[None]:
        """While open, what the root logger's handlers write to stdout's terminal starts on a line of its own."""
        filters = [(handler, self.end_line_on(handler.stream)) for handler in logging.getLogger().handlers
                   if shares_a_terminal(getattr(handler, "stream", None), sys.stdout)]
        for handler, end_line in filters:
            handler.addFilter(end_line)
        try:
            yield
        finally:
            for handler, end_line in filters:
                handler.removeFilter(end_line)

    def finish(self) -> None:
        """End the text's line: one newline on stdout, unless a record already ended it in the shared terminal."""
        if not self.line_ended:
            print("".join(self.unsent))


def chat_prompt(template: ChatTemplate, tokenizer: Tokenizer, prompt: str, *, system: str | None = None
                ) -> tuple[list[int], tuple[str, ...], frozenset[int]]:
    """`attnkit generate --chat`: `prompt` as a user's turn after an optional `system` turn, rendered by the run's
    chat template (`Pipeline.chat_template`) and tokenized with its special tokens (`ChatTemplate.chat_ids`), as
    `attnkit serve` renders a chat; the strings that end the reply (the default format's next turn) and the tokens
    that end it beside the run's end ids (a template's own end of turn, ChatML's <|im_end|>:
    `ChatTemplate.turn_end_ids`). Raises InputError where the template refuses the chat (naming --system, which
    one that takes no system turn refuses: Gemma's)."""
    messages = [*([{"role": "system", "content": system}] if system is not None else []),
                {"role": "user", "content": prompt}]
    try:
        ids = template.chat_ids(tokenizer, messages)
    except InputError as error:
        if system is None or tokenizer is None:  # no tokenizer: the run is what lacks, not the system turn
            raise
        raise InputError(f"--system: {error}; leave --system out with this run's template") from None
    return ids, template.stops, template.turn_end_ids(tokenizer)


def check_best_of_flags(settings: GenerateSettings) -> bool:
    """Whether the settings ask for best-of-N; InputError, before a model loads, naming the flags: --best-of below 1,
    without --reward, or beside what draws no samples of its own (beams, a draft, --num-samples) or the same one N
    times (--temperature 0)."""
    asked = settings.best_of != 1 or settings.reward is not None or settings.candidates_json
    if not asked:
        return False
    check_best_of(settings.best_of, flag="--best-of")
    if settings.reward is None:
        raise InputError(f"--best-of {settings.best_of} keeps the candidate a reward model scores highest: give "
                         "--reward RUN (a run of attnkit train --task reward)")
    beside = [flag for flag, given in (("--num-beams", settings.beams), ("--draft", settings.draft is not None),
                                       ("--num-samples", settings.num_samples != 1),
                                       ("--temperature 0 (greedy: one text N times)",
                                        settings.temperature == 0 and settings.best_of > 1)) if given]
    if beside:
        raise InputError(f"--best-of draws its own samples, so it does not take "
                         f"{', '.join(beside)}; leave {'them' if len(beside) > 1 else 'it'} out")
    return True


def run_best_of(settings: GenerateSettings, prompt: str, constraint: dict[str, Any],
                load: Callable[[Any], Any]) -> int:
    """`attnkit generate --best-of N --reward RUN`: the best candidate's text (or, with --candidates-json, every
    candidate with its reward as one JSON object); with --chat the prompt is a user's turn (after --system's) and
    the best reply's content is printed alone."""
    policy = load(settings)
    reward = load(dataclasses.replace(settings, run=settings.reward, explain=False, compile=None,
                                      device=str(policy.device)))
    if "reward" not in reward.methods:
        trained = f"a run of --task {reward.task.name}" if reward.task is not None else "a model without a task head"
        raise InputError(f"--reward {settings.reward} is {trained}, not a reward model: train one with attnkit train "
                         "--task reward --init-from RUN --data pairs.jsonl")
    asked = [*([{"role": "system", "content": settings.system}] if settings.system is not None else []),
             {"role": "user", "content": prompt}] if settings.chat else prompt
    found = best_of_n(policy, reward, asked, n=settings.best_of, **settings.sampling(), stop=list(settings.stop),
                      **constraint)[0]
    for index, (text, score) in enumerate(zip(found.texts, found.rewards, strict=True)):
        log.debug("candidate %d: reward %.4g%s: %r", index + 1, score, " (best)" if index == found.best else "", text)
    if settings.candidates_json:
        print(json.dumps(found.to_dict(), ensure_ascii=False))
    else:
        print((prompt if settings.echo and not settings.chat else "") + found.text)
    return 0


def run_generate(settings: GenerateSettings, load: Callable[[Any], Any]) -> int:
    """`attnkit generate`; `load(settings)` loads the run (the command line passes `attnkit.cli.load_pipeline`)."""
    best_of = check_best_of_flags(settings)
    check_beam_flags(settings)
    draft_tokens = draft_tokens_flag(settings.draft, settings.draft_tokens)  # named as the flags, before a model loads
    if settings.draft is not None:
        refuse_beside_draft({name: getattr(settings, name) for name in NOT_BESIDE_DRAFT
                             if name not in API_ONLY_BESIDE_DRAFT}, flags=True)
    if settings.system is not None and not settings.chat:
        raise InputError("--system is a chat's system turn: give --chat too (the prompt is then the user's turn)")
    check_prompt_bytes(settings.max_prompt_bytes)  # out of range is a mistake, whether or not stdin is read
    if settings.prompt != "-" and settings.max_prompt_bytes != GenerateSettings.max_prompt_bytes:
        log.warning("ignored: --max-prompt-bytes %s bounds the prompt --prompt - reads from standard input, and the "
                    "prompt is given as text; give --prompt - to read it, or leave --max-prompt-bytes out",
                    settings.max_prompt_bytes)
    prompt = read_stdin(settings.max_prompt_bytes) if settings.prompt == "-" else settings.prompt
    constraint = read_constraint(settings)
    if best_of:
        return run_best_of(settings, prompt, constraint, load)
    if settings.draft is not None and settings.compile:  # nothing would run the step: neither model compiles one
        log.warning("--compile %s: speculative decoding decodes both models eagerly, as the target scores the drafts "
                    "and the token after them in one pass, which a one-token compiled step does not take; nothing is "
                    "compiled", settings.compile)
        settings = dataclasses.replace(settings, compile=None)
    pipeline = load(settings)
    stops, stop_tokens = list(settings.stop), frozenset()
    if settings.chat:
        prompt, ends, stop_tokens = chat_prompt(pipeline.chat_template, pipeline.tokenizer, prompt,
                                                system=settings.system)
        stops += ends
    draft = None
    if settings.draft is not None:
        draft = load(dataclasses.replace(settings, run=settings.draft, explain=False, device=str(pipeline.device)))
        check_draft_fits_context(len(pipeline.prompt_ids(prompt, index=0)), settings.max_new_tokens,
                                 min(pipeline.config.max_seq_len, draft.config.max_seq_len), flags=True)
    if settings.beams:  # named as the flag, where the API's check would name max_new_tokens=
        check_beams_fit_context(len(pipeline.prompt_ids(prompt, index=0)), settings.max_new_tokens,
                                pipeline.config.max_seq_len, flags=True)
        if settings.compile:  # the plan (--explain) names the compiled step, which the search never runs
            log.warning("--compile %s: beam search decodes eagerly, as a compiled step's fixed buffers cannot follow "
                        "the beams' rows; the compiled step is not used", settings.compile)
    many = settings.num_samples > 1 or settings.num_return_sequences > 1
    stream = settings.stream and not many and not settings.beams  # beam search's texts come whole at the end
    head = prompt if settings.echo and not settings.chat else ""  # a chat's reply alone, as `ollama run` prints it
    streamed = StreamedText(head)
    shown = pipeline.chat_template.reply_content if settings.chat else str  # a reply's content (`Pipeline.chat`)
    on_text = streamed.write if stream else None
    if stream and settings.chat:
        on_text = pipeline.chat_template.content_stream(functools.partial(streamed.write, 0))
    with streamed.own_lines():
        texts = pipeline.generate(
            prompt, **settings.sampling(), num_samples=settings.num_samples, stop=stops,
            stop_tokens=sorted(stop_tokens), on_text=on_text, **constraint,
            num_beams=settings.num_beams, length_penalty=settings.length_penalty,
            early_stopping=settings.early_stopping, num_return_sequences=settings.num_return_sequences,
            draft=draft, draft_tokens=draft_tokens, do_sample=settings.do_sample,
        )
    if stream:
        streamed.finish()
        return 0
    for index, text in enumerate(texts):
        if many:
            print(f"--- {'sample' if settings.num_samples > 1 else 'sequence'} {index + 1} ---")
        print(head + shown(text))
    return 0


@dataclass(frozen=True, kw_only=True)
class FillMaskSettings(InputSettings):
    """Texts with [MASK] where a token is to be filled in."""

    top_k: int = 5  # candidates shown for each mask


def run_fill_mask(settings: FillMaskSettings, load: Callable[[Any], Any]) -> int:
    """`attnkit fill-mask`; `load(settings)` loads the run (the command line passes `attnkit.cli.load_pipeline`)."""
    texts = read_inputs(settings)
    for index, fills in enumerate(load(settings).fill_mask(texts, top_k=settings.top_k)):
        if index:
            print()  # a blank line between texts: a text's masks are the lines of its block
        for fill in fills:
            print("\t".join(f"{token!r} {p:.4f}" for token, p in fill.candidates))
    return 0


LM = register(TaskSpec(
    name="lm", help="next-token prediction (decoder, recurrent LM, convolutional LM, feed-forward LM)",
    families=("decoder", "recurrent-lm", "conv-lm", "feedforward-lm"),
    seed_draws_validation="never",
    head={"decoder_head": "lm"}, make=_make_lm, evaluate_files=_perplexity_report, method="generate", stream=True,
    options=STREAM_OPTIONS, own_options=LMOptions,
    # Llama's layout (a `LlamaForCausalLM` for transformers, `llama` for llama.cpp): SwiGLU's d_ff ~ 8/3 C, rounded
    # up to a multiple of 32 (q8_0/q4_0 blocks), costs what a 4C GELU feed-forward did
    default_model=dict(family="decoder", d_model=128, n_layers=4, n_heads=4, d_ff=352, position="rope",
                       norm="rms", activation="swiglu", bias=False, max_seq_len=128, dropout=0.0,
                       tie_embeddings=True),
    hf_architectures=(HFClass("GPT2LMHeadModel", "gpt2"), HFClass("LlamaForCausalLM", "llama"),
                      HFClass("MistralForCausalLM", "mistral")),
    eval_help="text files: perplexity",
    eval_options=("window", "stride", "int8", "int8_dynamic", "int4"),
    command=TaskCommand("generate", "continue a prompt with a trained decoder, streaming the text as it comes",
                        GenerateSettings, run_generate),
))
MLM = register(TaskSpec(
    name="mlm", help="masked-LM pre-training (encoder)", families=("encoder",), head={"encoder_head": "mlm"},
    make=_make_mlm, evaluate_files=_masked_lm_report, method="fill_mask", pipeline=fill_mask, stream=True,
    options=STREAM_OPTIONS,
    default_model=dict(family="encoder", d_model=128, n_layers=2, n_heads=4, d_ff=512, position="learned",
                       norm="layer", norm_position="pre", activation="gelu", max_seq_len=128, dropout=0.1,
                       encoder_head="mlm", pooling="mean", tie_embeddings=True),
    # BertForPreTraining checkpoints (bert-base-uncased) also hold the pooler and the next-sentence head, which
    # BertForMaskedLM leaves out
    hf_architectures=(HFClass("BertForMaskedLM", "bert", {"mlm_transform": True, "lm_head_bias": True, "pooler": False},
                              drops=("bert.pooler", "cls.seq_relationship")),),
    eval_help="text files: masked-token loss and accuracy",
    eval_options=("window", "batch_size", "seed"),
    command=TaskCommand("fill-mask", "the likeliest tokens at each [MASK] of texts, with a masked-LM encoder",
                        FillMaskSettings, run_fill_mask),
))
