"""Fine-tuning: a new run that starts from trained weights (`attnkit train --init-from RUN_DIR|HF_DIR`).

    read_source(dir)      an attnkit run (its latest weights, adapters folded in) or a Hugging Face directory
                          (read by `attnkit.interop.hf.load`, passed in: train/ never imports interop/), with its
                          tokenizer, labels and the task it was trained for
    target_config(...)    the source's config with the head the new task needs (classify: n_classes from the data)
    load_body(model, src) the body's weights copied strictly (every tensor present, every shape equal); a head that
                          does not fit (another head, a new label set, other sizes) keeps its fresh initialisation
    prepare_training(...) which parameters train: all, all but the body or the embeddings (`freeze`), or LoRA
                          adapters (and any fresh head) only
    resume_lora(dir, ...) a LoRA run's checkpoint read back as it trained: the base wrapped again, its adapters
                          loaded (reading a run otherwise folds them in)
    reference_loader(...) the frozen model a run was fine-tuned from, built on demand (DPO's reference)

The body is everything but the task head: the stack(s) of blocks with their embeddings. The head modules are
the ones a model family puts on top (`HEAD_MODULES`). BERT's pooler counts as head: it is kept when the source
has one of the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from attnkit.chat_format import DEFAULT_FORMAT, ChatTemplate, chat_template
from attnkit.checkpoint import (
    ADAPTERS_FILE,
    CONFIG_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    load_adapter_file,
    load_model,
    raise_mismatch,
    read_json,
    read_labels,
)
from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError, ConfigError
from attnkit.layers.embedding import Embeddings
from attnkit.models import build_model, count_parameters
from attnkit.tasks import TaskSpec, task_of_config, task_record
from attnkit.tokenize import Tokenizer, load_tokenizer
from attnkit.train.lora import apply_lora, load_adapters, tied_modules
from attnkit.train.state import config_differences

log = logging.getLogger(__name__)

HEAD_MODULES = ("classifier", "lm_head", "transform", "pooler")  # top-level modules outside the body
Freeze = Literal["none", "body", "embeddings"]
FREEZE_CHOICES: tuple[str, ...] = get_args(Freeze)
HFLoader = Callable[[Path], Any]  # attnkit.interop.hf.load: directory -> HFModel (model, config, tokenizer, labels)


@dataclass
class Source:
    """Trained weights a new run starts from."""

    path: Path
    kind: str  # "attnkit run" | "Hugging Face directory"
    config: ModelConfig
    tokenizer: Tokenizer
    state: dict[str, Tensor]  # the source model's state_dict
    labels: list[str] | None = None  # a classifier's label names, index = class id
    task: str | None = None  # the task the source run trained for, when it says
    record: dict[str, Any] | None = None  # the source run's task.json (`task_record`); None: a Hugging Face directory
    chat_template: ChatTemplate = DEFAULT_FORMAT  # its tokenizer's own (a chat model's), which the new run keeps

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "kind": self.kind, "task": self.task}

    def frozen_model(self) -> nn.Module:
        """The source's model as it is, in eval mode with every parameter frozen: the reference a preference
        fine-tune measures against (`attnkit.tasks.dpo`)."""
        model = build_model(self.config, force=True)
        model.load_state_dict(self.state)
        return model.eval().requires_grad_(False)


@dataclass
class InitReport:
    """What `load_body` did: how many tensors came from the source, which head modules start fresh and why,
    and which of the source's head modules the new model has no place for."""

    loaded: int
    fresh: dict[str, str] = field(default_factory=dict)  # module -> reason
    dropped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"loaded_tensors": self.loaded, "fresh": self.fresh, "dropped": self.dropped}


