"""The training job behind `attnkit train`: from data paths and settings to a `Trainer`, new or resumed.

    new run:  model config (task default | preset | config file, then --set)  ->  tokenizer (trained on the
              training text, or loaded)  ->  data  ->  model (vocabulary and classes from tokenizer and data)
    resume:   the checkpoint's model, tokenizer, data settings and training settings; a flag given again may
              change a training setting, but a model config or tokenizer that differs is refused (--set alone is
              applied to the checkpoint's config, so only the fields it changes differ)
    init:     (--init-from RUN_DIR|HF_DIR, train/finetune.py) the source's config with the task's head, its
              tokenizer, its body's weights (a head that does not fit starts fresh); then --freeze or LoRA decide
              what trains. train_state.json records the source and the fresh heads under "init_from"

What each task reads, how it batches and scores, its default model and the head it needs, its registration in
`attnkit.tasks` says; this job asks it (`task_spec`). The task and its head are checked against the model before
anything expensive (a tokenizer trained, data tokenized).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from attnkit.chat_format import DEFAULT_FORMAT, ChatTemplate, chat_template
from attnkit.checkpoint import RUN_MARKER, TOKENIZER_DIR, absent, is_attnkit_run, load_config, mark_run
from attnkit.config import ModelConfig, check_types, model_field_names
from attnkit.data import synthetic_tokenizer
from attnkit.data.labelled import BAD_LABELS
from attnkit.errors import AttnkitError, CheckpointError, ConfigError, InputError, nearest
from attnkit.machine import pick_device
from attnkit.models import build_model, count_parameters
from attnkit.options import assignments
from attnkit.presets import get as get_preset
from attnkit.tasks import TaskContext, TaskSpec, TrainingTask, own_options, task_of_run, task_spec, unread_options
from attnkit.tasks.common import SYNTHETIC, epoch_position, synthetic_name
from attnkit.tasks.lm import stream_files
from attnkit.tasks.translate import Translator
from attnkit.textfiles import EncodingErrors
from attnkit.tokenize import (
    BPE_VOCAB_SIZE,
    SIZED_KINDS,
    TRAINED_KINDS,
    Tokenizer,
    load_tokenizer,
    train_tokenizer,
)
from attnkit.train.distributed import SingleProcess, World, quiet_other_ranks, refuse_rank_options, start
from attnkit.train.finetune import (
    HEAD_MODULES,
    HFLoader,
    Source,
    load_body,
    prepare_training,
    read_source,
    reference_loader,
    reshaping_sets,
    resume_lora,
    target_config,
)
from attnkit.train.memory import check_fits
from attnkit.train.rundir import CACHE_DIR, claim, existing_run, move_aside, release
from attnkit.train.state import (
    BEST_DIR,
    CHECKPOINTS_DIR,
    config_differences,
    killed_before_checkpoint,
    resume_checkpoint,
    seed_all,
    stopped_early,
)
from attnkit.train.trainer import TrainConfig, Trainer, check_fields, shows_progress

log = logging.getLogger(__name__)

FINETUNE_SETTINGS = ("init_from", "freeze", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout")


@dataclass(frozen=True)
class DataConfig:
    """What to train on. Every field is a `--set` key (and most have their own flag)."""

    task: str = "lm"
    """a registered task (attnkit.tasks): lm: next-token prediction (decoder); mlm: masked-LM pre-training
    (encoder); translate: encoder-decoder; classify: a label per text (encoder); tag: a label per token (encoder);
    chat: the assistant's replies of conversations (decoder, usually --init-from a run). On resume: the run's own"""
    data: tuple[str, ...] = field(default=(), metadata={"metavar": "PATH"})
    """lm, mlm: text files, folders or globs (none: the Python standard library's source); translate: a folder with
    train.SRC/train.TGT, a TSV file or two line-aligned files; classify: a '<label> <text>' file, a CSV/TSV with a
    header or a .jsonl file; chat: .jsonl conversations (messages, prompt/completion or Alpaca's
    instruction/input/output); any task: synthetic:NAME"""
    val_data: tuple[str, ...] = ()  # translate / classify; empty: hold out `val_fraction` of the training data
    tokenizer: str = "bpe"
    """char | bpe | wordpiece (BERT's, uncased: trained on the training text) | a saved tokenizer directory"""
    vocab_size: int = BPE_VOCAB_SIZE  # bpe and wordpiece only
    seq_len: int | None = None  # lm: context length; others: longest sequence kept; None: the model's max_seq_len
    max_bytes: int | None = None  # lm: the corpus's first whole files up to this many bytes (at least one file)
    src_lang: str | None = None  # translate from a folder: the source file suffix, e.g. de
    tgt_lang: str | None = None  # translate from a folder: the target file suffix, e.g. en
    val_fraction: float = 0.1  # the share of the training data held out for validation when none is given
    eval_batches: int = 50  # lm: validation batches per evaluation
    bleu_samples: int = 200  # translate: validation sentences translated for BLEU at each evaluation (more: all)
    bleu_beam_size: int = 1  # translate: beam size of the validation translations (1: greedy)
    batch_tokens: int | None = None
    """translate, classify, tag: training batches of about this many tokens (source + target), bucketed by length;
    None: batches of batch_size sentences"""
    encoding_errors: EncodingErrors = "strict"  # strict: invalid UTF-8 is an error; replace: it becomes U+FFFD
    bad_labels: str = field(default="error", metadata={"choices": BAD_LABELS})
    """classify: lines whose label looks wrong (missing, holding a space): error | skip | keep"""
    options: Any = field(default=None, metadata={"internal": True})
    """the task's own options (`TaskSpec.own_options`, e.g. tag's tag_column), an instance of its class; None: its
    defaults. Their keys stand beside this class's in dicts (`from_dict`, `to_dict`) and on the command line"""

    def __post_init__(self) -> None:
        check_types(self)
        spec = self.spec
        if spec.own_options is not None and self.options is None:
            object.__setattr__(self, "options", spec.own_options())
        if self.bad_labels not in BAD_LABELS:
            raise ConfigError(f"bad_labels={self.bad_labels!r}: choose one of {', '.join(BAD_LABELS)}")
        for name in ("vocab_size", "eval_batches", "bleu_samples", "bleu_beam_size", "max_bytes", "batch_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction={self.val_fraction} must lie in (0, 1)")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len < 2):
            raise ConfigError(f"seq_len={self.seq_len!r} must be an integer >= 2")
        if self.encoding_errors not in ("strict", "replace"):
            raise ConfigError(f"encoding_errors={self.encoding_errors!r}: choose strict or replace")
        if spec.stream and self.batch_tokens is not None:
            raise ConfigError(f"--task {self.task} draws windows of seq_len tokens, batch_size at a time; drop "
                              "batch_tokens (it batches translate and classify examples by token count)")
        if spec.stream and self.val_data:
            raise ConfigError(f"--task {self.task} validates on the last --val-fraction of its token stream; drop "
                              "--val-data")

    @property
    def spec(self) -> TaskSpec:
        """The task's registration."""
        return task_spec(self.task)

    def to_dict(self) -> dict[str, Any]:
        """The settings, the task's own options among them (flat, as a run's train_state.json holds them)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
        if self.options is not None:
            values.update(dataclasses.asdict(self.options))
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, saved: bool = False) -> DataConfig:
        """Settings from `data`, whose keys are this class's fields and the task's own options. Another task's own
        option is a ConfigError naming its task; `saved`: a run's saved settings, which may hold every task's
        (runs written before tasks owned their options), and keep only the task's own."""
        owners = own_options()
        spec = task_spec(data.get("task", cls.task))
        mine = spec.own_option_names()
        if not saved:
            check_applies(spec, [k for k in data if k in owners])
        values = {k: v for k, v in data.items() if k not in owners}
        if "options" in values:  # a field, but not a key: the options' own keys stand for it
            raise ConfigError(f"unknown data setting(s) ['options']; known settings are {sorted(data_keys())}")
        check_fields(cls, values, "data")
        options = None
        if spec.own_options is not None:
            options = spec.own_options(**{k: v for k, v in data.items() if k in mine})
            check_types(options)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}, options=options)


