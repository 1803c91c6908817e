"""The task registry: what it means to train for a task, said once per task (as `models.families` does per family).

A `TaskSpec` names, for one task: the families whose models learn it and the head fields their config needs (the
task implies its head), how its examples are read and batched (`make`: the trainer's view, with loss and
evaluation), the one evaluation loop `attnkit eval` shares with training (`evaluate_files`), the model's pipeline
method, the data and evaluation options it reads and those only it reads (`own_options`), the command it adds to
`attnkit` (`TaskCommand`) and the Hugging Face classes it maps to (`HFClass`). Training, evaluation, conversion,
the pipeline and the command line ask here (`task_spec`, `task_of_config`) instead of testing task names.

A task of one's own is a `TaskSpec` and one `register` call (docs/guides/tasks.md); a package may also name its
module under the `attnkit.tasks` entry-point group, which the registry imports the first time it is asked."""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Protocol

from torch import Tensor, nn

from attnkit.chat_format import DEFAULT_FORMAT, ChatTemplate
from attnkit.checkpoint import HF_SOURCE_FILE, TASK_FILE, read_json
from attnkit.config import ModelConfig, config_class
from attnkit.errors import CheckpointError, ConfigError
from attnkit.models import family_of
from attnkit.options import assignments, flag
from attnkit.tokenize import Tokenizer

log = logging.getLogger(__name__)

ENTRY_POINTS = "attnkit.tasks"  # entry-point group: modules that register tasks when imported
METHODS = ("generate", "translate", "classify")  # the methods `Pipeline` defines itself; others come as pipeline=


class TrainingTask(Protocol):
    """The trainer's view of a task: batches, their loss, and evaluation on the validation data."""

    name: str
    metric: str  # the evaluation result that picks the best checkpoint
    higher_is_better: bool

    def next_batch(self) -> Any: ...
    def loss(self, model: nn.Module, batch: Any) -> Tensor: ...  # mean over the batch's `weight` targets
    def weight(self, batch: Any) -> int: ...  # how many targets the loss averages over
    def n_tokens(self, batch: Any) -> int: ...  # input tokens processed (for tokens/s)
    def evaluate(self, model: nn.Module) -> dict[str, float]: ...  # may take shard= (common.Shard): a rank's share
    def data_state(self) -> dict[str, Any]: ...
    def load_data_state(self, state: dict[str, Any]) -> None: ...
    # optional: `record`, a dict the run's task.json saves beside the task's name (tag's word pieces), read back as
    # `TaskContext.record` by a resumed or fine-tuned run and through `task_record` by the run's readers; `packed`
    # and `padded`, bools the training plan's attention choice reads (False where a task has none): its batches
    # carry a document mask (lm --pack) or an attention mask over padded rows (classify, tag, translate); `stops`
    # and `stop_ids`, the strings and tokens a sample generated after training ends at (chat's: its template's next
    # turn and end-of-turn token; none where a task has none); `loss_and_metrics(model, batch)`, the loss and a
    # dict of 0-dim tensors from the same forward (means over the batch's targets) the trainer logs with each step's
    # loss (dpo's rewards/*)


@dataclass(frozen=True)
class TaskContext:
    """What a task's `make` reads its data with. `data` is the run's `attnkit.train.DataConfig` (a task reads the
    fields it uses, `TaskSpec.options`)."""

    data: Any
    tokenizer: Tokenizer
    config: ModelConfig
    batch_size: int  # the global batch (every rank's)
    seed: int
    seq_len: int
    cache: Path  # a directory the task may cache prepared data in
    files: list[Path] | None = None  # stream tasks: the text files already found
    translate: Callable[..., list[list[int]]] | None = None  # token-level decoding (translation's BLEU)
    progress: bool = False
    labels: tuple[str, ...] | None = None  # the order to keep for the data's labels, where they are this set: the
    # fine-tuned source's (its head's rows), a resumed run's (`LabelVocab.from_labels(order=...)`)
    record: Mapping[str, Any] | None = None  # the task.json of the run resumed or fine-tuned from (`task_record`;
    # {} where it has none), what its task saved beside its name (`TrainingTask.record`); None: a new model
    chat_template: ChatTemplate = DEFAULT_FORMAT  # the template the run's model chats in (its tokenizer's, where
    # the run resumed or fine-tuned from has one; else the default format): `attnkit serve` renders chats with it
    reference: Callable[[], nn.Module] | None = None  # builds the frozen model a fine-tune started from (the
    # --init-from weights), for a task that compares against it (dpo); None: a new model
    on_rank_0: Callable[[Callable[[], Any], str], Any] = lambda make, what: make()
    """(make, what) -> make()'s result, run once and shared: in a distributed run rank 0 alone runs it and every
    rank gets its result (`made_on_rank_0`), for what the ranks would otherwise each build (the token cache)"""