def read_source(path: str | Path, *, load_hf: HFLoader | None = None) -> Source:
    """The weights, config, tokenizer, labels and task in `path`: an attnkit run directory (or one of its
    checkpoints) or a Hugging Face model directory.

    Raises CheckpointError for a directory with no config, no weights or no tokenizer; ConfigError when a Hugging
    Face directory is given but no `load_hf` to read it.
    """
    path = Path(path).resolve()
    if not (path / CONFIG_FILE).is_file():
        raise CheckpointError(f"--init-from {path}: no {CONFIG_FILE} there; point it at an attnkit run directory "
                              "(runs/NAME) or a Hugging Face model directory")
    raw = read_json(path / CONFIG_FILE)
    if "model_type" in raw and "family" not in raw:
        return _read_hf(path, load_hf)
    if not (path / WEIGHTS_FILE).is_file():
        raise CheckpointError(f"--init-from {path}: the directory holds no weights ({WEIGHTS_FILE}); has the run "
                              "written a checkpoint yet?")
    model, config = load_model(path)
    if not (path / TOKENIZER_DIR).is_dir():
        raise CheckpointError(f"--init-from {path}: no tokenizer/ directory; a new run needs the tokenizer the "
                              "weights were trained with")
    record, tokenizer = task_record(path), load_tokenizer(path / TOKENIZER_DIR)
    return Source(path, "attnkit run", config, tokenizer, model.state_dict(), labels=read_labels(path),
                  task=record.get("task"), record=record,
                  chat_template=chat_template(path / TOKENIZER_DIR, tokenizer.specials))


def _read_hf(path: Path, load_hf: HFLoader | None) -> Source:
    if load_hf is None:
        raise ConfigError(f"--init-from {path} is a Hugging Face directory; reading one needs "
                          "attnkit.interop.hf.load (pass load_hf=, as the command line does)")
    loaded = load_hf(path)
    if loaded.tokenizer is None:
        raise CheckpointError(f"--init-from {path}: the directory has no tokenizer.json; a new run needs the "
                              "tokenizer the weights were trained with")
    trained_for = task_of_config(loaded.config)  # a model's head names the task it was trained for
    task = trained_for.name if trained_for is not None else None
    return Source(path, "Hugging Face directory", loaded.config, loaded.tokenizer, loaded.model.state_dict(),
                  labels=loaded.labels, task=task, chat_template=chat_template(path, loaded.tokenizer.specials))


def target_config(source: Source, *, spec: TaskSpec, assignments: list[str]) -> ModelConfig:
    """The source's config with the head the task `spec` needs and the user's `key=value` assignments
    (`TaskSpec.with_head`). Raises ConfigError when the source's family cannot train for the task, an assignment
    contradicts its head, or the assignments shrink the vocabulary below the tokenizer's.
    """
    try:
        spec.check_family(source.config.family)
    except ConfigError as err:
        raise ConfigError(
            f"--init-from {source.path} holds a {source.config.family} model, which --task {spec.name} cannot train "
            f"({err}); start from a run or directory of the family the task trains, or pick the task that fits it"
        ) from None
    config = spec.with_head(source.config, assignments)
    if config.vocab_size < source.tokenizer.vocab_size:
        raise ConfigError(f"the tokenizer of {source.path} has {source.tokenizer.vocab_size} tokens but the model "
                          f"only {config.vocab_size}; keep the source's vocab_size")
    return config


def reshaping_sets(source: Source, *, spec: TaskSpec, sets: Sequence[str]) -> list[str]:
    """The `--set key=value` assignments among `sets` that, each alone, change the shape of a body tensor of the
    source's model, as `field: source -> asked` (`config_differences`); models are built on the meta device."""

    def body_shapes(assigned: list[str]) -> dict[str, tuple[int, ...]]:
        with torch.device("meta"):
            model = build_model(spec.with_head(source.config, assigned), force=True)
        return {k: tuple(v.shape) for k, v in model.state_dict().items() if _module(k) not in HEAD_MODULES}

    own, reshaping = body_shapes([]), []
    for assignment in sets:
        try:
            if body_shapes([assignment]) == own:
                continue
        except ConfigError:  # a field that needs others changed with it: judged by the others
            continue
        asked = spec.with_head(source.config, [assignment]).to_dict()
        reshaping += [change for change in config_differences(source.config.to_dict(), asked)
                      if change.split(":")[0] == assignment.split("=")[0].strip()]
    return reshaping