def data_keys() -> set[str]:
    """Every data setting's name (a `--set` key): DataConfig's fields and each task's own options."""
    return {f.name for f in dataclasses.fields(DataConfig) if f.name != "options"} | set(own_options())


EVERY_TASK = ("task", "data", "tokenizer", "vocab_size", "seq_len")  # the data settings every task reads


def applicable(spec: TaskSpec) -> set[str]:
    """The data settings a run of task `spec` reads: every task's, those its registration names
    (`TaskSpec.options`) and its own options (`TaskSpec.own_options`)."""
    return {*EVERY_TASK, *spec.options, *spec.own_option_names()}


def inapplicable(spec: TaskSpec, run: str | Path | None = None, *,
                 also: Mapping[str, Callable[[TaskSpec], bool]] | None = None) -> dict[str, str]:
    """The data settings (`data_keys`) a run of `spec` does not read, each with why (the tasks it is for); `run`:
    the run resumed (None: a new run of --task spec). `also`: more options, each with whether a task reads it
    (`attnkit train`'s --sample-tokens)."""
    also = also or {}

    def reads(task: TaskSpec) -> Collection[str]:
        return {*applicable(task), *(name for name, read in also.items() if read(task))}

    names = [*(f.name for f in dataclasses.fields(DataConfig) if f.name != "options"), *own_options(), *also]
    return unread_options(spec, names, reads, run)


def check_applies(spec: TaskSpec, given: Iterable[str], run: str | Path | None = None) -> None:
    """ConfigError for a data setting `given` (a flag, a --set or --config key) that a run of `spec` does not read
    (`inapplicable`: another task's, named in the message)."""
    unread = inapplicable(spec, run)
    for name in given:
        if name in unread:
            raise ConfigError(f"{unread[name]}; drop it")


