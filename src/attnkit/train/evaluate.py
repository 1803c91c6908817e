"""`attnkit eval`: a trained or converted run scored on the user's own held-out files, by the evaluation its task
registers (`attnkit.tasks`), the same loop that scores the validation data during training:

    lm          perplexity with a sliding window, per token, per character and as bits per byte (so models
                with different tokenizers compare)
    mlm         loss and accuracy at masked tokens (masks drawn from --seed)
    translate   sacreBLEU (cased, detokenized), BLEU on the published lowercased protocol and chrF of the run's
                translations of a TSV file or two line-aligned files, with the metrics' signatures
    classify    accuracy, macro-F1 and a confusion matrix (table and PNG) on labelled files
    tag         entity precision, recall and F1 (seqeval) and token accuracy on CoNLL or .conllu files

This module never imports `attnkit.generate` (train/ and generate/ are siblings): translation takes the function
that translates texts as an argument; the CLI passes the loaded pipeline's.

`attnkit eval` is `run_eval(EvalSettings(...))`: the settings' fields are the command's flags. A run reads the
fields every task reads (`EVERY_TASK`) and those its task's registration names (`TaskSpec.eval_options`); the
command shows only those for the run it is given (`inapplicable` names the others) and refuses them given.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from attnkit.checkpoint import (
    TOKENIZER_DIR,
    TRAIN_STATE_FILE,
    atomic_write,
    load_config,
    load_model,
    read_json,
    read_labels,
)
from attnkit.config import check_types
from attnkit.errors import ConfigError, InputError
from attnkit.machine import pick_device
from attnkit.options import fields_of, one_flag
from attnkit.outputs import refuse_root
from attnkit.tasks import EvalContext, EvalReport, TaskSpec, own_options, task_names, task_of_run, tasks, unread_options
from attnkit.textfiles import EncodingErrors
from attnkit.tokenize import Tokenizer, load_tokenizer
from attnkit.train.finetune import HFLoader, reference_loader
from attnkit.train.trainer import shows_progress

log = logging.getLogger(__name__)

TextTranslator = Callable[[list[str]], list[str]]  # source texts -> translations, in order
REPORT_FILE = "eval.json"
EVERY_TASK = ("run", "data", "average_last", "out", "device", "encoding_errors", "progress", "explain")  # any run


@dataclass(frozen=True)
class EvalSettings:
    """What `attnkit eval` scores and how; each field is one of its flags.

    Raises:
        ConfigError: on a value out of range, naming the field and a sensible value.
    """

    run: str  # run directory: config.json, model.safetensors, tokenizer/ (a converted Hugging Face run too)
    data: tuple[str, ...]
    """text files (LM, masked LM), a TSV or two line-aligned files (translator), labelled files (classifier), CoNLL
    or .conllu files (tagger)"""
    window: int | None = None  # perplexity: tokens the model reads at once; None: its max_seq_len
    stride: int | None = None  # perplexity: tokens each window moves on; None: half the window; = window: no overlap
    batch_size: int = 32  # classification, tagging, translation: examples per forward pass; masked LM: windows
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
    int4: bool = False  # score it with 4-bit weights, as generate --int4 runs it (CPU)
    seed: int | None = None  # masked LM: the masks' seed; none: the run's training seed (its evaluation's masks)
    explain: bool = False  # print the inference plan (layouts, kernels, int8) the model is scored with, on stderr

    def __post_init__(self) -> None:
        _ = self.quantize  # two forms given together are refused when the settings are built
        if not self.data:
            raise _no_data()
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
        return one_flag("forms of quantized weights", int8=self.int8, int8_dynamic=self.int8_dynamic, int4=self.int4)


def applicable(spec: TaskSpec) -> set[str]:
    """The options of `attnkit eval` a run of task `spec` reads: every task's `EvalSettings` fields, those its
    registration names and its own options (`TaskSpec.own_options`)."""
    return {*EVERY_TASK, *spec.eval_options, *spec.own_option_names()}


def inapplicable(spec: TaskSpec, run: str | Path) -> dict[str, str]:
    """The options of `attnkit eval` that `run`, a run of `spec`, does not read, each with why (the tasks it is
    for): `EvalSettings` fields and the other tasks' own options. The command hides them and refuses them given,
    on its command line or in its --config file."""
    return unread_options(spec, [*fields_of(EvalSettings), *own_options()], applicable, run)


def run_eval(
    settings: EvalSettings,
    *,
    translate: TextTranslator | None = None,
    model: nn.Module | None = None,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    task_options: dict[str, Any] | None = None,
    load_hf: HFLoader | None = None,
) -> EvalReport:
    """`attnkit eval`: `evaluate_run` with `settings` (see it for `translate`, `model`, `prepare`, `task_options`,
    `load_hf` and what is raised)."""
    return evaluate_run(
        settings.run, list(settings.data), device=pick_device(settings.device), settings=settings,
        translate=translate, model=model, out_dir=settings.out, progress=shows_progress(settings.progress),
        prepare=prepare, details={"quantize": settings.quantize} if settings.quantize else None,
        task_options=task_options, load_hf=load_hf,
    )


def evaluate_run(
    run_dir: str | Path,
    data: Sequence[str | Path],
    *,
    device: torch.device | str = "cpu",
    settings: EvalSettings | None = None,
    translate: TextTranslator | None = None,
    model: nn.Module | None = None,
    out_dir: str | Path | None = None,
    progress: bool = False,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    details: dict[str, Any] | None = None,
    task_options: dict[str, Any] | None = None,
    load_hf: HFLoader | None = None,
    **options: Any,
) -> EvalReport:
    """Score the run in `run_dir` on the files `data` with its task's evaluation (module docstring).

    settings: the scoring options (`EvalSettings`: window, stride, batch_size, encoding_errors, bad_labels, seed);
        `options` are taken instead when no settings are given (e.g. window=64, stride=32).
    translate: the function that translates texts (needed for a translation run); model: the run's model it
        translates with, already loaded (the CLI passes its pipeline's), which scores the pairs' direction (loaded
        here when not given).
    prepare: applied to the loaded model before scoring (the CLI passes int8 quantization); details: added to
        the report (e.g. {"quantize": "int8"}) and to eval.json.
    out_dir: where eval.json (and pictures such as confusion.png) go; default `run_dir/eval`.
    task_options: the task's own options (`TaskSpec.own_options`, e.g. tag_column={"tag_column": "NER"}); those
        not given are the run's training values, else their defaults.
    load_hf: reads a Hugging Face directory (`attnkit.interop.hf.load`; the CLI passes it), for a run fine-tuned
        from one whose task scores against the weights it started from (dpo's reference).
    Raises InputError / ConfigError / CheckpointError naming what is wrong and how to fix it (InputError where
    `out_dir` is the file system's root).
    """
    run_dir = Path(run_dir)
    settings = settings or EvalSettings(run=str(run_dir), data=tuple(map(str, data)), **options)
    if not data:
        raise _no_data()
    config = load_config(run_dir)
    spec = task_of_run(run_dir, config)
    if spec is None:
        raise InputError(
            f"{run_dir} holds a {config.family} model without a task head, which eval cannot score; fine-tune it "
            f"first, e.g. attnkit train --task classify --init-from {run_dir} ... (tasks: {', '.join(task_names())})"
        )
    if spec.decodes and translate is None:
        raise ConfigError(f"evaluating a {spec.name} run needs translate= (the CLI passes the loaded pipeline's)")
    tokenizer = _run_tokenizer(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "eval"
    refuse_root(out_dir)  # before the scoring: eval.json and the pictures would land among the system's folders
    if spec.decodes:  # translated through `translate`; the model checks the files (their direction)
        model = model if model is not None else load_model(run_dir, device=device)[0]
    else:
        model, _ = load_model(run_dir, device=device)
        model = prepare(model) if prepare is not None else model
    state = _train_state(run_dir)
    settings = _with_run_defaults(settings, state)
    report = spec.evaluate_files(EvalContext(
        run=run_dir, model=model, config=config, tokenizer=tokenizer, labels=read_labels(run_dir),
        files=[str(p) for p in data], settings=settings, out=out_dir, translate_texts=translate, progress=progress,
        options=_own_options(spec, state, task_options or {}),
        reference=reference_loader(run_dir, state, load_hf=load_hf),
    ))
    report.details.update(details or {})
    atomic_write(out_dir / REPORT_FILE, json.dumps(report.to_dict(), indent=1) + "\n")
    report.details["json"] = str(out_dir / REPORT_FILE)
    return report


def _no_data() -> InputError:
    """The files each task's evaluation reads, as its registration says."""
    wants = "; ".join(f"{spec.name}: {spec.eval_help}" for spec in tasks() if spec.eval_help)
    return InputError(f"eval needs --data FILE... ({wants})")


def _train_state(run_dir: Path) -> dict[str, Any]:
    """The run's train_state.json (empty for a converted run)."""
    path = run_dir / TRAIN_STATE_FILE
    return read_json(path) if path.is_file() else {}


def _with_run_defaults(settings: EvalSettings, state: dict[str, Any]) -> EvalSettings:
    """A seed left unset is the run's training seed, else 0."""
    if settings.seed is None:
        settings = replace(settings, seed=int(state.get("settings", {}).get("seed", 0)))
    return settings


def _own_options(spec: TaskSpec, state: dict[str, Any], given: dict[str, Any]) -> Any:
    """The task's own options: those `given`, else the run's training values, else their defaults; None for a task
    without (`TaskSpec.own_options`)."""
    if spec.own_options is None:
        return None
    names = fields_of(spec.own_options)
    saved = {k: v for k, v in state.get("data_config", {}).items() if k in names}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not an option of a {spec.name} run's evaluation; its own are "
                          f"{', '.join(names)}")
    options = spec.own_options(**{**saved, **given})
    check_types(options)
    return options


def _run_tokenizer(run_dir: Path) -> Tokenizer:
    if not (run_dir / TOKENIZER_DIR).is_dir():
        raise InputError(f"{run_dir} has no tokenizer/ directory, so its model cannot read text files; save the "
                         "tokenizer it was trained with there")
    return load_tokenizer(run_dir / TOKENIZER_DIR)