def load_body(model: nn.Module, source: Source, *, labels: list[str] | None = None,
              changed: Sequence[str] = ()) -> InitReport:
    """Copy the source's weights into `model` (built from `target_config`): the body strictly, each head module
    when the source has it with the same shapes (a classifier only for the same label list), else left fresh.
    `changed`: the model fields the user's --set changed from the source's config that change a tensor's shape
    (`reshaping_sets`).

    Raises CheckpointError listing every body tensor that is missing from the source, left over in it, or of
    another shape; ConfigError naming `changed` when there are such fields.
    """
    target = model.state_dict()
    body = {k for k in target if _module(k) not in HEAD_MODULES}
    source_body = {k for k in source.state if _module(k) not in HEAD_MODULES}
    mismatched = [f"{k}: source {tuple(source.state[k].shape)} vs model {tuple(target[k].shape)}"
                  for k in sorted(body & source_body) if source.state[k].shape != target[k].shape]
    missing, unexpected = sorted(body - source_body), sorted(source_body - body)
    if changed and (missing or unexpected or mismatched):
        first = (mismatched or [f"{k}: not in the source" for k in missing] or [f"{k}: not in the model"
                                                                                  for k in unexpected])[0]
        raise ConfigError(
            f"--set changes the model of --init-from {source.path} ({'; '.join(changed)}) into one its weights do "
            f"not fit (e.g. {first}): drop the --set fields that change a size (fine-tuning keeps the source's "
            "shapes; dropout and other fields that keep them may change), or train a model of the new shape from "
            "scratch, without --init-from"
        )
    raise_mismatch(f"--init-from {source.path}", missing=missing, unexpected=unexpected, mismatched=mismatched)
    report = InitReport(loaded=0)
    for head in sorted({_module(k) for k in target} & set(HEAD_MODULES)):
        reason = _head_misfit(head, target, source, labels)
        if reason:
            report.fresh[head] = reason
    for name, tensor in target.items():
        if name in body or _module(name) not in report.fresh:
            tensor.data.copy_(source.state[name])  # .data: shared (tied) tensors are written twice, equally
            report.loaded += 1
    report.dropped = sorted({_module(k) for k in source.state} - {_module(k) for k in target})
    log.info("initialised from %s (%s): %d tensors loaded", source.path, source.kind, report.loaded)
    for head, reason in report.fresh.items():
        log.info("  %s starts fresh: %s", head, reason)
    if report.dropped:
        log.info("  not used from the source: %s", ", ".join(report.dropped))
    return report


def _module(key: str) -> str:
    return key.split(".", 1)[0]


def _head_misfit(head: str, target: dict[str, Tensor], source: Source, labels: list[str] | None) -> str | None:
    """Why head module `head` cannot take the source's weights, or None when it can."""
    keys = [k for k in target if _module(k) == head]
    if not any(k in source.state for k in keys):
        return f"the source has no {head}"
    if any(k not in source.state or source.state[k].shape != target[k].shape for k in keys):
        return f"the source's {head} has other tensors or shapes"
    if head == "classifier" and list(source.labels or []) != list(labels or []):
        return f"a new label set {labels} (the source's: {source.labels})"
    return None


def check_freeze(freeze: str) -> None:
    """Raises ConfigError unless `freeze` is one of FREEZE_CHOICES."""
    if freeze not in FREEZE_CHOICES:
        raise ConfigError(f"freeze={freeze!r} is not a choice; use one of {', '.join(FREEZE_CHOICES)}")