@dataclass
class TrainRequest:
    """What the user asked for. None (or empty) means "not given": the default, or on resume the saved value."""

    out: str
    task: str | None = None
    preset: str | None = None
    config_file: str | None = None
    overrides: list[str] = field(default_factory=list)  # key=value for ModelConfig, TrainConfig or DataConfig
    data: dict[str, Any] = field(default_factory=dict)  # DataConfig fields given as flags
    settings: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields given as flags
    resume: str | bool = False  # True: the run in `out`; a path: that run or checkpoint
    overwrite: bool = False
    device: str | None = None
    progress: bool | None = None
    force: bool = False  # start even when the model looks too large for the memory free (train/memory.py)


def requested_task(request: TrainRequest) -> tuple[TaskSpec, Path | None] | None:
    """The task `request` trains for, read without loading weights or data, and the run it resumes (None: a new
    run): the task it names (`task`, else a --set task=), else the resumed run's (its task.json, else its config's),
    else the default task. None when it cannot tell: the resumed run's task does not read cheaply, or nothing names
    a task and the model it names (--preset, a model config, --set family=) is not one the default task trains.
    Raises ConfigError for an unknown task."""
    sets = assignments(request.overrides)
    run = None if not request.resume else Path(request.out if request.resume is True else request.resume)
    named = request.task or sets.get("task")
    if named is not None:
        return task_spec(named), run
    if run is not None:
        try:
            spec = task_of_run(run, load_config(run))
        except (AttnkitError, OSError, ValueError):  # the resume itself says what is wrong
            return None
        return (spec, run) if spec is not None else None
    spec = task_spec(DataConfig.task)
    try:
        _model_config(request, spec, _split_overrides(request.overrides)[0])
    except (AttnkitError, OSError, ValueError):
        return None
    return spec, None


def prepare(
    request: TrainRequest, *, translate: Translator | None = None, load_hf: HFLoader | None = None
) -> Trainer:
    """A Trainer ready to `fit()`: a new run in `request.out` (from random weights, or from the run or Hugging Face
    directory `init_from` names), or the run or checkpoint named by `resume`.

    `translate` is the greedy decoder translation BLEU needs (the caller passes `attnkit.generate`'s); `load_hf`
    reads a Hugging Face directory for `init_from` (the caller passes `attnkit.interop.hf.load`).
    Raises ConfigError / InputError / CheckpointError naming what is wrong and how to fix it.

    This process owns `request.out` from here until the Trainer's `fit` ends (`rundir.claim`; rank 0 only); with
    `overwrite`, the old run is moved aside only once everything is checked, and deleted at the first checkpoint.
    """
    claimed = World.from_env().rank == 0 and claim(request.out)  # False: not rank 0, or held already by this process
    try:
        return _prepare(request, translate=translate, load_hf=load_hf)
    except BaseException:
        if claimed:  # a claim held before is its holder's to release
            release(request.out, refused=True)  # `out` as it was: a run moved aside put back, what was made removed
        raise


def check_request(request: TrainRequest) -> tuple[ModelConfig | None, DataConfig, TrainConfig]:
    """The model config, data settings and training settings a new run of `request` would start from, checked
    without reading data or writing anything (the model config's vocabulary is the tokenizer's business; None
    when `init_from` names weights that bring their own config). Raises ConfigError as `prepare` would."""
    model_changes, data_changes, train_changes = _changes(request)
    data_config, settings = DataConfig.from_dict(data_changes), TrainConfig.from_dict(train_changes)
    if settings.init_from:
        return None, data_config, settings
    return _model_config(request, data_config.spec, model_changes), data_config, settings


def _changes(request: TrainRequest) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """The request's model assignments, data changes and training changes (flags, then --set on top). Raises
    ConfigError for a --set key of another task's data settings, named as its flag is (`check_applies`)."""
    found = requested_task(request)
    if found is not None:
        check_applies(found[0], assignments(request.overrides), found[1])
    model_changes, data_changes, train_changes = _split_overrides(request.overrides)
    data_changes = {**request.data, **data_changes}
    train_changes = {**request.settings, **train_changes}
    if train_changes.get("init_from"):
        init_from = Path(train_changes["init_from"])
        if not init_from.exists():  # named with its cause before anything else looks at it
            raise CheckpointError(f"--init-from {init_from} {absent(init_from)}; point it at an attnkit run "
                                  "directory (runs/NAME) or a Hugging Face model directory")
        train_changes["init_from"] = str(init_from.resolve())
    if request.task is not None:
        data_changes["task"] = request.task
    return model_changes, data_changes, train_changes


