"""Translation (`translate`: encoder-decoder and recurrent seq2seq): sequence to sequence with teacher forcing,
scored by sacreBLEU.

Data: a folder holding train.SRC/train.TGT (and val.SRC/val.TGT), one `source<TAB>target` file, or two
line-aligned files (source first); `synthetic:NAME` for a generated task. Neither training nor `attnkit eval`
imports `attnkit.generate`: decoding comes in as a function, and the CLI passes the one `Pipeline.translate` calls
(`attnkit.generate.translate_batched`), so training's BLEU and `attnkit eval`'s translate alike.
One scoring serves both: `translation_scores` of the hypotheses against the references.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.data import PairBatch, PairData
from attnkit.data.corpus import find_files
from attnkit.data.pairs import read_parallel, read_tsv_pairs
from attnkit.errors import ConfigError, InputError
from attnkit.outputs import atomic_write, check_output
from attnkit.run_settings import DecodeSettings, InputSettings, read_inputs
from attnkit.tasks.bleu import translation_scores
from attnkit.tasks.common import EpochTask, device_of, split, summed_nll, synthetic_split
from attnkit.tasks.registry import EvalContext, HFClass, TaskCommand, TaskContext, TaskSpec, register
from attnkit.tasks.report import EvalReport
from attnkit.tokenize import Tokenizer

# (model, source token lists, *, bos_id, eos_id, pad_id, context_len, beam_size, batch_size) -> target token lists
# without BOS/EOS: `attnkit.generate.translate_batched`, the decoding `Pipeline.translate` runs
Translator = Callable[..., list[list[int]]]
# A target of at most twice its source plus 10 tokens where no length is asked: what `attnkit translate` and
# training's BLEU decode to (`attnkit.generate.translate_batched`), and what an ONNX folder's runtime.json says
MAX_LENGTH_PER_SOURCE_TOKEN, MAX_LENGTH_EXTRA = 2, 10
DIRECTION_PAIRS = 64  # evaluation pairs the direction check scores each way, at most (evenly strided)
DIRECTION_MARGIN = 1.0  # nats a target token: reversed pairs fitting the model this much better are refused


def default_max_length(longest_source: int, max_seq_len: int) -> int:
    """Target tokens at most (EOS counted) for a batch whose longest source is `longest_source` ids (EOS included,
    padding not) where no length is asked: twice that plus 10, within the model's `max_seq_len`."""
    return min(max_seq_len, MAX_LENGTH_PER_SOURCE_TOKEN * longest_source + MAX_LENGTH_EXTRA)