@dataclass(frozen=True)
class EvalContext:
    """What `attnkit eval` hands a task's `evaluate_files`: the loaded run and the user's settings."""

    run: Path
    model: nn.Module | None  # a task that decodes translates through `translate_texts`; its model checks files
    config: ModelConfig
    tokenizer: Tokenizer
    labels: list[str] | None
    files: list[str]
    settings: Any  # attnkit.train.evaluate.EvalSettings: window, stride, batch_size, encoding_errors, ...
    out: Path  # where pictures go (eval.json is written by the caller)
    translate_texts: Callable[[list[str]], list[str]] | None = None
    progress: bool = False
    options: Any = None  # the task's own options (`TaskSpec.own_options`): given, else the run's, else defaults
    reference: Callable[[], nn.Module] | None = None  # builds the frozen model the run was fine-tuned from (dpo's)


@dataclass(frozen=True)
class HFClass:
    """A Hugging Face class a task's models convert to and from (`attnkit convert`): `attnkit.interop.keymaps` lists
    it under its `model_type`, implying the task's head (the head fields the family's config has) and `fields`."""

    name: str  # e.g. "BertForTokenClassification"
    model_type: str  # the interop family whose config and weight names it uses ("bert", "gpt2", "llama", ...)
    fields: Mapping[str, Any] = field(default_factory=dict)  # model config fields it implies beyond the task's head
    drops: tuple[str, ...] = ()  # tensors (name prefixes) of a checkpoint that the class leaves out when it loads


@dataclass(frozen=True)
class TaskCommand:
    """The command a task adds to `attnkit` (`attnkit NAME RUN ...`, its pipeline method on texts): a settings
    dataclass, each field one of its options (`attnkit.options`; `attnkit.run_settings` holds what loading a run and
    reading texts take), and `run(settings, load)`, which returns the exit code; `load(settings)` gives the run's
    pipeline (`attnkit.load` as the settings' load options say)."""

    name: str
    help: str
    settings: type
    run: Callable[[Any, Callable[[Any], Any]], int]