def _prepare(request: TrainRequest, *, translate: Translator | None, load_hf: HFLoader | None) -> Trainer:
    model_changes, data_changes, train_changes = _changes(request)
    world = World.from_env()  # several processes under torchrun: this one is rank world.rank
    quiet_other_ranks(world)
    refuse_rank_options(world, train_changes)
    out, device = Path(request.out), world.device(pick_device(request.device))
    _refuse_checkpoint_out(out, request.resume)
    if request.resume:
        source = out if request.resume is True else Path(request.resume)
        return _resume(request, source, model_changes, data_changes, train_changes, device, translate, load_hf)
    if world.rank == 0:
        _claim_run_dir(out, overwrite=request.overwrite)
    data_config = DataConfig.from_dict(_absolute_paths(data_changes))
    if ("vocab_size" in data_changes and data_config.tokenizer not in SIZED_KINDS
            and not train_changes.get("init_from")):
        raise ConfigError(f"--vocab-size {data_config.vocab_size} sets the size of the BPE or WordPiece tokenizer a "
                          f"run trains, and --tokenizer {data_config.tokenizer} has its own vocabulary (a char "
                          "tokenizer's is the text's characters): drop --vocab-size, or use --tokenizer bpe or "
                          "wordpiece")
    settings = TrainConfig.from_dict(train_changes)
    parallel = _start(world, settings, data_config, device)  # the other ranks wait here until rank 0 has claimed `out`
    seed_all(settings.seed)
    spec = data_config.spec
    source = _init_source(request, settings, data_changes, load_hf) if settings.init_from else None
    if source is not None:
        config = target_config(source, spec=spec, assignments=model_changes)
    else:  # the model and its head checked against the task before a tokenizer is trained
        config = _model_config(request, spec, model_changes)
    _check_seq_len(data_config, config)
    stream = spec.stream and synthetic_name(data_config) is None
    lm_files = stream_files(data_config) if stream else None
    if source is not None:  # each rank read its own copy of the source's tokenizer
        tokenizer = source.tokenizer
        parallel.check_same(tokenizer.fingerprint(), "tokenizer")
    else:  # trained on rank 0 and shared: the corpus is read and the tokenizer trained once, not on every rank
        tokenizer = parallel.made_on_rank_0(partial(
            _new_tokenizer, data_config, settings.seed, lm_files,
            progress=shows_progress(request.progress) and parallel.writes), what="the tokenizer",
            beforehand="Train it once before the launch with attnkit tokenizer train --out DIR, then give attnkit "
                       "train --tokenizer DIR")
    template = source.chat_template if source is not None else _new_chat_template(data_config, tokenizer)
    task, labels = _make_task(*_global_batch(data_config, settings, parallel), tokenizer, config, out, translate,
                              lm_files, progress=shows_progress(request.progress) and parallel.writes,
                              labels=source.labels if source is not None else None,
                              record=source.record if source is not None else None, chat_template=template,
                              parallel=parallel, reference=source.frozen_model if source is not None else None)
    config = _fit_config(config, tokenizer, labels, keep_vocab=source is not None)
    reach = config.receptive_field  # a convolution's or a window's: what each prediction reads at most
    n_model = count_parameters(config)
    log.info("model: %s, %s parameters%s", config.family, f"{n_model:,}",
             f", receptive field {reach} tokens" if reach is not None else "")
    n_parameters, frozen = _trained_parameters(config, settings, n_model)
    reference = n_model if spec.reference_copy and source is not None and not settings.lora_rank else 0
    check_fits(n_parameters, settings.dtype, device, force=request.force, frozen=frozen, reference=reference)
    seed_all(settings.seed)  # the weights do not depend on how much randomness data preparation used
    model = build_model(config, force=request.force)
    run_info: dict[str, Any] = {"data_config": data_config.to_dict()}
    if source is not None:
        changed = reshaping_sets(source, spec=spec, sets=model_changes)
        report = load_body(model, source, labels=labels, changed=changed)
        prepare_training(model, freeze=settings.freeze, lora_rank=settings.lora_rank, lora_alpha=settings.lora_alpha,
                         lora_targets=settings.lora_targets, lora_dropout=settings.lora_dropout,
                         fresh=tuple(report.fresh))
        run_info["init_from"] = {**source.describe(), **report.to_dict()}
    if world.rank == 0 and request.overwrite:
        move_aside(out)  # everything is checked: the new run is about to write
    return Trainer(
        model=model, config=config, task=task, settings=settings, run_dir=out, tokenizer=tokenizer, labels=labels,
        device=device, run_info=run_info, progress=request.progress, parallel=parallel, chat_template=template,
    )


def _trained_parameters(config: ModelConfig, settings: TrainConfig, n_model: int) -> tuple[int, int]:
    """(all the parameters, those --freeze or LoRA keeps frozen) of the model `config` builds, LoRA's adapters
    included, counted on the meta device: the head modules count as training, as a fresh one does under LoRA.
    `n_model`: `count_parameters(config)`, the caller's count of the model without adapters (the answer where
    nothing is fine-tuned)."""
    if not settings.init_from:  # nothing is frozen but in a fine-tune
        return n_model, 0
    with torch.device("meta"):
        model = build_model(config, force=True)
        prepare_training(model, freeze=settings.freeze, lora_rank=settings.lora_rank, lora_alpha=settings.lora_alpha,
                         lora_targets=settings.lora_targets, lora_dropout=settings.lora_dropout)
    frozen = sum(p.numel() for name, p in model.named_parameters()
                 if not p.requires_grad and name.split(".", 1)[0] not in HEAD_MODULES)
    return count_parameters(model), frozen