class TranslateTask(EpochTask):
    """Sequence to sequence with teacher forcing; scored by sacreBLEU on translations (greedy, or beam search of
    `beam_size`) when a decoding function is given: the pipeline's, with its defaults (its maximum length, a batch
    of the validation batch size), so `attnkit.load(run).translate` gives the same translations.

    `references` are the raw target sentences of the validation pairs, in order; BLEU compares the first
    `bleu_samples` of them (all of them when there are fewer), detokenized and cased, with sacreBLEU's default
    13a tokenization: the figure that picks the best checkpoint. The lowercased protocol of the published
    Multi30k results is logged beside it as `bleu_lowercased`.
    """

    name = "translate"
    padded = True  # the training plan's attention choice reads it: attention masks over padded sources, targets
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
        context_len: int = 128,
    ) -> None:
        super().__init__(train)
        self.val, self.tokenizer, self.context_len, self.beam_size = val, tokenizer, context_len, beam_size
        self.references = references[:bleu_samples]
        self.translate = translate
        if translate is not None:
            self.metric, self.higher_is_better = "bleu", True

    def loss(self, model: nn.Module, batch: PairBatch) -> Tensor:
        b = batch.to(device_of(model))
        return model(
            b.src_ids, b.tgt_in, src_mask=b.src_mask, tgt_mask=b.tgt_mask, labels=b.tgt_out, return_logits=False
        ).loss

    def weight(self, batch: PairBatch) -> int:
        return batch.n_tgt_tokens

    def n_tokens(self, batch: PairBatch) -> int:
        return int(batch.src_mask.sum()) + batch.n_tgt_tokens

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        total, count = 0.0, 0
        for batch in self.val.eval_batches():
            b = batch.to(device_of(model))
            logits = model(b.src_ids, b.tgt_in, src_mask=b.src_mask, tgt_mask=b.tgt_mask).logits  # (B, T, V)
            total, count = total + summed_nll(logits, b.tgt_out), count + b.n_tgt_tokens
        loss = total / count
        results = {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}
        if self.translate is not None:
            scores = translation_scores(self.hypotheses(model), self.references)
            results.update(bleu=scores["bleu"], bleu_lowercased=scores["bleu_lowercased"])
        return results

    def hypotheses(self, model: nn.Module) -> list[str]:
        """Translations of the first `bleu_samples` validation sources (beam `beam_size`), detokenized: what
        `Pipeline.translate(sources, beam_size=beam_size, batch_size=the validation batch size)` returns."""
        ids = self.translate(
            model, [list(map(int, src)) for src in self.val.src[:len(self.references)]], bos_id=self.tokenizer.bos_id,
            eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id, context_len=self.context_len,
            beam_size=self.beam_size, batch_size=self.val.batch_size,
        )
        return [self.tokenizer.decode(row) for row in ids]


# Reading pairs -------------------------------------------------------------------------------------------------
def _read_pairs(paths: tuple[str, ...], data: Any, which: str) -> list[tuple[str, str]] | None:
    if len(paths) == 1 and Path(paths[0]).is_dir():
        folder = Path(paths[0])
        langs = sorted({Path(p.name.removesuffix(".gz")).suffix[1:] for p in folder.glob("train.*")} - {""})  # de
        if not (data.src_lang and data.tgt_lang):
            raise ConfigError(f"{folder} is a folder: name the languages with --src-lang and --tgt-lang "
                              f"(its train.* files have suffixes {langs})")
        names = {"train": ("train",), "val": ("val", "valid", "dev")}[which]
        for name in names:
            src, tgt = (_language_file(folder, name, lang) for lang in (data.src_lang, data.tgt_lang))
            if src is not None and tgt is not None:
                return read_parallel(src, tgt, encoding_errors=data.encoding_errors)
        if which == "train":
            absent = [f"train.{lang} or train.{lang}.gz" for lang in (data.src_lang, data.tgt_lang)
                      if _language_file(folder, "train", lang) is None]
            raise InputError(f"{folder} holds no {' and no '.join(absent)} (its train.* files have suffixes {langs})")
        return None
    return read_pair_files(find_files(paths), encoding_errors=data.encoding_errors)


def _language_file(folder: Path, name: str, lang: str) -> Path | None:
    """folder/NAME.LANG, or NAME.LANG.gz (gzip-compressed, which `read_parallel` reads alike); None if neither."""
    return next((path for path in (folder / f"{name}.{lang}", folder / f"{name}.{lang}.gz") if path.is_file()), None)


def read_pair_files(files: list, *, encoding_errors: str) -> list[tuple[str, str]]:
    """One TSV file (source<TAB>target) or two line-aligned files (source first)."""
    if len(files) == 1:
        return read_tsv_pairs(files[0], encoding_errors=encoding_errors)
    if len(files) == 2:
        return read_parallel(files[0], files[1], encoding_errors=encoding_errors)
    raise InputError(f"translation data is a folder, one TSV file (source<TAB>target) or two line-aligned files "
                     f"(source first); got {len(files)} files")


