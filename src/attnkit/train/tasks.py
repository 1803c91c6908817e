"""What each task trains on and how it is scored. The trainer is the same for all; the model computes the loss,
the task feeds it batches and evaluates. Which families train for a task, their registrations say
(`attnkit.models.families`): lm the decoder and the recurrent LM, mlm and classify the encoder, translate the
encoder-decoder and the recurrent seq2seq.

    task        batch                         loss (inside the model)          evaluation
    lm          random windows of a stream    next-token cross-entropy         val loss, perplexity
    mlm         random windows, 15% masked    cross-entropy at masked tokens   val loss, accuracy
    translate   padded, bucketed pairs        target-token cross-entropy       val loss, sacreBLEU
    classify    padded, bucketed texts        cross-entropy over classes       val loss, accuracy

Every task remembers where it is in its data (`data_state`), so a resumed run draws the very same batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnkit.data import IGNORE_INDEX, LabelledBatch, LabelledData, LMData, PairBatch, PairData
from attnkit.data.masking import mask_tokens
from attnkit.errors import ConfigError
from attnkit.models import families_for_task, family_of
from attnkit.tokenize import SPECIAL_ROLES, Tokenizer
from attnkit.train.bleu import bleu_scores
from attnkit.train.state import decode_tensor, encode_tensor

TASKS = ("lm", "mlm", "translate", "classify")
# (model, source token lists, *, bos_id, eos_id, pad_id, max_length, beam_size) -> target token lists without BOS/EOS
Translator = Callable[..., list[list[int]]]


def check_family(task: str, family: str) -> None:
    """Raise ConfigError unless a model of `family` can be trained for `task` (the families' registrations say)."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if task not in family_of(family).tasks:
        fits = families_for_task(task)
        raise ConfigError(
            f"--task {task} trains a {' or a '.join(f.name + ' model' for f in fits)}, but the config's family is "
            f"{family!r}; use such a preset (e.g. --preset {' or '.join(f.example for f in fits)}) or "
            f"--set family={fits[0].name}"
        )


class Task(Protocol):
    """The trainer's view of a task."""

    name: str
    metric: str  # the evaluation result that picks the best checkpoint
    higher_is_better: bool

    def next_batch(self) -> Any: ...
    def loss(self, model: nn.Module, batch: Any) -> Tensor: ...  # mean over the batch's `weight` targets
    def weight(self, batch: Any) -> int: ...  # how many targets the loss averages over
    def n_tokens(self, batch: Any) -> int: ...  # input tokens processed (for tokens/s)
    def evaluate(self, model: nn.Module) -> dict[str, float]: ...
    def data_state(self) -> dict[str, Any]: ...
    def load_data_state(self, state: dict[str, Any]) -> None: ...


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


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
        x, y = (t.to(_device(model)) for t in batch)
        return model(x, targets=y, return_logits=False).loss  # chunked loss: no (B, T, V) logits kept

    def weight(self, batch: tuple[Tensor, Tensor]) -> int:
        return batch[1].numel()

    def n_tokens(self, batch: tuple[Tensor, Tensor]) -> int:
        return batch[0].numel()

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean next-token loss over (up to `eval_batches` batches of) the validation split; perplexity = e^loss."""
        batches = self.data.iter_eval_batches(
            "val", batch_size=self.batch_size, seq_len=self.seq_len, max_batches=self.eval_batches
        )
        loss = _mean_loss(self, model, batches)
        return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}

    def prompt_ids(self, n_tokens: int = 24) -> list[int]:
        """The first tokens of the validation split: a prompt for a sample of generated text."""
        return [int(i) for i in self.data.val[:n_tokens]]

    def data_state(self) -> dict[str, Any]:
        return {"generator": encode_tensor(self.generator.get_state())}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(decode_tensor(state["generator"]))


class MLMTask(LMTask):
    """Masked language modelling (BERT): windows of the token stream framed as `CLS tokens SEP` (or `BOS tokens
    EOS`), masked afresh each batch (`attnkit.data.masking`) from the task's generator, which also draws the
    windows, so a resumed run masks the same tokens (the generator's state is the data state, as for `lm`).
    Evaluation masks the validation windows with a generator seeded alike every time, so its figures compare
    across evaluations.
    """

    name = "mlm"
    metric = "val_loss"
    higher_is_better = False

    def __init__(
        self, data: LMData, *, tokenizer: Tokenizer, batch_size: int, seq_len: int, seed: int, eval_batches: int = 50
    ) -> None:
        if seq_len < 3:
            raise ConfigError(f"--task mlm needs seq_len >= 3 (CLS, a token, SEP); got {seq_len}")
        if tokenizer.mask_id is None:
            raise ConfigError("--task mlm needs a tokenizer with a mask token; train one with --tokenizer bpe or char")
        has_cls = tokenizer.cls_id is not None and tokenizer.sep_id is not None
        self.first, self.last = (tokenizer.cls_id, tokenizer.sep_id) if has_cls else (
            tokenizer.bos_id, tokenizer.eos_id)
        if self.first is None or self.last is None:
            raise ConfigError("--task mlm needs a tokenizer with CLS and SEP (or BOS and EOS) tokens")
        super().__init__(data, batch_size=batch_size, seq_len=seq_len, seed=seed, eval_batches=eval_batches)
        self.seed = seed
        self.masking = dict(mask_id=tokenizer.mask_id, vocab_size=tokenizer.vocab_size,
                            special_ids={i for role in SPECIAL_ROLES if (i := tokenizer.token_id(role)) is not None})

    @property
    def window(self) -> int:
        """Tokens of a window drawn from the stream: `seq_len` less the CLS and SEP framing it."""
        return self.seq_len - 2

    def _frame_and_mask(self, windows: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        b = windows.shape[0]
        ids = torch.cat([torch.full((b, 1), self.first), windows, torch.full((b, 1), self.last)], dim=1)  # (B, T)
        return mask_tokens(ids, generator=generator, **self.masking)

    def next_batch(self) -> tuple[Tensor, Tensor]:
        windows, _ = self.data.sample_batch("train", self.batch_size, self.window, self.generator)
        return self._frame_and_mask(windows, self.generator)  # inputs (B, T), labels (B, T)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, labels = (t.to(_device(model)) for t in batch)
        return model(inputs, labels=labels).loss

    def weight(self, batch: tuple[Tensor, Tensor]) -> int:
        return int((batch[1] != IGNORE_INDEX).sum())

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Loss and accuracy at the masked tokens of (up to `eval_batches` batches of) the validation split."""
        generator = torch.Generator().manual_seed(self.seed)
        total, correct, count = 0.0, 0, 0
        for windows, _ in self.data.iter_eval_batches(
            "val", batch_size=self.batch_size, seq_len=self.window, max_batches=self.eval_batches
        ):
            inputs, labels = (t.to(_device(model)) for t in self._frame_and_mask(windows, generator))
            out = model(inputs, labels=labels)
            masked = labels != IGNORE_INDEX
            total += out.loss.item() * int(masked.sum())
            correct += int((out.logits.argmax(-1)[masked] == labels[masked]).sum())
            count += int(masked.sum())
        return {"val_loss": total / count, "val_ppl": math.exp(min(total / count, 50.0)), "accuracy": correct / count}


class _EpochTask:
    """Walks the batches of a bucketed data set epoch after epoch; the position is (epoch, index)."""

    def __init__(self, train: PairData | LabelledData) -> None:
        self.train = train
        self.epoch, self.index = 0, 0

    def next_batch(self) -> Any:
        if self.index >= len(self.train.batch_order(self.epoch)):
            self.epoch, self.index = self.epoch + 1, 0
        batch = self.train.batch(self.epoch, self.index)
        self.index += 1
        return batch

    def data_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class TranslateTask(_EpochTask):
    """Sequence to sequence with teacher forcing; scored by sacreBLEU on translations (greedy, or beam search of
    `beam_size`) when a decoding function is given (the trainer never imports `attnkit.generate`; the caller
    passes its `translate_ids`).

    `references` are the raw target sentences of the validation pairs, in order; BLEU compares the first
    `bleu_samples` of them (all of them when there are fewer), detokenized and cased, with sacreBLEU's default
    13a tokenization: the figure that picks the best checkpoint. The lowercased protocol of the published
    Multi30k results is logged beside it as `bleu_lowercased`.
    """

    name = "translate"
    metric = "val_loss"  # "bleu" when a translator is given
    higher_is_better = False

    def __init__(
        self,
        train: PairData,
        val: PairData,
        *,
        tokenizer: Tokenizer,
        references: list[str],
        translate: Translator | None = None,
        bleu_samples: int = 200,
        beam_size: int = 1,
        max_len: int = 128,
    ) -> None:
        super().__init__(train)
        self.val, self.tokenizer, self.max_len, self.beam_size = val, tokenizer, max_len, beam_size
        self.references = references[:bleu_samples]
        self.translate = translate
        if translate is not None:
            self.metric, self.higher_is_better = "bleu", True

    def loss(self, model: nn.Module, batch: PairBatch) -> Tensor:
        b = batch.to(_device(model))
        return model(
            b.src_ids, b.tgt_in, src_mask=b.src_mask, tgt_mask=b.tgt_mask, targets=b.tgt_out, return_logits=False
        ).loss

    def weight(self, batch: PairBatch) -> int:
        return batch.n_tgt_tokens

    def n_tokens(self, batch: PairBatch) -> int:
        return int(batch.src_mask.sum()) + batch.n_tgt_tokens

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        loss = _mean_loss(self, model, self.val.eval_batches())
        results = {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}
        if self.translate is not None:
            scores = bleu_scores(self.hypotheses(model), self.references)
            results.update(bleu=scores["bleu"], bleu_lowercased=scores["bleu_lowercased"])
        return results

    def hypotheses(self, model: nn.Module) -> list[str]:
        """Translations of the first `bleu_samples` validation sources (beam `beam_size`), detokenized."""
        out: list[str] = []
        n, step = len(self.references), self.val.batch_size
        for start in range(0, n, step):
            ids = self.translate(
                model, self.val.src[start : min(start + step, n)], bos_id=self.tokenizer.bos_id,
                eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id, max_length=self.max_len,
                beam_size=self.beam_size,
            )
            out.extend(self.tokenizer.decode(row) for row in ids)
        return out


class ClassifyTask(_EpochTask):
    """Sequence classification; scored by accuracy on the validation set."""

    name = "classify"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, train: LabelledData, val: LabelledData) -> None:
        super().__init__(train)
        self.val = val

    def loss(self, model: nn.Module, batch: LabelledBatch) -> Tensor:
        b = batch.to(_device(model))
        return model(b.ids, attention_mask=b.mask, labels=b.labels).loss

    def weight(self, batch: LabelledBatch) -> int:
        return len(batch.labels)

    def n_tokens(self, batch: LabelledBatch) -> int:
        return int(batch.mask.sum())

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        total_loss, correct, count = 0.0, 0, 0
        for batch in self.val.eval_batches():
            b = batch.to(_device(model))
            out = model(b.ids, attention_mask=b.mask, labels=b.labels)
            total_loss += out.loss.item() * len(b.labels)
            correct += int((out.logits.argmax(-1) == b.labels).sum())
            count += len(b.labels)
        return {"val_loss": total_loss / count, "accuracy": correct / count}


def _mean_loss(task: Task, model: nn.Module, batches) -> float:
    """Loss over `batches`, each weighted by its number of targets."""
    total, count = 0.0, 0
    for batch in batches:
        n = task.weight(batch)
        total += task.loss(model, batch).item() * n
        count += n
    return total / count