def _init_source(request: TrainRequest, settings: TrainConfig, data_changes: dict[str, Any],
                 load_hf: HFLoader | None) -> Source:
    """The weights `--init-from` names; refuses the options that would choose another model or tokenizer."""
    model_file = "--model-config (or a --config file of model fields)"
    clashes = [flag for flag, given in (("--preset", request.preset), (model_file, request.config_file),
                                        ("--tokenizer", "tokenizer" in data_changes),
                                        ("--vocab-size", "vocab_size" in data_changes)) if given]
    if clashes:
        raise ConfigError(f"--init-from {settings.init_from} brings its own model config and tokenizer; drop "
                          f"{', '.join(clashes)} (change single model fields such as dropout with --set)")
    return read_source(settings.init_from, load_hf=load_hf)


def _start(world: World, settings: TrainConfig, data: DataConfig, device: torch.device) -> SingleProcess:
    parallel = start(world, shard=settings.shard, timeout=settings.dist_timeout, device=device)
    if parallel.size > 1:
        log.info(parallel.describe(settings.batch_size, settings.grad_accum, settings.lr,
                                   batch_tokens=data.batch_tokens))
    return parallel


def _global_batch(
    data: DataConfig, settings: TrainConfig, parallel: SingleProcess
) -> tuple[DataConfig, TrainConfig]:
    """The settings a task draws global batches with: `batch_size` and `batch_tokens` per rank, times the ranks
    (distributed.py)."""
    tokens = None if data.batch_tokens is None else data.batch_tokens * parallel.size
    return (dataclasses.replace(data, batch_tokens=tokens),
            dataclasses.replace(settings, batch_size=settings.batch_size * parallel.size))


def _resume(request, source: Path, model_changes, data_changes, train_changes, device, translate,
            load_hf: HFLoader | None = None) -> Trainer:
    checkpoint = resume_checkpoint(source, device=device)
    state = checkpoint.train_state
    saved_data = DataConfig.from_dict(state["data_config"], saved=True)
    problems = []
    if "task" in data_changes and data_changes["task"] != saved_data.task:
        problems.append(f"task: {saved_data.task!r} -> {data_changes['task']!r}")
    if request.preset or request.config_file or model_changes:
        wanted = _fit_config(  # --set alone changes fields of the checkpoint's config, not of the task's default
            _model_config(request, saved_data.spec, model_changes, base=checkpoint.config), checkpoint.tokenizer,
            checkpoint.labels, keep_vocab="init_from" in state,
        )
        problems += config_differences(checkpoint.config.to_dict(), wanted.to_dict())
    problems += _tokenizer_differences(checkpoint.tokenizer, data_changes, saved_data)
    if problems:
        raise CheckpointError(
            f"cannot resume {checkpoint.path}: what was asked for differs from the checkpoint:\n  "
            + "\n  ".join(problems)
            + "\nResume without these options (the checkpoint's own are used), or start a new run with --out"
        )
    data_config = DataConfig.from_dict({**saved_data.to_dict(), **_absolute_paths(data_changes)})
    _check_seq_len(data_config, checkpoint.config, resumed=True)
    saved_settings = TrainConfig.from_dict(state["settings"]).to_dict()
    settings = TrainConfig.from_dict({**state["settings"], **train_changes})
    changed = config_differences({k: saved_settings[k] for k in FINETUNE_SETTINGS},
                                 {k: settings.to_dict()[k] for k in FINETUNE_SETTINGS})
    if changed:
        raise CheckpointError(f"cannot resume {checkpoint.path} with other fine-tuning settings ("
                              f"{'; '.join(changed)}): they decide which weights exist and train; resume without "
                              "them, or start a new run with --init-from")
    drawing = ({} if data_config.val_data else {"val_fraction": (saved_data.val_fraction, data_config.val_fraction)})
    if _seed_draws_validation(data_config):
        drawing["seed"] = (saved_settings["seed"], settings.seed)
    redrawn = config_differences({k: v[0] for k, v in drawing.items()}, {k: v[1] for k, v in drawing.items()})
    if redrawn:
        flags = " and ".join("--" + change.split(":")[0].replace("_", "-") for change in redrawn)
        raise CheckpointError(
            f"cannot resume {checkpoint.path} with {'; '.join(redrawn)}: the run's validation set (the examples it "
            f"holds out, or mlm's masks) is drawn with {'these' if len(redrawn) > 1 else 'this'}, so the continued "
            f"run would score on another set, with examples it trained on; resume without {flags}, or "
            f"start a new run that keeps this one's weights (--init-from {_run_of(checkpoint.path)} --out NEW_RUN)"
        )
    for change in config_differences(saved_data.to_dict(), data_config.to_dict()) + config_differences(
        state["settings"], settings.to_dict()
    ):
        log.warning("resuming with a changed setting: %s", change)
    out, world = Path(request.out), World.from_env()
    _say_batching_changes((saved_data, saved_settings["batch_size"], state.get("ranks", 1)),
                          (data_config, settings.batch_size, world.size),
                          position=state["data"], max_seq_len=checkpoint.config.max_seq_len)
    run = _run_of(checkpoint.path)
    if out.resolve() != run.resolve():
        if world.rank == 0:
            _claim_run_dir(out, overwrite=request.overwrite, resuming=checkpoint.path)
        log.info("continuing %s in %s", checkpoint.path, out)
    parallel = _start(world, settings, data_config, device)
    template = chat_template(checkpoint.path / TOKENIZER_DIR, checkpoint.tokenizer.specials)
    task, labels = _make_task(*_global_batch(data_config, settings, parallel), checkpoint.tokenizer, checkpoint.config,
                              out, translate, progress=shows_progress(request.progress) and parallel.writes,
                              labels=checkpoint.labels, record=checkpoint.task, chat_template=template,
                              parallel=parallel, reference=reference_loader(checkpoint.path, state, load_hf=load_hf))
    if labels != checkpoint.labels:
        raise CheckpointError(
            f"cannot resume {checkpoint.path}: the data's labels {labels} differ from the checkpoint's "
            f"{checkpoint.labels} (its head has a class for each of those); resume on data with the run's labels, or "
            f"start a new run that keeps this one's weights (--init-from {_run_of(checkpoint.path)} --out NEW_RUN)"
        )
    model, run_info = checkpoint.model, {"data_config": data_config.to_dict()}
    if "init_from" in state:
        run_info["init_from"] = state["init_from"]
        fresh = tuple(state["init_from"].get("fresh", {}))
        if settings.lora_rank:
            model = resume_lora(checkpoint.path, device=device, rank=settings.lora_rank, alpha=settings.lora_alpha,
                                targets=settings.lora_targets, dropout=settings.lora_dropout, fresh=fresh)
        else:
            prepare_training(model, freeze=settings.freeze, fresh=fresh)
    if world.rank == 0 and request.overwrite and out.resolve() != _run_of(checkpoint.path).resolve():
        move_aside(out)
    trainer = Trainer(
        model=model, config=checkpoint.config, task=task, settings=settings, run_dir=out,
        tokenizer=checkpoint.tokenizer, labels=labels, device=device, run_info=run_info, progress=request.progress,
        parallel=parallel, chat_template=template,
    )
    trainer.restore(checkpoint, own_run=out.resolve() == run.resolve(), named=source.resolve() != run.resolve())
    return trainer