def pairs(data: Any, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The training and validation pairs the data settings name."""
    generated = synthetic_split(data, seed)
    if generated is not None:
        train, val = generated
        return train.pairs(), val.pairs()
    if not data.data:
        raise InputError("--task translate needs --data (a folder with train.SRC/train.TGT, a TSV file, two files "
                         "or synthetic:reverse)")
    train = _read_pairs(data.data, data, "train")
    val = _read_pairs(data.val_data, data, "val") if data.val_data else None
    if val is None and not data.val_data and len(data.data) == 1 and Path(data.data[0]).is_dir():
        val = _read_pairs(data.data, data, "val")
    return (train, val) if val is not None else split(train, data.val_fraction, seed)


def _training_text(data: Any, seed: int) -> list[str]:
    return [text for pair in pairs(data, seed)[0] for text in pair]  # one vocabulary for both sides


def _make(context: TaskContext) -> tuple[TranslateTask, None]:
    data = context.data
    train, val = pairs(data, context.seed)
    batch = dict(batch_size=context.batch_size, seed=context.seed)
    return TranslateTask(
        PairData.from_pairs(train, context.tokenizer, max_len=context.seq_len, batch_tokens=data.batch_tokens,
                            **batch),
        PairData.from_pairs(val, context.tokenizer, max_len=context.seq_len, **batch),
        tokenizer=context.tokenizer, references=[t for _, t in val], translate=context.translate,
        bleu_samples=data.bleu_samples, beam_size=data.bleu_beam_size, context_len=context.config.max_seq_len,
    ), None


def _report(ctx: EvalContext) -> EvalReport:
    if ctx.translate_texts is None:
        raise ConfigError("evaluating a translation run needs translate_texts (the CLI passes the loaded pipeline's)")
    pairs_ = read_pair_files(ctx.files, encoding_errors=ctx.settings.encoding_errors)
    if ctx.model is not None:
        check_direction(ctx.model, ctx.tokenizer, pairs_, where=" + ".join(map(str, ctx.files)),
                        max_len=ctx.config.max_seq_len, batch_size=ctx.settings.batch_size)
    sources, references = [s for s, _ in pairs_], [t for _, t in pairs_]
    scores = translation_scores(ctx.translate_texts(sources), references)
    row = {"file": " + ".join(map(str, ctx.files)), "sentences": len(pairs_), "bleu": scores["bleu"],
           "bleu_lowercased": scores["bleu_lowercased"], "chrf": scores["chrf"]}
    details = {k: scores[k] for k in ("bleu_signature", "bleu_lowercased_signature", "chrf_signature")}
    notes = [f"BLEU: {details['bleu_signature']}",
             f"BLEU lowercased (the published Multi30k protocol): {details['bleu_lowercased_signature']}",
             f"chrF: {details['chrf_signature']}"]
    return EvalReport("translation", str(ctx.run), [row], details,
                      columns=("file", "sentences", "bleu", "bleu_lowercased", "chrf"), notes=notes)


@torch.inference_mode()
def check_direction(model: nn.Module, tokenizer: Tokenizer, pairs_: Sequence[tuple[str, str]], *, where: str,
                    max_len: int, batch_size: int = 32) -> None:
    """Refuse evaluation pairs given in the run's reverse direction (its target language as their sources), which
    would be scored as a BLEU near 0 without a word: the model's loss a target token (teacher forcing) on up to
    `DIRECTION_PAIRS` of the pairs as given and with source and target swapped; the swapped pairs fitting it
    better by more than `DIRECTION_MARGIN` nats a token says the decoder reads the given targets' language as its
    input. A model that knows neither direction (untrained, or a symmetric task such as copying) passes.

    Raises InputError naming the files, both losses and the fix (the files in the other order).
    """
    sample = list(pairs_[::max(1, len(pairs_) // DIRECTION_PAIRS)][:DIRECTION_PAIRS])
    given, swapped = (_target_loss(model, tokenizer, p, max_len, batch_size)
                      for p in (sample, [(t, s) for s, t in sample]))
    if given - swapped > DIRECTION_MARGIN:
        raise InputError(
            f"{where}: the pairs look swapped for this run: its model scores their sources given their targets at "
            f"{swapped:.2f} nats a token, and their targets given their sources at {given:.2f}, so their target side "
            "is in the run's source language. Give the source-language side first (--data SOURCE_FILE TARGET_FILE, "
            "or a TSV of source<TAB>target)"
        )


def _target_loss(model: nn.Module, tokenizer: Tokenizer, pairs_: list[tuple[str, str]], max_len: int,
                 batch_size: int) -> float:
    """The model's mean loss a target token on `pairs_` (teacher forcing): training's validation loss."""
    data = PairData.from_pairs(pairs_, tokenizer, max_len=max_len, batch_size=batch_size)
    return TranslateTask(data, data, tokenizer=tokenizer, references=[]).evaluate(model)["val_loss"]


# The command (attnkit translate) -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TranslateSettings(InputSettings, DecodeSettings):
    output: str | None = None  # write one translation per line here; none: print them
    beam_size: int = 1  # 1 is greedy
    length_penalty: float = 1.0  # beam score = log p / length ** this
    early_stopping: bool = True  # beam search ends a source at beam-size finished hypotheses (off: while one could win)
    num_return_sequences: int = 1  # each text's n best translations, best first, n lines per text (n <= beam size)
    max_length: int | None = None  # target tokens at most; none: 2 x source + 10
    repetition_penalty: float = 1.0  # > 1 makes tokens the translation holds less likely (transformers'); 1: off
    no_repeat_ngram_size: int = 0  # never repeat n tokens in a row in a translation (Marian's 3); 0: off


def run_translate(settings: TranslateSettings, load: Callable[[Any], Any]) -> int:
    """`attnkit translate`; `load(settings)` loads the run (the command line passes `attnkit.cli.load_pipeline`).
    An --output that cannot be written (a directory) is refused before the run loads, not after the translating."""
    texts = read_inputs(settings)
    if settings.output:
        check_output(settings.output, directory=False, overwrite=True, flag="--output")
    translations = load(settings).translate(
        texts, beam_size=settings.beam_size, length_penalty=settings.length_penalty,
        early_stopping=settings.early_stopping, max_length=settings.max_length, batch_size=settings.batch_size,
        progress=settings.input is not None, num_return_sequences=settings.num_return_sequences,
        repetition_penalty=settings.repetition_penalty, no_repeat_ngram_size=settings.no_repeat_ngram_size,
    )
    if settings.output:
        atomic_write(settings.output, "".join(f"{line}\n" for line in translations))
    else:
        print("\n".join(translations))
    return 0


TRANSLATE = register(TaskSpec(
    name="translate", help="sequence to sequence (encoder-decoder, recurrent seq2seq)",
    seed_draws_validation="without_val_data",
    families=("encoder-decoder", "recurrent-seq2seq"), make=_make, evaluate_files=_report, method="translate",
    decodes=True, training_text=_training_text,
    options=("val_data", "src_lang", "tgt_lang", "val_fraction", "bleu_samples", "bleu_beam_size", "batch_tokens",
             "encoding_errors"),
    default_model=dict(family="encoder-decoder", d_model=256, n_layers=3, n_heads=8, d_ff=1024,
                       position="sinusoidal", norm="layer", norm_position="pre", activation="relu", max_seq_len=128,
                       dropout=0.1, scale_embeddings=True, tie_embeddings=True, label_smoothing=0.1),
    hf_architectures=(HFClass("MarianMTModel", "marian"),),
    eval_help="a TSV file (source<TAB>target) or two line-aligned files: BLEU and chrF",
    eval_options=("beam_size", "batch_size", "int8", "int8_dynamic", "int4"),
    command=TaskCommand("translate", "translate with a trained encoder-decoder (greedy or beam search)",
                        TranslateSettings, run_translate),
))