@dataclass(frozen=True)
class TaskSpec:
    """One task, registered once (module docstring)."""

    name: str
    help: str  # one line for --task's help and messages
    families: tuple[str, ...]  # the model families that train for it (`attnkit.models.families`)
    make: Callable[[TaskContext], tuple[TrainingTask, list[str] | None]]  # -> the trainer's task, its labels
    evaluate_files: Callable[[EvalContext], Any]  # attnkit eval: -> an EvalReport (`attnkit.tasks.report`)
    default_model: Mapping[str, Any]  # the small model a run starts from without --preset or --model-config
    head: Mapping[str, Any] = field(default_factory=dict)  # config fields the task's model must have (where they exist)
    method: str | None = None  # the pipeline method a run of this task serves (`attnkit.load(run).METHOD`)
    pipeline: Callable[..., Any] | None = None  # that method, for one the pipeline does not define itself
    stream: bool = False  # reads a token stream (text files; no --val-data, no --batch-tokens)
    seed_draws_validation: Literal["always", "without_val_data", "never"] = "always"
    """what --seed draws of the validation set: mlm's masks (always), the examples held out of the training data
    where no --val-data is given, or nothing (lm scores the stream's tail); a synthetic set's examples come from
    the seed whatever this says. A resume refuses another seed where it draws the validation set"""
    labelled: bool = False  # learns a label set (labels.json; n_classes from the data)
    decodes: bool = False  # evaluation decodes text (attnkit eval passes `translate_texts`)
    reference_copy: bool = False  # a fine-tune holds a frozen copy of its starting weights beside the model (dpo's
    # reference, but under LoRA, where the reference is the model with its adapters off): the memory check counts it
    training_text: Callable[[Any, int], list[str]] | None = None  # (data, seed) -> text a new tokenizer learns
    options: tuple[str, ...] = ()  # the DataConfig fields it reads beyond every task's (`train.job.EVERY_TASK`)
    own_options: type | None = None
    """a dataclass of the options this task alone reads (tag's `tag_column`): flags of train and eval, --set and
    --config keys, saved with the run's data settings; `make` reads them as `context.data.options`, evaluation as
    `context.options`"""
    eval_options: tuple[str, ...] = ()  # the attnkit eval settings it reads beyond every task's (`EvalSettings`)
    hf_architectures: tuple[HFClass, ...] = ()  # the Hugging Face classes its models convert to and from
    eval_help: str = ""  # what `attnkit eval --data` takes for this task
    command: TaskCommand | None = None  # the command it adds to `attnkit` (`attnkit.cli` lists it with its own)

    def check_family(self, family: str) -> None:
        """Raise ConfigError unless models of `family` train for this task."""
        if family not in self.families:
            fits = [family_of(f) for f in self.families]
            raise ConfigError(
                f"--task {self.name} trains a {' or a '.join(f.name + ' model' for f in fits)}, but the config's "
                f"family is {family!r}; use such a preset (e.g. --preset {' or '.join(f.example for f in fits)}) "
                f"or --set family={fits[0].name}"
            )

    def fits(self, config: ModelConfig) -> bool:
        """Whether a model of `config` is built for this task: its family trains for it and its head is the task's
        (head fields its family's config lacks do not apply to it)."""
        return config.family in self.families and all(getattr(config, k, v) == v for k, v in self.head.items())

    def own_option_names(self) -> tuple[str, ...]:
        """The names of its own options (`own_options`' fields)."""
        return tuple(f.name for f in dataclasses.fields(self.own_options)) if self.own_options is not None else ()

    def head_of(self, family: str) -> dict[str, Any]:
        """The head fields that models of `family` have (a family's config may lack some of the task's)."""
        fields = {f.name for f in dataclasses.fields(config_class(family))}
        return {k: v for k, v in self.head.items() if k in fields}

    def with_head(self, config: ModelConfig, sets: Sequence[str] = ()) -> ModelConfig:
        """`config` with the user's `--set key=value` assignments `sets` and the task's head. The family is checked
        first, and an assignment that contradicts the head is a ConfigError naming both."""
        explicit = assignments(sets)
        for key, value in self.head.items():
            if key in explicit and explicit[key] != value:
                raise ConfigError(f"--task {self.name} needs {key}={value!r}, but --set {key}={explicit[key]!r} asks "
                                  f"for another; drop that --set (the task sets its head itself)")
        family = explicit.get("family", config.family)
        self.check_family(family)
        return config.replace(**{**explicit, **self.head_of(family)})


_TASKS: dict[str, TaskSpec] = {}
_plugins_loaded = False