def _say_batching_changes(saved: tuple[DataConfig, int, int], resumed: tuple[DataConfig, int, int], *,
                          position: dict[str, Any], max_seq_len: int) -> None:
    """Warn about what another global batch does on resume ((data settings, batch_size, ranks) saved and resumed;
    tasks draw batches of batch_size x ranks, `_global_batch`): for lm and mlm it changes the validation set
    (eval_batches x global batch windows: lm's the split's first, mlm's spread over it); for an epoch's batches,
    part drawn (`position`: the task's data state), it cuts the rest of the epoch anew."""
    if resumed[0].spec.stream:
        sets = [(d.eval_batches * b * ranks, d.seq_len or max_seq_len) for d, b, ranks in (saved, resumed)]
        (before, length), (after, new_length) = sets  # (windows, tokens)
        if sets[0] != sets[1]:
            log.warning("the validation set changes from %d windows of %d tokens to %d of %d (eval_batches x "
                        "batch_size x ranks windows of seq_len): scores before and after, best/'s among them, are not "
                        "comparable; keep eval_batches x batch_size x ranks at %d (and the seq_len) to compare them",
                        before, length, after, new_length, before)
        return
    recut = config_differences(*[_global_batch_size(*side) for side in (saved, resumed)])
    drawn = epoch_position(position)
    if recut and drawn is not None and drawn[1]:
        log.warning("%s in the middle of epoch %d (after its batch %d): the rest of the epoch is cut into batches "
                    "of the new size in another order, so some of its examples come again and others wait for the "
                    "next epoch", "; ".join(recut), *drawn)


def _seed_draws_validation(data: DataConfig) -> bool:
    """Whether --seed draws the run's validation set (`TaskSpec.seed_draws_validation`; a synthetic set's examples
    always)."""
    rule = data.spec.seed_draws_validation
    return (synthetic_name(data) is not None or rule == "always"
            or (rule == "without_val_data" and not data.val_data))


def _global_batch_size(data: DataConfig, batch_size: int, ranks: int) -> dict[str, int]:
    """What a global batch is cut by: batch_tokens x ranks where set (batch_size then plays no part), else
    batch_size x ranks."""
    if data.batch_tokens is not None:
        return {"batch_tokens x ranks": data.batch_tokens * ranks}
    return {"batch_size x ranks": batch_size * ranks}


def _tokenizer_differences(saved: Tokenizer, data_changes: dict[str, Any], saved_data: DataConfig) -> list[str]:
    wanted = data_changes.get("tokenizer")
    problems = []
    if wanted is not None and wanted != saved_data.tokenizer:
        if wanted in TRAINED_KINDS:
            if wanted != saved.kind:
                problems.append(f"tokenizer: {saved.kind!r} -> {wanted!r}")
        elif load_tokenizer(wanted).fingerprint() != saved.fingerprint():
            problems.append(f"tokenizer: the one in {wanted} is not the checkpoint's (their fingerprints differ)")
    if "vocab_size" in data_changes and data_changes["vocab_size"] != saved.vocab_size:
        problems.append(f"vocab_size: {saved.vocab_size} -> {data_changes['vocab_size']}")
    return problems