def prepare_training(
    model: nn.Module,
    *,
    freeze: str = "none",
    lora_rank: int = 0,
    lora_alpha: float = 16.0,
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj"),
    lora_dropout: float = 0.0,
    fresh: tuple[str, ...] = (),
) -> None:
    """Decide which parameters of `model` train, in place (before the optimizer is built).

    freeze: "body" trains the head modules only; "embeddings" freezes every embedding table (token, position,
        token type; an output layer tied to the token table too). lora_rank > 0 wraps `lora_targets` in LoRA
        adapters and freezes everything else except the `fresh` head modules, which must learn from scratch.
    Raises ConfigError for an unknown freeze choice, LoRA with freeze, or LoRA targets naming no module.
    """
    check_freeze(freeze)
    if lora_rank and freeze != "none":
        raise ConfigError("LoRA already freezes every weight but the adapters (and a fresh head); drop --freeze")
    if lora_rank:
        apply_lora(model, targets=lora_targets, rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout)
        for head in fresh:
            model.get_submodule(head).requires_grad_(True)
            log.info("  %s (fresh) trains whole: %s parameters", head,
                     f"{count_parameters(model.get_submodule(head)):,}")
    elif freeze == "body":
        tied = {m: body for m, body in tied_modules(model).items() if _module(m) in HEAD_MODULES}
        if tied:
            head, body = next(iter(tied.items()))
            raise ConfigError(
                f"freeze='body' would freeze the head too: {head} shares its weight with {body} (tied embeddings), "
                "so nothing of it would train; use --freeze embeddings or none, or LoRA (--lora-rank) on the body"
            )
        for name, param in model.named_parameters():
            param.requires_grad_(_module(name) in HEAD_MODULES)
    elif freeze == "embeddings":
        for module in model.modules():
            if isinstance(module, Embeddings):
                module.requires_grad_(False)
    if freeze != "none":
        frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        log.info("freeze %s: %s of %s parameters frozen", freeze, f"{frozen:,}",
                 f"{count_parameters(model):,}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"freeze={freeze!r} leaves nothing to train: this model has no head modules "
                          f"({', '.join(HEAD_MODULES)})")


def resume_lora(
    directory: Path,
    *,
    device: Any,
    rank: int,
    alpha: float,
    targets: tuple[str, ...],
    dropout: float,
    fresh: tuple[str, ...],
) -> nn.Module:
    """The model of a LoRA run's checkpoint in `directory` as it was training: the base weights, wrapped again by
    `prepare_training` and given the saved adapters (names and shapes checked exactly), in train mode.

    Raises CheckpointError when the adapters are missing or do not fit the settings.
    """
    if not (directory / ADAPTERS_FILE).is_file():
        raise CheckpointError(f"{directory} was trained with LoRA (lora_rank={rank}) but holds no {ADAPTERS_FILE}")
    model, _ = load_model(directory, device=device, merge_adapters=False)
    model.train()
    prepare_training(model, lora_rank=rank, lora_alpha=alpha, lora_targets=targets, lora_dropout=dropout,
                     fresh=fresh)
    tensors, alphas = load_adapter_file(directory / ADAPTERS_FILE)
    if any(a != alpha for a in alphas.values()):
        raise CheckpointError(f"{directory / ADAPTERS_FILE} was saved with lora_alpha {sorted(set(alphas.values()))}, "
                              f"not {alpha}; resume with the run's own LoRA settings")
    load_adapters(model, tensors, source=str(directory / ADAPTERS_FILE))
    return model


def reference_loader(run: Path, train_state: dict[str, Any], *,
                     load_hf: HFLoader | None = None) -> Callable[[], nn.Module] | None:
    """What builds the frozen model the run in `run` started from (`train_state`: its train_state.json), or None for
    a run not fine-tuned: a LoRA run's own base weights (its adapters left out), else the --init-from source's
    weights, read again (CheckpointError when they are gone)."""
    if "init_from" not in train_state:
        return None
    if train_state.get("settings", {}).get("lora_rank"):
        return lambda: load_model(run, merge_adapters=False)[0].eval().requires_grad_(False)
    return lambda: read_source(train_state["init_from"]["path"], load_hf=load_hf).frozen_model()