def register(spec: TaskSpec) -> TaskSpec:
    """Add a task. Raises ConfigError when its name is taken or it names an unknown family."""
    if spec.name in _TASKS:
        raise ConfigError(f"task {spec.name!r} is registered already")
    taken = {other.command.name: other.name for other in _TASKS.values() if other.command is not None}
    if spec.command is not None and spec.command.name in taken:
        raise ConfigError(f"task {spec.name!r} adds the command {spec.command.name!r}, which task "
                          f"{taken[spec.command.name]!r} adds already; name it otherwise")
    for family in spec.families:
        family_of(family)  # raises for an unknown family
    if spec.method is not None and spec.method not in METHODS and spec.pipeline is None:
        raise ConfigError(f"task {spec.name!r} names pipeline method {spec.method!r}, which the pipeline lacks; "
                          f"give its implementation as pipeline= (the pipeline's own methods: {', '.join(METHODS)})")
    for other in _TASKS.values():
        shared = set(spec.own_option_names()) & set(other.own_option_names())
        if shared and other.own_options is not spec.own_options:
            raise ConfigError(f"task {spec.name!r} names its own option {sorted(shared)[0]!r}, which task "
                              f"{other.name!r} has in another class; share that class ({other.own_options.__name__}) "
                              "or name the option otherwise")
    _TASKS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a task (a test's own, once it is done)."""
    _TASKS.pop(name, None)


def _load_plugins() -> None:
    """Import the modules named in the `attnkit.tasks` entry-point group, once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINTS):
        try:
            entry.load()
        except Exception as err:  # a broken plug-in must not take the built-in tasks down with it
            log.warning("the task module %s (entry point %r) failed to import: %s", entry.value, entry.name, err)


def tasks() -> list[TaskSpec]:
    """Every registered task, built-in ones first."""
    _load_plugins()
    return list(_TASKS.values())


def task_names() -> tuple[str, ...]:
    return tuple(spec.name for spec in tasks())


def task_spec(name: str) -> TaskSpec:
    """The registered task `name`. Raises ConfigError naming the known tasks and the nearest one."""
    _load_plugins()
    if name not in _TASKS:
        near = difflib.get_close_matches(str(name), list(_TASKS), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        known = "; ".join(f"{spec.name} ({spec.help})" for spec in _TASKS.values())
        raise ConfigError(f"unknown task {name!r}{hint}; the tasks are {known}")
    return _TASKS[name]


def own_options() -> dict[str, tuple[TaskSpec, ...]]:
    """Each option that tasks read as their own (`TaskSpec.own_options`' fields), with those tasks."""
    found: dict[str, tuple[TaskSpec, ...]] = {}
    for spec in tasks():
        for name in spec.own_option_names():
            found[name] = (*found.get(name, ()), spec)
    return found


def unread_options(spec: TaskSpec, names: Iterable[str], applicable: Callable[[TaskSpec], Collection[str]],
                   run: str | Path | None = None) -> dict[str, str]:
    """Of the options `names`, those that task `spec` does not read (`applicable(task)`: the names a task reads),
    each with why, naming the tasks that read it: `--NAME does not apply to RUN, whose task is T: it is for runs of
    a, b` (`run`: a run of `spec`), else `--NAME does not apply to --task T: it is for --task a, b`. A command whose
    options depend on its task (`attnkit train --task T`, `attnkit eval RUN`) hides these and refuses them given."""
    subject, readers = (f"--task {spec.name}", "--task") if run is None else (f"{run}, whose task is {spec.name}",
                                                                             "runs of")
    found = {}
    for name in names:
        if name not in applicable(spec):
            who = [other.name for other in tasks() if name in applicable(other)]
            found[name] = f"{flag(name)} does not apply to {subject}: " + (
                f"it is for {readers} {', '.join(who)}" if who else "no registered task reads it")
    return found


def task_of_config(config: ModelConfig) -> TaskSpec | None:
    """The task a model of `config` is built for (by family and head), or None (a bare encoder)."""
    return next((spec for spec in tasks() if spec.fits(config)), None)


def tasks_of_family(family: str) -> list[TaskSpec]:
    """The tasks models of `family` train for."""
    return [spec for spec in tasks() if family in spec.families]


CONVERTED = "converted"  # `task_record`'s key for a run converted from Hugging Face, which has no task.json


def task_record(directory: str | Path) -> dict[str, Any]:
    """A run's task.json: `{"task": NAME, ...}` with what its task saved beside the name (`TrainingTask.record`);
    for a run without one, {CONVERTED: True} where it was converted from Hugging Face (its hf_source.json), else {}.
    Raises CheckpointError for one that is not a JSON object or whose task is not a name."""
    path = Path(directory) / TASK_FILE
    if not path.is_file():
        return {CONVERTED: True} if (Path(directory) / HF_SOURCE_FILE).is_file() else {}
    found = read_json(path)
    if not isinstance(found, dict) or not isinstance(found.get("task", ""), str):
        raise CheckpointError(f'{path} must hold {{"task": NAME, ...}} with NAME a string such as "lm"; got '
                              f"{found!r:.80}: write the task's name again, or remove the file to read the run as its "
                              "model's task")
    return found


def task_of_run(directory: str | Path, config: ModelConfig) -> TaskSpec | None:
    """The task a run was trained for: its task.json's (when that task is registered and fits the model), else the
    task its config is built for (`task_of_config`: converted and older runs)."""
    path = Path(directory) / TASK_FILE
    if path.is_file():
        name = task_record(directory).get("task")
        spec = _TASKS.get(name) if name is not None else None
        if spec is None and name is not None:
            _load_plugins()
            spec = _TASKS.get(name)
        if spec is not None and spec.fits(config):
            return spec
        if name is not None and spec is None:
            log.warning("%s was trained for task %r, which is not registered here; reading it as its model's task",
                        directory, name)
    return task_of_config(config)