# Configs -----------------------------------------------------------------------------------------------------
def _split_overrides(texts: list[str]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Sort `key=value` strings into ModelConfig assignments and DataConfig / TrainConfig changes."""
    model_keys = model_field_names()
    data_names = data_keys()
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    model, data, train = [], {}, {}
    for text in texts:
        ((key, value),) = assignments([text]).items()
        if key in model_keys:
            model.append(text)
        if key in data_names or key in train_keys:  # vocab_size is both: the BPE's size, which the model then takes
            (data if key in data_names else train)[key] = value
        elif key not in model_keys:
            guess = nearest(key, model_keys | data_names | train_keys)
            raise ConfigError(f"--set {key}: no such setting; did you mean {guess}?" if guess else (
                f"--set {key}: no such setting. Model fields: {', '.join(sorted(model_keys))}. Data settings: "
                f"{', '.join(sorted(data_names))}. Training settings: {', '.join(sorted(train_keys))}"
            ))
    return model, data, train


def _model_config(
    request: TrainRequest, spec: TaskSpec, sets: list[str], *, base: ModelConfig | None = None
) -> ModelConfig:
    """The request's --preset or --model-config, else `base` (a resumed run's config), else the task's default model;
    then its `--set key=value` assignments `sets` and the head the task needs (`TaskSpec.with_head`)."""
    if request.preset and request.config_file:
        raise ConfigError("give --preset or a model config (--model-config, or a --config file of model fields), "
                          "not both")
    if request.preset:
        config = get_preset(request.preset)
    elif request.config_file:
        config = ModelConfig.from_json(request.config_file)
    else:
        config = base if base is not None else ModelConfig(**spec.default_model)
    return spec.with_head(config, sets)


def _fit_config(
    config: ModelConfig, tokenizer: Tokenizer, labels: list[str] | None, *, keep_vocab: bool = False
) -> ModelConfig:
    """The config with the tokenizer's vocabulary (unless `keep_vocab`: trained weights fix the vocabulary, which
    may hold more rows than the tokenizer has tokens) and the data's classes."""
    if not keep_vocab:  # one tokenizer for both sides of a translation: one shared vocabulary
        config = config.with_vocabulary(tokenizer.vocab_size)
    changes: dict[str, Any] = {}
    if labels is not None:
        changes["n_classes"] = len(labels)
    return config.replace(**changes)


def _check_seq_len(data: DataConfig, config: ModelConfig, *, resumed: bool = False) -> None:
    """ConfigError when the data's seq_len is longer than the model's context; checked before a tokenizer is trained
    or data read. A resumed model's context is fixed, so only --seq-len can change then."""
    if data.seq_len is not None and data.seq_len > config.max_seq_len:
        fix = "" if resumed else f" or add --set max_seq_len={data.seq_len}"
        raise ConfigError(f"seq_len={data.seq_len} exceeds the model's max_seq_len={config.max_seq_len}; lower "
                          f"--seq-len{fix}")


# Tokenizer and data ------------------------------------------------------------------------------------------
def _new_tokenizer(data: DataConfig, seed: int, lm_files: list[Path] | None, *, progress: bool = False) -> Tokenizer:
    if synthetic_name(data) is not None:
        return synthetic_tokenizer()
    if data.tokenizer not in TRAINED_KINDS:
        return load_tokenizer(data.tokenizer)
    spec = data.spec
    if spec.stream and lm_files and all(path.stat().st_size == 0 for path in lm_files):
        names = ", ".join(str(path) for path in lm_files[:3]) + (", ..." if len(lm_files) > 3 else "")
        raise InputError(f"the training text is empty: {names} hold(s) no bytes; give --data files with text in them")
    source: list[Any] = lm_files if spec.stream else spec.training_text(data, seed)
    if Path(data.tokenizer).is_dir():  # a folder named as a kind: the kind is trained, and the folder not read
        log.warning("--tokenizer %s trains a new %s tokenizer on the training text, and the folder %s here is not "
                    "read: to use the tokenizer saved there, give it as ./%s", *[data.tokenizer] * 4)
    log.info("training a %s tokenizer on the training text", data.tokenizer)
    return train_tokenizer(data.tokenizer, source, vocab_size=data.vocab_size, encoding_errors=data.encoding_errors,
                           progress=progress)


def _new_chat_template(data: DataConfig, tokenizer: Tokenizer) -> ChatTemplate:
    """The template a new model chats in: that of a --tokenizer directory holding one (a chat model's
    tokenizer_config.json), which the run keeps beside its tokenizer; else the default format."""
    if synthetic_name(data) is not None or data.tokenizer in TRAINED_KINDS:
        return DEFAULT_FORMAT
    return chat_template(Path(data.tokenizer), tokenizer.specials)


