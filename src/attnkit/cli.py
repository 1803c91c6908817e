"""The `attnkit` command line: parse, build the settings, call the library.

Every option is generated from a typed settings dataclass (`attnkit.options`): its flag, type, choices, default
and help come from the field itself, so nothing here restates a config. Every command also takes `--config
FILE.json|yaml`, a file of its settings, with the command line on top.

Adding a command:
    1. a settings dataclass in your own module: typed fields with defaults (none: required), a comment after
       each field (its help), `Literal[...]` for choices; e.g. `EvalSettings` in train/evaluate.py;
    2. a run function here, `_run_NAME(settings) -> int` (exit code), that calls the library and prints;
    3. one `Command(...)` line in COMMANDS below, naming the dataclass as "attnkit.module:NameSettings" when
       its module is slow to import (it is then imported only when the command is used).
A task's own command (generate, translate, classify, tag, fill-mask) is instead part of its registration
(`attnkit.tasks.TaskCommand`): COMMANDS lists every registered task's. tests/test_cli.py then checks that every
option has help and shows its settings' default.

Conventions (docs/guides/cli.md): a command that reads a run takes it as a positional RUN (`--run RUN` works too);
a command's settings class is the one place that says which options it shows (classify's has no decoding
options), and a command whose options depend on the task it runs (`Command.task` and `Command.inapplicable`: train
from --task or what names it, eval from its RUN) reads that task first, shows only its options and refuses the
others, on the command line and in --config, in one line naming their tasks; a usage error prints the command's
own usage and suggests the nearest name for an unknown flag or choice; a command checks what is cheap (names, task
against family) before anything slow starts.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from attnkit import options
from attnkit.config import model_field_names
from attnkit.errors import AttnkitError, InputError, nearest, os_error_message
from attnkit.interop.gguf import GGUFType
from attnkit.interop.hf_shards import MAX_SHARD_SIZE
from attnkit.interop.keymaps import supported_lines
from attnkit.run_settings import WeightDType
from attnkit.textfiles import EncodingErrors
from attnkit.tokenize import BPE_VOCAB_SIZE
from attnkit.version import installed_version

if TYPE_CHECKING:
    from attnkit.experiments.base import ExperimentSettings
    from attnkit.generate import Pipeline
    from attnkit.run_settings import LoadSettings
    from attnkit.train import TrainRequest
    from attnkit.train.average import AverageSettings
    from attnkit.train.evaluate import EvalSettings
    from attnkit.viz.run import VizSettings

Settings = type | str  # a dataclass, or "module:Name" for one imported only when its command runs
RUN = ("run",)  # settings fields every command takes as a positional argument, their --flag accepted too


@dataclass(frozen=True)
class Command:
    """One subcommand: a settings dataclass (every field one option) and the function that runs it.

    `run(settings)` returns the exit code. With `sections`, (group title, dataclass) pairs whose options the
    command takes as well, `run(settings, *given)` gets one dict per section holding only the options given
    (on the command line or in --config): `train` passes them on as "not given: the default, or the resumed
    run's". `adapt_file` turns a --config file's keys into the command's before they are used. A dataclass
    named as "module:Name" is imported only when its command is parsed, so `attnkit generate` does not wait
    for the training and experiment modules to import.
    """

    name: str  # "train", or "tokenizer train" for a command inside a group
    help: str
    settings: Settings
    run: Callable[..., int]
    sections: tuple[tuple[str, Settings], ...] = ()
    description: str | None = None
    epilog: str | None = None
    adapt_file: Callable[[dict[str, Any], str], dict[str, Any]] | None = None  # for a recipe's section too
    recipe: str | None = None  # the recipe section it can start from ("train", "evaluate"): --recipe, --data-root
    task: Callable[[Command, list[str]], tuple[Any, Any] | None] | None = None
    """how its command line names the task it runs, read cheaply: (`argv` -> (the run it is read from or None,
    its TaskSpec), or None when none is named; `run_task`: eval's RUN, `train_task`); with `inapplicable`"""
    inapplicable: Callable[..., dict[str, str]] | str | None = None
    """(TaskSpec, that run) -> the options a run of that task does not read, each with why (a function, or
    "module:function"): the command then shows only the others, and refuses them given"""

    def classes(self) -> list[type]:
        """The settings dataclass, then each section's."""
        return [_resolve(self.settings), *(_resolve(cls) for _, cls in self.sections)]

    def hidden(self, argv: list[str]) -> dict[str, str]:
        """The options that do not apply to the task `argv` names (`task`, `inapplicable`), each with the reason;
        none when the command's options do not depend on a task, or the command line names no task."""
        found = self.task(self, argv) if self.task is not None else None
        if found is None:
            return {}
        return _resolve(self.inapplicable)(found[1], found[0])


def _resolve(settings: Settings) -> Any:
    if isinstance(settings, str):
        module, _, name = settings.partition(":")
        return getattr(import_module(module), name)
    return settings


GROUPS = {"tokenizer": "train a tokenizer, or show how one splits a text"}


# presets --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PresetsSettings:
    name: str | None = field(default=None, metadata={"positional": True})  # a preset to print whole (JSON)
    """print this preset's whole config as JSON; none: the table of all presets"""


def _run_presets(settings: PresetsSettings) -> int:
    from attnkit import count_parameters, presets

    if settings.name is not None:
        print(presets.get(settings.name).to_json())
        return 0
    header = ("preset", "family", "params", *presets.COLUMNS)
    rows = [header]
    for name in presets.names():
        c = presets.get(name)
        rows.append((name, c.family, _human(count_parameters(c)), *presets.summary(c).values()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _human(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.2f}{unit}"
    return str(count)


# recipes --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecipesSettings:
    name: str | None = field(default=None, metadata={"positional": True})
    """print this recipe's whole file (JSON); none: every recipe with its description and result"""


def _run_recipes(settings: RecipesSettings) -> int:
    from attnkit import recipes

    if settings.name is not None:
        print(recipes.load(settings.name).path.read_text(encoding="utf-8"), end="")
        return 0
    found = [recipes.load(name) for name in recipes.names()]
    width = max(len(r.name) for r in found)
    for recipe in found:
        print(f"{recipe.name.ljust(width)}  {recipe.description}")
        print(f"{'':{width}}  result: {recipe.summary()}")
    return 0


# tokenizer ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizerTrainSettings:
    out: str  # directory to save the tokenizer in
    data: tuple[str, ...] = ()  # files, folders or globs; none: the Python standard library's source
    kind: Literal["char", "bpe", "wordpiece"] = "bpe"
    """char: one token per character; bpe: byte-level BPE (GPT-2's); wordpiece: BERT's WordPiece, with [CLS] [SEP]
    [MASK] [PAD] [UNK]"""
    vocab_size: int | None = None
    """BPE or WordPiece vocabulary size, special tokens included; none: train's default --vocab-size (2048)"""
    lowercase: bool = True  # wordpiece: lower-case and strip accents (uncased BERT); --no-lowercase: cased BERT
    max_bytes: int | None = None  # the corpus's first whole files up to this many bytes (at least one file)
    encoding_errors: EncodingErrors = "strict"  # strict: a file that is not UTF-8 is an error; replace: U+FFFD
    overwrite: bool = False  # replace a tokenizer saved there before
    progress: bool | None = None  # draw progress bars while the text is read and merged; none: on a terminal


def _run_tokenizer_train(settings: TokenizerTrainSettings) -> int:
    from attnkit.data.corpus import resolve_files
    from attnkit.outputs import atomic_output, check_output
    from attnkit.tokenize import META_FILE, SIZED_KINDS, train_tokenizer
    from attnkit.train.trainer import shows_progress

    out = Path(settings.out)
    if settings.kind not in SIZED_KINDS and settings.vocab_size is not None:
        raise InputError(f"--vocab-size {settings.vocab_size} sets the size of a BPE or WordPiece, and --kind "
                         f"{settings.kind} has its own vocabulary (a char tokenizer's is the text's characters): drop "
                         "--vocab-size, or use --kind bpe or wordpiece")
    if settings.kind != "wordpiece" and not settings.lowercase:
        raise InputError(f"--no-lowercase keeps the case of a WordPiece's text, and --kind {settings.kind} keeps every "
                         "character as it is: drop --no-lowercase, or use --kind wordpiece")
    _refuse_run_tokenizer(out)
    if settings.overwrite and out.is_dir() and any(out.iterdir()) and not (out / META_FILE).is_file():
        raise InputError(f"--out {out} holds files and no tokenizer attnkit saved ({META_FILE}); --overwrite "
                         "replaces only a tokenizer: choose another --out")
    check_output(out, directory=True, overwrite=settings.overwrite)
    files = resolve_files(list(settings.data) or None, max_bytes=settings.max_bytes)
    tok = train_tokenizer(settings.kind, files, vocab_size=settings.vocab_size or BPE_VOCAB_SIZE,
                          encoding_errors=settings.encoding_errors, lowercase=settings.lowercase,
                          progress=shows_progress(settings.progress))
    with atomic_output(out, directory=True, overwrite=settings.overwrite) as partial:
        tok.save(partial)
    print(f"{tok.kind} tokenizer, {tok.vocab_size} tokens, from {len(files)} files -> {settings.out}")
    return 0


def _refuse_run_tokenizer(out: Path) -> None:
    """A run's tokenizer (RUN/tokenizer, or a run directory itself) is part of the run: its model's ids mean its
    tokens, so `tokenizer train` never writes there."""
    from attnkit.checkpoint import CONFIG_FILE, TOKENIZER_DIR

    for run in (out, out.parent) if out.name == TOKENIZER_DIR else (out,):
        if (run / CONFIG_FILE).is_file():
            raise InputError(f"--out {out} is inside the run {run}, whose model reads its own tokenizer: a new one "
                             "would change what its token ids mean; choose another --out")


@dataclass(frozen=True)
class TokenizerEncodeSettings:
    tokenizer: str  # a saved tokenizer directory, or one holding tokenizer.json
    text: str  # the text to split


def _run_tokenizer_encode(settings: TokenizerEncodeSettings) -> int:
    from attnkit.tokenize import explain, load_tokenizer, not_utf8

    if (refusal := not_utf8([settings.text], fix="give --text in UTF-8 (a terminal set to UTF-8 writes it so)")):
        raise refusal
    print(explain(load_tokenizer(settings.tokenizer), settings.text))
    return 0


# train ----------------------------------------------------------------------------------------------------------
_TRAIN_EPILOG = """\
examples:
  attnkit train --out runs/default                      # small decoder on the Python standard library
  attnkit train --data input.txt --tokenizer char --max-steps 2000 --out runs/shakespeare
  attnkit train --task translate --data multi30k --src-lang de --tgt-lang en --max-time 1h --out runs/de-en
  attnkit train --task classify --data sst2/stsa.binary.train --val-data sst2/stsa.binary.dev --out runs/sst2
  attnkit train --task chat --init-from runs/llama --data chats.jsonl --lora-rank 8 --out runs/llama-chat
  attnkit train --out runs/default --resume              # continue where it stopped (Ctrl-C saves first)
  attnkit train --config run.yaml --max-steps 500        # options from a file, the command line on top
  attnkit train --recipe shakespeare-char --data-root ../shared/data   # a shipped recipe (attnkit recipes)

Every field of the model config and of the training settings, and the data settings of the task, can be set
with --set KEY=VALUE.
--config FILE takes a JSON or YAML object of these options and fields (a file of model fields alone, such as a
run's config.json, is the model to start from).
"""


@dataclass(frozen=True)
class TrainRun:
    """`attnkit train`'s own options: the run directory and the model to start from."""

    out: str = "runs/default"  # run directory: config.json, model.safetensors, tokenizer/, checkpoints, metrics
    resume: str | bool = field(default=False, metadata={"const": True, "metavar": "PATH"})
    """continue the run in --out, or the run or checkpoint at PATH (e.g. runs/x/best)"""
    overwrite: bool = False
    """replace a run already in --out (kept aside until the new run saves its first checkpoint)"""
    force: bool = False  # start even when the model looks too large for the memory free
    device: str | None = None  # cpu, cuda or cuda:N; none: CUDA when available
    progress: bool | None = None  # draw a progress bar; --no-progress: log progress lines; none: on a terminal
    sample_tokens: int = 200  # lm: tokens of sample text printed after training (0: none)
    explain: bool = False  # print the training plan (loss path, compilation, kernels, host reads) and why, on stderr
    preset: str | None = None  # start from a model preset (see `attnkit presets`), e.g. gpt2-tiny
    model_config: str | None = field(default=None, metadata={"metavar": "FILE.json"})
    """start from a model config file (a run's config.json)"""
    set: tuple[str, ...] = field(default=(), metadata={"metavar": "KEY=VALUE"})
    """override any model, data or training setting, e.g. --set n_layers=6 (repeatable)"""

    def __post_init__(self) -> None:
        from attnkit.errors import ConfigError

        if isinstance(self.sample_tokens, bool) or not isinstance(self.sample_tokens, int) or self.sample_tokens < 0:
            raise ConfigError(f"sample_tokens={self.sample_tokens!r} must be a number of tokens (0: no sample)")
        if self.overwrite and (self.resume is True or self.resume and _inside(self.resume, self.out)):
            raise ConfigError(f"--resume continues the run in {self.out}, which --overwrite would replace: give one "
                              "of the two")


def _inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies under it (as written: symbolic links are not followed)."""
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(directory))


def _train_file(values: dict[str, Any], path: str) -> dict[str, Any]:
    """A --config file for `train`: a file of model fields alone is the model config to start from; in a file of
    options, model fields become --set assignments before the command line's."""
    import json

    model_fields = model_field_names()
    if values and set(values) <= model_fields:
        return {"model_config": path}
    model = [f"{k}={json.dumps(v)}" for k, v in values.items() if k in model_fields]
    rest = {k: v for k, v in values.items() if k not in model_fields}
    return {**rest, "set": (*model, *rest.get("set", ()))} if model else rest


def train_request(run: TrainRun, data: dict[str, Any], training: dict[str, Any], *own: dict[str, Any]
                  ) -> TrainRequest:
    """The job `attnkit train` asks for: its own options, and the data and training options given (`own`: those of
    each task's own section, `TaskSpec.own_options`, data settings too)."""
    from attnkit.train import TrainRequest

    data = {k: v for section in (data, *own) for k, v in section.items()}
    return TrainRequest(
        out=run.out, task=data.pop("task", None), preset=run.preset, config_file=run.model_config,
        overrides=list(run.set), data=data, settings=training, resume=run.resume, overwrite=run.overwrite,
        device=run.device, progress=run.progress, force=run.force,
    )


def _run_train(run: TrainRun, data: dict[str, Any], training: dict[str, Any], *own: dict[str, Any]) -> int:
    from attnkit.generate import translate_batched
    from attnkit.interop import hf
    from attnkit.train import prepare
    from attnkit.train.job import check_request

    request = train_request(run, data, training, *own)
    if not request.resume:  # names, task against family, --set keys: refused before a tokenizer is trained
        check_request(request)
    trainer = prepare(request, translate=translate_batched, load_hf=hf.load)
    if run.explain and trainer.parallel.writes:
        print(trainer.plan.explain(), file=sys.stderr)
    result = trainer.fit()
    if result.signal is not None:
        return trainer.parallel.stopped_status(result.signal)
    if not trainer.parallel.writes:  # under torchrun, rank 0 alone prints
        return 0
    summary = "  ".join(f"{k} {v:.4g}" for k, v in result.evaluation.items())
    speed = f"{result.tokens_per_second:,.0f} tokens/s"
    print(f"trained {result.step} steps in {result.elapsed:.0f} s ({speed}); validation: {summary}")
    if trainer.settings.average_last:
        from attnkit.checkpoint import checkpoint_dirs
        from attnkit.train.average import average_run

        last = min(trainer.settings.average_last, len(checkpoint_dirs(run.out)))
        print(f"averaged the last {last} checkpoints: {average_run(run.out, last=last)}")
    from attnkit.viz import plot_run_instruments

    if plot_run_instruments(run.out) is not None:
        print(f"training instruments per layer: {run.out}/plots/instruments.png")
    from attnkit.tasks import task_spec

    if task_spec(trainer.task.name).method == "generate" and run.sample_tokens > 0:
        from attnkit.generate import sample_after_training

        print("sample (prompt from the validation text, then the model's continuation):")
        print(sample_after_training(run.out, prompt=trainer.task.prompt_ids(), max_new_tokens=run.sample_tokens,
                                    stop=getattr(trainer.task, "stops", ()),  # a chat's: its marks and turn's end
                                    stop_tokens=sorted(getattr(trainer.task, "stop_ids", ()))))
    from attnkit.checkpoint import METRICS_FILE
    from attnkit.train.trainer import PLOT_FILE

    budget = "--max-time DURATION" if result.reason == "max_time" else "--max-steps N"  # the one that ended it
    print(f"saved to {run.out}: best checkpoint {run.out}/best, loss curves {run.out}/{PLOT_FILE}, every step in "
          f"{run.out}/{METRICS_FILE}")
    print(f"resume with: {trainer.parallel.resume_command(run.out)} {budget}")
    return 0


# the task a command line runs ----------------------------------------------------------------------------------
class _Peek(argparse.ArgumentParser):
    """A parser that raises instead of printing and exiting: for a look at a command line before the real parse."""

    def error(self, message: str):  # type: ignore[override]
        raise ValueError(message)


def _peek_layers(command: Command, argv: list[str]) -> list[dict[str, Any]] | None:
    """The options `argv` gives `command` as `invocation` layers them (the recipe's, the --config file's, the
    command line's; a recipe's data paths unchecked), one dict per settings class: a look at the command line
    before its parser is built. None when they do not read."""
    peek = _Peek(add_help=False)
    add_command_options(peek, command)
    words = [w for w in argv[argv.index(command.name.split()[-1]) + 1:] if w not in ("-h", "--help")]
    try:
        return _layers(command, peek.parse_known_args(words)[0], paths=False)
    except (ValueError, AttnkitError, OSError):
        return None


def run_task(command: Command, argv: list[str]) -> tuple[str, Any] | None:
    """The run `argv` names for `command` (positional RUN, --run, or the --config file's run) and its task
    (`attnkit.tasks.task_of_run`), read cheaply from its config.json and task.json; None when it names none, or none
    that loads."""
    from attnkit.checkpoint import load_config
    from attnkit.tasks import task_of_run

    run = (_peek_layers(command, argv) or [{}])[0].get("run")
    try:
        task = task_of_run(run, load_config(run)) if run is not None else None
    except (ValueError, AttnkitError, OSError):
        return None
    return (run, task) if task is not None else None


def train_task(command: Command, argv: list[str]) -> tuple[Path | None, Any] | None:
    """The run `argv` resumes (None: a new run) and the task it trains for (`attnkit.train.job.requested_task`:
    --task, else the --config file's or the recipe's, else the resumed run's, else the default); None when it names
    none that reads, or a model (--preset, --model-config) the default task does not train."""
    from attnkit.train.job import requested_task

    layers = _peek_layers(command, argv)
    try:
        found = requested_task(train_request(options.build(TrainRun, layers[0]), *layers[1:])) if layers else None
    except (ValueError, AttnkitError, OSError):
        return None
    return (found[1], found[0]) if found is not None else None


def _train_inapplicable(spec: Any, run: Path | None) -> dict[str, str]:
    """`attnkit train`'s options that a run of `spec` does not read: other tasks' data settings and own options
    (`attnkit.train.job.inapplicable`), and --sample-tokens where the task does not generate text."""
    from attnkit.train.job import inapplicable

    return inapplicable(spec, run, also={"sample_tokens": lambda task: task.method == "generate"})


# eval -----------------------------------------------------------------------------------------------------------
def _run_eval(settings: EvalSettings, *own: dict[str, Any]) -> int:
    """`own`: the options given of each task's own section (`TaskSpec.own_options`)."""
    from attnkit.checkpoint import load_config
    from attnkit.tasks import task_of_run
    from attnkit.train.evaluate import run_eval

    task_options = {k: v for section in own for k, v in section.items()}
    config = load_config(settings.run)
    task = task_of_run(settings.run, config)  # another task's options were refused as the command line was parsed
    if settings.average_last:  # the mean of the run's checkpoints: a run of the same model and task
        from attnkit.train.average import average_run

        averaged = average_run(settings.run, last=settings.average_last)
        settings = replace(settings, run=str(averaged))
    translate, prepare, model = None, None, None
    if task is not None and task.decodes:  # scored on the texts the pipeline translates
        from attnkit.generate import load

        pipeline = load(settings.run, device=settings.device, quantize=settings.quantize)
        model = pipeline.model
        if settings.explain and pipeline.plan is not None:
            print(pipeline.plan.explain(), file=sys.stderr)

        def translate(texts: list[str]) -> list[str]:
            return pipeline.translate(texts, beam_size=settings.beam_size, batch_size=settings.batch_size,
                                      progress=settings.progress is not False)

    else:  # scored in whole passes, the model prepared by its inference plan (int8 as `attnkit.load` quantizes)
        from attnkit.generate.plan import plan_inference

        def prepare(model):
            plan = plan_inference(model, config.family, quantize=settings.quantize, decoding=False)
            if settings.explain:
                print(plan.explain(), file=sys.stderr)
            return plan.apply(model)

    from attnkit.interop import hf

    report = run_eval(settings, translate=translate, model=model, prepare=prepare, task_options=task_options,
                      load_hf=hf.load)
    print(report.table())
    print(f"saved {report.details['json']}")
    return 0


# average --------------------------------------------------------------------------------------------------------
def _run_average(settings: AverageSettings) -> int:
    from attnkit.checkpoint import read_json
    from attnkit.train.average import AVERAGE_FILE, average_run

    out = average_run(settings.run, last=settings.last, out=settings.out)
    steps = read_json(out / AVERAGE_FILE)["steps"]
    which = f"step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))}"
    print(f"averaged the weights of {which} into {out}; use it as a run, e.g. attnkit eval {out} --data ...")
    return 0


# convert --------------------------------------------------------------------------------------------------------
_CONVERT_EPILOG = f"""\
examples:
  attnkit convert --from-hf path/to/gpt2 --out runs/gpt2       # then: attnkit generate runs/gpt2 --prompt ...
  attnkit convert runs/shakespeare --to-hf exported/            # transformers: AutoModel.from_pretrained("exported")
  attnkit convert runs/default --to-gguf model.gguf --type q8_0  # llama.cpp: llama-cli -m model.gguf
  attnkit convert runs/default --to-gguf model.gguf --type Q4_K_M  # llama.cpp's own quantizer (llama-cpp-python)
  attnkit convert runs/default --to-onnx exported-onnx/         # onnxruntime: model.onnx + tokenizer.json + ...

Reads and writes these Hugging Face architectures (model_type: classes), as directories written by
save_pretrained; nothing is downloaded:
{supported_lines()}
"""


@dataclass(frozen=True)
class ConvertSettings:
    from_hf: str | None = field(default=None, metadata={"metavar": "DIR"})
    """a Hugging Face model directory (config.json + safetensors) to write as a run; with --out"""
    run: str | None = None  # an attnkit run directory to write out for Hugging Face; with --to-hf
    out: str | None = field(default=None, metadata={"metavar": "NEW_RUN"})  # with --from-hf: the run to create
    to_hf: str | None = field(default=None, metadata={"metavar": "DIR"})  # with RUN: the directory to create
    max_shard_size: str = field(default=MAX_SHARD_SIZE, metadata={"metavar": "SIZE"})
    """with --to-hf: the largest weights file, as save_pretrained's max_shard_size (5GB, 500MB, 2GiB, or bytes);
    larger weights go in model-0000i-of-0000n.safetensors files with model.safetensors.index.json"""
    allow_pickle: bool = False
    """read pytorch_model.bin, a pickle (only from a source you trust), with torch.load(weights_only=True)"""
    dtype: WeightDType = "fp32"  # with --from-hf: the run's weight type
    to_gguf: str | None = field(default=None, metadata={"metavar": "OUT.gguf"})
    """with RUN: a GGUF file for llama.cpp (a decoder in a layout llama.cpp runs: see docs/guides/export.md)"""
    type: GGUFType = "f16"
    """with --to-gguf: the weights' GGUF type (norms and biases stay f32); the K-quants (Q4_K_M, Q6_K, ...) are made by
    llama.cpp's quantizer, with llama-cpp-python installed (pip install 'attnkit[kquants]')"""
    chat_template: str | None = field(default=None, metadata={"metavar": "FILE"})
    """with --to-gguf: a Jinja chat template; none: the run's own, else attnkit's (the one attnkit serve uses)"""
    to_onnx: str | None = field(default=None, metadata={"metavar": "DIR"})
    """with RUN: a folder for onnxruntime: the graph (decoders with past keys/values, encoders; encoder-decoders as
    three with Optimum's names: encoder, first decoder step, later steps), tokenizer.json, config, labels and
    runtime.json"""
    overwrite: bool = False  # replace an output attnkit wrote there before (a run, a model directory, a file)


_CONVERT_WITH = {"allow_pickle": "from_hf", "dtype": "from_hf", "type": "to_gguf", "chat_template": "to_gguf",
                 "max_shard_size": "to_hf"}
"""ConvertSettings fields -> the one they go with: given without it, they would change nothing"""


def _run_convert(settings: ConvertSettings) -> int:
    from attnkit.generate.pipeline import parse_dtype
    from attnkit.interop import hf

    if (settings.from_hf is None) == (settings.run is None):
        raise InputError("give --from-hf DIR --out runs/NAME (Hugging Face to a run) or RUN --to-hf DIR (a run to "
                         "Hugging Face), one of the two")
    fields = options.fields_of(ConvertSettings)
    for name, mode in _CONVERT_WITH.items():
        if getattr(settings, name) != options.field_default(fields[name]) and not getattr(settings, mode):
            raise InputError(f"{options.flag(name)} goes with {options.flag(mode)}, which this conversion does not "
                             "use; drop it")
    if settings.from_hf:
        if not settings.out or settings.to_hf:
            raise InputError("--from-hf DIR writes a run: give --out runs/NAME (and no --to-hf)")
        loaded = hf.convert_from_hf(settings.from_hf, settings.out, allow_pickle=settings.allow_pickle,
                                    dtype=parse_dtype(settings.dtype), overwrite=settings.overwrite)
        print(f"converted {loaded.architecture} from {settings.from_hf} to {settings.out}")
    else:
        targets = [name for name in ("to_hf", "to_gguf", "to_onnx") if getattr(settings, name)]
        if len(targets) != 1 or settings.out:
            raise InputError(f"{settings.run} is a run to write out: give one of --to-hf DIR, --to-gguf OUT.gguf or "
                             "--to-onnx DIR (--out names the run that --from-hf creates)")
        settings = _run_first(settings, targets[0])
        if settings.to_gguf:
            from attnkit.interop.gguf import convert_to_gguf

            written = convert_to_gguf(settings.run, settings.to_gguf, type=settings.type,
                                      chat_template=settings.chat_template, overwrite=settings.overwrite)
            print(f"wrote {settings.run} as llama.cpp's {written.architecture} ({settings.type}) to "
                  f"{settings.to_gguf}; chat template: {written.chat_template}")
        elif settings.to_onnx:
            from attnkit.interop.onnx import convert_to_onnx

            folder = convert_to_onnx(settings.run, settings.to_onnx, overwrite=settings.overwrite)
            for name, what in folder.files.items():
                print(f"wrote {folder.path / name}: {what}")
        else:
            architecture = hf.convert_to_hf(settings.run, settings.to_hf, overwrite=settings.overwrite,
                                            max_shard_size=settings.max_shard_size)
            print(f"wrote {settings.run} as a {architecture} to {settings.to_hf}")
    return 0


def _run_first(settings: ConvertSettings, target: str) -> ConvertSettings:
    """`convert --to-gguf RUN OUT.gguf` (the run right after the flag, the output last) as `convert RUN --to-gguf
    OUT.gguf`: an existing run (a directory holding config.json) is never an output, so the two orders cannot be
    confused."""
    from attnkit.checkpoint import CONFIG_FILE

    written_to = getattr(settings, target)
    if (Path(written_to) / CONFIG_FILE).is_file() and not (Path(settings.run) / CONFIG_FILE).is_file():
        return replace(settings, run=written_to, **{target: settings.run})
    return settings


# viz ------------------------------------------------------------------------------------------------------------
def _run_viz(settings: VizSettings) -> int:
    from attnkit.viz import run_viz

    result = run_viz(settings)
    for path in [*result.pngs, result.page, result.instruments]:
        if path is not None:
            print(path)
    return 0


# inspect --------------------------------------------------------------------------------------------------------
def _run_inspect(settings) -> int:
    from attnkit.inspect.command import run_inspect

    for path in run_inspect(settings):
        print(path)
    return 0


# experiment -----------------------------------------------------------------------------------------------------
def _run_experiment(settings: ExperimentSettings) -> int:
    from attnkit.experiments import REGISTRY, replot, run_experiment

    if settings.list:
        for name in sorted(REGISTRY):
            gpu = " [--device cuda too]" if "cuda" in REGISTRY[name].devices else ""
            print(f"{name}: {REGISTRY[name].claim} ({REGISTRY[name].lecture}){gpu}")
        return 0
    if settings.replot is not None:
        given = {"--out": settings.out is not None, "--seeds": settings.seeds is not None,
                 "--budget": settings.budget != "small", "--device": settings.device != "cpu",
                 "--no-resume": not settings.resume}
        for_a_run = [flag for flag, asked in given.items() if asked]
        if for_a_run:
            raise InputError(f"--replot redraws the plots in {settings.replot} from its results.json and runs nothing: "
                             f"{', '.join(for_a_run)} would be ignored; drop {'them' if len(for_a_run) > 1 else 'it'} "
                             "(to redraw elsewhere, copy the folder and --replot the copy)")
        redrawn = replot(settings.replot, name=settings.name)
        print(f"redrew {', '.join(redrawn)} in {settings.replot}" if redrawn else
              f"nothing to redraw in {settings.replot}: its experiment's plots need data results.json does not hold")
        return 0
    if settings.name is None:
        raise InputError("name the experiment to run (attnkit experiment --list shows them)")
    result = run_experiment(settings.name, budget=settings.budget, out=settings.out, progress=settings.progress,
                            device=settings.device, seeds=settings.seeds, resume=settings.resume)
    print(result.table_markdown())
    print(result.checks_markdown())
    print(result.summary())
    return 0


# lectures -------------------------------------------------------------------------------------------------------
def _run_lectures(settings) -> int:
    from attnkit.lectures import run

    return run(settings)


def _run_tune(settings) -> int:
    from attnkit.generate.tune import run_tune

    return run_tune(settings)


# serve ----------------------------------------------------------------------------------------------------------
def _run_serve(settings) -> int:
    from attnkit.serve import serve

    return serve(settings)


def load_pipeline(settings: LoadSettings) -> Pipeline:
    """The run as a Pipeline, loaded as `settings` say (`attnkit.load`); with --explain, its plan on stderr."""
    from attnkit.generate import load

    pipeline = load(settings.run, **settings.load_options())
    if settings.explain and pipeline.plan is not None:
        print(pipeline.plan.explain(), file=sys.stderr)
    return pipeline


def _task_names() -> tuple[str, ...]:
    from attnkit.tasks import task_names

    return task_names()


def _eval_description() -> str:
    """`attnkit eval --help`'s description: what each registered task's evaluation reads and reports."""
    from attnkit.tasks import tasks

    reads = "; ".join(f"{spec.name}: {spec.eval_help}" for spec in tasks() if spec.eval_help)
    return (f"Score a run on held-out files with its task's evaluation, the loop its training used ({reads}). "
            "Prints a table and writes eval.json. Given a run (attnkit eval RUN --help), it shows only the options "
            "of the run's task.")


def _own_sections() -> tuple[tuple[str, type], ...]:
    """A section for each class of tasks' own options (`TaskSpec.own_options`: tag's --tag-column), titled with
    the tasks that read it."""
    from attnkit.tasks import tasks

    readers: dict[type, list[str]] = {}
    for spec in tasks():
        if spec.own_options is not None:
            readers.setdefault(spec.own_options, []).append(spec.name)
    return tuple((f"--task {' or '.join(names)}", cls) for cls, names in readers.items())


def _task_commands() -> list[Any]:
    """The commands the registered tasks add (`TaskSpec.command`: generate, translate, classify, tag, fill-mask and
    any of a task registered from outside), in their registration's order."""
    from attnkit.tasks import tasks

    return [spec.command for spec in tasks() if spec.command is not None]


COMMANDS: list[Command] = [
    Command("recipes", "list the shipped training recipes with the results they reached, or print one",
            RecipesSettings, _run_recipes),
    Command("presets", "print the table of model presets (the lecture's comparison table), or one preset's config",
            PresetsSettings, _run_presets),
    Command("tokenizer train", "train a char, byte-level BPE or WordPiece tokenizer on text files",
            TokenizerTrainSettings, _run_tokenizer_train),
    Command("tokenizer encode", "print the ids and pieces of a text", TokenizerEncodeSettings, _run_tokenizer_encode),
    *(Command(c.name, c.help, c.settings, functools.partial(c.run, load=load_pipeline)) for c in _task_commands()),
    Command(
        "train", f"train a model for a task ({', '.join(_task_names())}), with checkpoints and resume", TrainRun,
        _run_train,
        sections=(("data", "attnkit.train.job:DataConfig"),
                  ("training (on resume, the run's own unless given)", "attnkit.train.trainer:TrainConfig"),
                  *_own_sections()),
        description="Train a decoder LM, an encoder-decoder translator, an encoder classifier or tagger, or a "
        "masked LM, or fine-tune a decoder on conversations (--task chat). Progress is shown; metrics.jsonl, a loss "
        "plot and checkpoints go to --out. Ctrl-C finishes the step, saves and exits. It shows the options of the "
        "task it will train: --task's, else the one a --recipe or --config file names, else the --resume'd run's, "
        "else the default (lm); the others are listed last.",
        epilog=_TRAIN_EPILOG, adapt_file=_train_file, recipe="train", task=train_task,
        inapplicable=_train_inapplicable,
    ),
    Command(
        "eval", "score a run on held-out files: perplexity, BLEU/chrF or accuracy/macro-F1",
        "attnkit.train.evaluate:EvalSettings", _run_eval,
        description=_eval_description(),
        recipe="evaluate", task=run_task, inapplicable="attnkit.train.evaluate:inapplicable",
        sections=_own_sections(),
    ),
    Command("average", "average the weights of a run's last N checkpoints into a model of its own",
            "attnkit.train.average:AverageSettings", _run_average,
            description="The mean of each weight over the newest --last checkpoints (Vaswani et al. 2017, 6.1), "
            "written as a run that loads, translates and evaluates like any other (not resumable)."),
    Command("convert", "convert Hugging Face model directories to attnkit runs and back", ConvertSettings,
            _run_convert, epilog=_CONVERT_EPILOG),
    Command("viz", "draw a run's attention over a text (PNGs and an HTML page) and its instruments",
            "attnkit.viz.run:VizSettings", _run_viz, task=run_task, inapplicable="attnkit.viz.run:inapplicable"),
    Command("inspect", "look inside a run: head importance, head types, the logit lens, activation patching, probes "
            "(JSON, markdown and a PNG)", "attnkit.inspect.command:InspectSettings", _run_inspect),
    Command("experiment", "run one of the lectures' claims as an experiment, ending in a verdict",
            "attnkit.experiments.base:ExperimentSettings", _run_experiment),
    Command("tune", "measure this machine's attention kernels and weight layouts into the profile the inference "
            "plan reads", "attnkit.generate.tune:TuneSettings", _run_tune),
    Command("lectures", "walk each course's lectures, topic by topic, to the tutorial, code, experiment, tests "
            "and picture that cover it (gaps named)", "attnkit.lectures:LecturesSettings", _run_lectures),
    Command("serve", "serve a run over HTTP: the OpenAI API (completions, chat, embeddings), its task's endpoint "
            "and the explorer page", "attnkit.serve.settings:ServeSettings", _run_serve, task=run_task,
            inapplicable="attnkit.serve.settings:inapplicable"),
]


class Parser(argparse.ArgumentParser):
    """argparse's parser, with each usage error told by the command it concerns (its own usage line) and a
    mistyped flag or choice answered with the nearest name."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # left over by the command's parser: its usage, not the top level's
            getattr(parsed, "command_parser", self).error(_unrecognized(parsed, extras))
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            guess = nearest(str(value), [str(choice) for choice in action.choices])
            if guess is not None:
                raise argparse.ArgumentError(action, f"invalid choice: {value!r}; did you mean {guess!r}?")
        super()._check_value(action, value)


def _unrecognized(args: argparse.Namespace, extras: list[str]) -> str:
    """The error for arguments the command does not take: each flag with the commands it belongs to, or else the
    nearest of the command's own."""
    command: Command | None = getattr(args, "command_spec", None)
    if command is None:
        return f"unrecognized arguments: {' '.join(extras)}"
    own = {flag.lstrip("-"): flag for flag in _flags(command)}  # compared without dashes, which all share
    notes = []
    for word in extras:
        name = word.partition("=")[0]
        if not name.startswith("--"):
            notes.append(word)
        elif others := [c.name for c in COMMANDS if c is not command and name in _flags(c)]:
            shown = others if len(others) <= 4 else others[:3]  # "and 1 more" would hide a name for no room
            which = ", ".join(shown) + (f" and {len(others) - 3} more" if len(others) > 4 else "")
            notes.append(f"{word} (an option of {which}, not of {command.name})")
        elif (guess := nearest(name.lstrip("-"), own)) is not None:
            notes.append(f"{word} (did you mean {own[guess]}?)")
        else:
            notes.append(f"{word} (attnkit {command.name} --help lists the options)")
    return f"unrecognized arguments: {'; '.join(notes)}"


@functools.cache
def _flags(command: Command) -> tuple[str, ...]:
    """The option strings `command` takes."""
    parser = argparse.ArgumentParser(add_help=False)
    add_command_options(parser, command)
    return tuple(flag for action in parser._actions for flag in action.option_strings)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given the `argv` it will parse, only the chosen command gets its options
    (each command's help and --help still work)."""
    chosen = _chosen(argv) if argv is not None else None
    parser = Parser(prog="attnkit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"attnkit {installed_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        group, _, name = command.name.rpartition(" ")
        if group and group not in groups:
            groups[group] = sub.add_parser(group, help=GROUPS[group]).add_subparsers(
                dest=f"{group}_command", required=True)
        p = (groups[group] if group else sub).add_parser(
            name, help=command.help, description=command.description or command.help, epilog=command.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if argv is None or command.name == chosen:
            hidden = command.hidden(argv) if argv is not None else {}
            add_command_options(p, command, hide=hidden)
            p.usage = f"%(prog)s {options.usage(command.classes(), either=RUN)}"
            if hidden:
                p.epilog = "\n".join(filter(None, [p.epilog, "not for this run (options of other tasks' runs):",
                                                    *(f"  {why}" for why in hidden.values())]))
            p.set_defaults(hidden=hidden)
        p.set_defaults(command_spec=command, command_parser=p)
    return parser


def _chosen(argv: list[str]) -> str | None:
    """The command `argv` names ("train", "tokenizer train"), or None."""
    words = [w for w in argv if not w.startswith("-")]
    if words[:1] and words[0] in GROUPS:
        return " ".join(words[:2])
    return words[0] if words else None


def add_command_options(p: argparse.ArgumentParser, command: Command, hide: dict[str, str] | None = None) -> None:
    """The command's options: its settings' fields, each section's fields in a group, and --config. The fields in
    `hide` (name -> why: `Command.hidden`) are left out of the help and refused with their reason."""
    settings, *sections = command.classes()
    options.add_fields(p, settings, either=RUN, refuse=hide)
    for (title, _), cls in zip(command.sections, sections, strict=True):
        if set(options.fields_of(cls)) - set(hide or ()):
            options.add_fields(p.add_argument_group(title), cls, refuse=hide)
        else:  # a section none of whose options apply: refused, without a heading
            options.add_fields(p, cls, refuse=hide)
    if command.recipe is not None:
        from attnkit.recipes import RecipeOptions

        options.add_fields(p.add_argument_group("recipe (attnkit recipes lists them)"), RecipeOptions)
    p.add_argument("--config", dest="config_file", metavar="FILE", help="a JSON or YAML file of this command's "
                   "options (keys as the options' names, e.g. max_steps); options given on the command line win")


@dataclass(frozen=True)
class Invocation:
    """A parsed command line: the command, its settings and (train) the options given from each section."""

    command: Command
    settings: Any
    sections: tuple[dict[str, Any], ...] = ()

    def run(self) -> int:
        return self.command.run(self.settings, *self.sections)


def invocation(args: argparse.Namespace) -> Invocation:
    """Layer the settings: the dataclass defaults, then the --recipe's section, then the --config file, then the
    command line; `set` assignments add up in that order. An option the parser hid (`Command.hidden`: another
    task's) is refused in the --config file as on the command line."""
    command: Command = args.command_spec
    layers = _layers(command, args)
    try:
        settings = options.build(command.classes()[0], layers[0], either=RUN)
    except options.MissingOption as err:
        args.command_parser.error(str(err))  # a usage error: the command's usage, then what is missing
    if getattr(args, "recipe", None) and command.recipe == "evaluate":
        _check_recipe_task(args.recipe, settings.run)
    return Invocation(command, settings, tuple(layers[1:]))


def _layers(command: Command, args: argparse.Namespace, *, paths: bool = True) -> list[dict[str, Any]]:
    """The options given for each of the command's settings classes, as `invocation` layers them; an option the
    parser hid (`Command.hidden`: another task's) is refused in the --config file as on the command line.
    `paths=False`: a recipe's data paths unchecked."""
    classes = command.classes()
    known = {name for cls in classes for name in options.fields_of(cls)}
    files: list[dict[str, Any]] = []  # settings files, lowest first
    if args.config_file:
        what = f"--config {args.config_file}"
        values = _settings_file(command, options.read_settings_file(args.config_file), args.config_file, known, what)
        hidden = getattr(args, "hidden", {})
        refused = [name for name in values if name in hidden]
        if refused:
            raise InputError(f"{hidden[refused[0]]}; drop it from {what}")
        files.append(values)
    if getattr(args, "recipe", None):
        from attnkit import recipes

        recipe = recipes.load(args.recipe)
        given = {k for k in known if getattr(args, k, None) is not None}.union(*files)
        if given & {"preset", "model_config"}:  # a model named on the command line wins over the recipe's fields
            given |= model_field_names()
        values = recipe.settings(command.recipe, args.data_root, given=given, paths=paths)
        files.insert(0, _settings_file(command, values, str(recipe.path), known, f"recipe {recipe.name}"))
    layers = []
    for cls in classes:
        layer: dict[str, Any] = {}
        fields = options.fields_of(cls)
        for values in [*({k: options.coerce(cls, k, v) for k, v in f.items() if k in fields} for f in files),
                       options.given(args, cls)]:
            if "set" in layer and "set" in values:  # the recipe's, the file's, then the command line's
                values = {**values, "set": (*layer["set"], *values["set"])}
            layer.update(values)
        layers.append(layer)
    return layers


def _check_recipe_task(name: str, run: str) -> None:
    """`eval --recipe` scores runs of the recipe's own task: a run of another task is refused before any data is
    read (scored anyway, its numbers would mean nothing; refused later, the data would be blamed)."""
    from attnkit import recipes
    from attnkit.checkpoint import load_config
    from attnkit.tasks import task_of_run

    wanted = (recipes.load(name).train or {}).get("task")
    if wanted is None or not Path(run, "config.json").is_file():  # a run that is not there: eval says so itself
        return
    task = task_of_run(run, load_config(run))
    if task is not None and task.name != wanted:
        raise InputError(f"recipe {name} evaluates {wanted} runs, but {run} is a {task.name} run; evaluate it "
                         f"without --recipe (attnkit eval {run} --data FILE), or with a recipe of its task")


def _settings_file(command: Command, values: dict[str, Any], path: str, known: set[str], what: str) -> dict[str, Any]:
    """A settings file's values (a --config file's, a recipe section's) made the command's, unknown keys refused."""
    if command.adapt_file is not None:
        values = command.adapt_file(values, path)
    options.unknown_keys(values, known, f"setting(s) in {what}")
    return values


def parse(argv: list[str]) -> Invocation:
    """What `attnkit ARGV...` would run, without running it (argparse exits on a usage error)."""
    return invocation(build_parser(argv).parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
        return invocation(args).run()
    except SystemExit as stop:  # a usage error, printed by argparse: its exit status (--help, --version: 0, raised)
        if isinstance(stop.code, int) and stop.code:
            return stop.code
        raise
    except AttnkitError as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (attnkit presets | head -1): what it wanted was written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0
    except OSError as err:  # the OS refused a path no check foresaw (read-only, too long a name, a file in the way)
        print(f"attnkit: error: {os_error_message(err, err.filename or 'a file', 'using')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