def _make_task(
    data: DataConfig, settings: TrainConfig, tokenizer: Tokenizer, config: ModelConfig, out: Path,
    translate: Translator | None, lm_files: list[Path] | None = None, progress: bool = True,
    labels: Sequence[str] | None = None, record: Mapping[str, Any] | None = None,
    chat_template: ChatTemplate = DEFAULT_FORMAT, parallel: SingleProcess | None = None,
    reference: Callable[[], torch.nn.Module] | None = None,
) -> tuple[TrainingTask, list[str] | None]:
    """The trainer's task and its label list, as the task's registration makes them from the data (in the order of
    `labels` where the data has those: a fine-tuned source's, a resumed run's; `record`: that run's task.json;
    `chat_template`: the template its model chats in; `parallel`: this rank's part, whose rank 0 makes what the
    ranks share; `reference`: builds the frozen model a fine-tune started from)."""
    parallel = parallel or SingleProcess()
    task, labels = data.spec.make(TaskContext(
        data=data, tokenizer=tokenizer, config=config, batch_size=settings.batch_size, seed=settings.seed,
        seq_len=data.seq_len or config.max_seq_len, cache=out / CACHE_DIR, files=lm_files, translate=translate,
        progress=progress, labels=tuple(labels) if labels is not None else None, record=record,
        chat_template=chat_template, on_rank_0=partial(_made_on_rank_0, parallel), reference=reference,
    ))
    task.name = data.spec.name  # task.json names the registration (one task class may serve several)
    return task, labels


def _made_on_rank_0(parallel: SingleProcess, make: Callable[[], Any], what: str) -> Any:
    """A task's `TaskContext.on_rank_0`: `make()` run on rank 0 alone and its result handed to every rank
    (`made_on_rank_0`), with the fix to name where the others' wait for it fails."""
    return parallel.made_on_rank_0(make, what=what, beforehand=(
        f"Make {what} in one process first (a run of one process with the same data, tokenizer and --out makes it in "
        "OUT/cache, where a launch of several finds it)"))


def _absolute_paths(data_changes: dict[str, Any]) -> dict[str, Any]:
    """Data paths made absolute, so a run resumed from another directory still finds its data."""
    out = dict(data_changes)
    for key in ("data", "val_data"):
        if key in out:
            out[key] = tuple(p if str(p).startswith(SYNTHETIC) else _resolve(p) for p in out[key])
    if out.get("tokenizer") not in (None, *TRAINED_KINDS):
        out["tokenizer"] = _resolve(out["tokenizer"])
    return out


def _resolve(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except RuntimeError:  # pathlib's word for a symbolic link that leads back to itself
        raise InputError(f"{path} is a symbolic link that loops back on itself; give the path of a file") from None


def _run_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint directory belongs to."""
    if checkpoint.parent.name == CHECKPOINTS_DIR:
        return checkpoint.parent.parent
    return checkpoint.parent if checkpoint.name == BEST_DIR else checkpoint


def _refuse_checkpoint_out(out: Path, resume: bool | str | None) -> None:
    """Refuse an `--out` that is a checkpoint of a run (`RUN/best`, `RUN/checkpoints/step_N`), whatever `--resume`
    names: a run started or continued there would nest inside the run (and --overwrite would move its best model
    aside)."""
    run = _run_of(out)
    if run == out or not is_attnkit_run(run):
        return
    named = Path(resume) if isinstance(resume, str) and Path(resume).resolve() != out.resolve() else None
    if named is None:
        ways = (f"continue the run from it with --out {run} --resume {out} (its later checkpoints are dropped), or "
                f"start a new run from it with --out NEW_RUN --resume {out}")
    else:
        ways = (f"continue {named} in its own run with --out {_run_of(named)} --resume {named}, or in a new one with "
                f"--out NEW_RUN --resume {named}")
    raise ConfigError(f"--out {out} is a checkpoint of the run {run}, not a run directory: {ways}")


def _claim_run_dir(out: Path, *, overwrite: bool, resuming: Path | None = None) -> None:
    """Refuse to start in a directory holding another run, unless `overwrite` (the run is then moved aside, not
    deleted, when the new one is about to write: `rundir.move_aside`). `resuming`: the checkpoint a --resume PATH
    named, continued in `out`."""
    existing = existing_run(out)
    if existing and not overwrite and killed_before_checkpoint(out):
        raise ConfigError(f"{out}: {stopped_early(out)}")
    if existing and not overwrite:
        go_on = ("--resume without a path to continue it" if resuming is not None else "pass --resume to continue it")
        raise ConfigError(
            f"{out} already holds a run ({', '.join(existing[:4])}, ...): {go_on}, --overwrite to replace it"
            + (f" with {resuming} continued" if resuming is not None else "") + ", or choose another --out"
        )
    if existing and not is_attnkit_run(out):
        raise ConfigError(
            f"{out} holds {', '.join(existing[:4])} but is no run attnkit wrote (no {RUN_MARKER}, nor config.json, "
            f"model.safetensors and train_state.json): --overwrite replaces only attnkit's runs; choose another --out"
        )
    mark_run(out)
