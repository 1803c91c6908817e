"""Short language-model runs the experiments share: a character-level corpus and a plain training loop.

The corpus is the Python standard library's own source (every installation has it: real text, no download),
read up to a byte budget and split 90/10. The loop is the trainer's recipe without its run directory: AdamW
over `train.optim.param_groups`, warmup then cosine, gradient clipping; it records what the experiments plot
(loss per step, step times) and stops early when the loss turns non-finite.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import nn

from attnkit.checkpoint import load_weights, unique_state_dict
from attnkit.config import ModelConfig
from attnkit.data import LMData, read_text, stdlib_files
from attnkit.experiments.arms import Arm, is_number
from attnkit.experiments.base import Progress
from attnkit.models import build_model
from attnkit.tokenize import train_tokenizer
from attnkit.train.optim import lr_factor, make_optimizer


@dataclass
class Corpus:
    data: LMData
    vocab_size: int

    @property
    def fingerprint(self) -> str:
        """The SHA-256 of the token stream and its split: the same text, cut the same way."""
        tokens = np.ascontiguousarray(self.data.tokens)
        return hashlib.sha256(tokens.tobytes() + f"{tokens.dtype}:{self.data.n_train}".encode()).hexdigest()


def char_corpus(max_bytes: int) -> Corpus:
    """The standard library's first source files (`stdlib_files`' order) whose sizes add up to at most `max_bytes`,
    joined by newlines, as character ids. Whole files only, so the text can fall well short of `max_bytes` (Python
    3.11's: 11,708 characters at 20,000, 98,978 at 300,000, 978,512 at 1,000,000); only a first file larger than
    `max_bytes` is cut to it."""
    text, size = [], 0
    for path in stdlib_files(max_bytes):
        piece = read_text(path, errors="replace")
        text.append(piece)
        size += len(piece)
        if size >= max_bytes:
            break
    joined = "\n".join(text)[:max_bytes]
    tokenizer = train_tokenizer("char", [joined])
    return Corpus(LMData.from_ids(tokenizer.encode(joined), val_fraction=0.1), tokenizer.vocab_size)


@dataclass
class RunLog:
    """What one training run left: the loss at each step, the validation loss, the time, and whether it diverged."""

    losses: list[float] = field(default_factory=list)
    val_loss: float = math.nan
    seconds: float = 0.0
    diverged: bool = False
    step_seconds: list[float] = field(default_factory=list)
    model: nn.Module | None = None

    def values(self) -> dict:
        """What the run measured, as JSON values (the model aside)."""
        return {"losses": self.losses, "val_loss": self.val_loss, "seconds": self.seconds, "diverged": self.diverged,
                "step_seconds": self.step_seconds}

    @classmethod
    def from_values(cls, values: dict, model: nn.Module) -> RunLog:
        """The run `values()` describes, with its trained `model`; a value missing or of the wrong kind: ValueError
        (a loss as text read as a number, "false" as diverged)."""
        try:
            losses, val_loss, seconds = values["losses"], values["val_loss"], values["seconds"]
            diverged, step_seconds = values["diverged"], values["step_seconds"]
        except KeyError as error:
            raise ValueError(f"a run's values lack {error}") from None
        lists = isinstance(losses, list) and isinstance(step_seconds, list)
        if not (lists and all(map(is_number, [*losses, *step_seconds, val_loss, seconds]))
                and isinstance(diverged, bool)):
            raise ValueError("a run's losses, step_seconds (lists), val_loss and seconds must be numbers, and diverged "
                             "true or false")
        return cls([float(v) for v in losses], float(val_loss), float(seconds), diverged,
                   [float(v) for v in step_seconds], model)

    @property
    def median_step_ms(self) -> float:
        """The median time of a training step in ms (insensitive to the slow first steps)."""
        return 1000 * statistics.median(self.step_seconds) if self.step_seconds else math.nan


def initial_model(config: ModelConfig, corpus: Corpus, seed: int) -> nn.Module:
    """The character decoder of `config` over `corpus`'s vocabulary as `train_lm` builds it for `seed`, before any
    step: what an experiment measures at initialisation."""
    torch.manual_seed(seed)
    return build_model(config.replace(vocab_size=corpus.vocab_size))


def train_lm(
    config: ModelConfig,
    corpus: Corpus,
    *,
    steps: int,
    batch_size: int = 16,
    seq_len: int = 64,
    lr: float = 1e-3,
    warmup: int = 20,
    seed: int = 0,
    clip: float = 1.0,
    init: Callable[[nn.Module], None] | None = None,
    eval_batches: int = 20,
    progress: Progress | None = None,
    desc: str = "training",
    device: str = "cpu",
) -> RunLog:
    """Train a decoder built from `config` for `steps` optimizer steps; evaluate on the validation split.

    init: re-initialises the built model in place (an experiment's own scheme; default: the builder's GPT-2 one).
    progress: shows the steps as `desc` (default: a log line every fifth of them), and where it keeps its arms, the
    run is one arm named `desc`: reused from there where a stopped run of the same command finished it (the same
    config, corpus, arguments and code), else trained and saved there; device: where it trains.
    """
    progress = progress or Progress()
    train = partial(_train_lm, config, corpus, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                    warmup=warmup, seed=seed, clip=clip, init=init, eval_batches=eval_batches, progress=progress,
                    desc=desc, device=device)
    setting = {"config": config.to_json(), "corpus": corpus.fingerprint, "steps": steps, "batch_size": batch_size,
               "seq_len": seq_len, "lr": lr, "warmup": warmup, "seed": seed, "clip": clip, "eval_batches": eval_batches,
               "init": init_name(init), "device": device}

    def trained() -> tuple[RunLog, Arm]:
        log = train()
        return log, Arm(log.values(), unique_state_dict(log.model))

    def restored(arm: Arm) -> RunLog:
        model = initial_model(config, corpus, seed)
        if init is not None:
            init(model)
        load_weights(model, arm.tensors, source=f"the saved arm {desc!r}")
        return RunLog.from_values(arm.values, model.to(device))

    return progress.arm(desc, setting, trained, restored)


def init_name(init: Callable[[nn.Module], None] | None) -> str | None:
    """How a training run's setting names its `init`: the function's module and name, a partial's with its arguments
    (a scale given as an argument changes the model; a closure's captured values are not named: give it a name of its
    own), a callable object's class."""
    if init is None:
        return None
    if isinstance(init, partial):
        return f"{init_name(init.func)}(*{init.args!r}, **{init.keywords!r})"
    return f"{init.__module__}.{getattr(init, '__qualname__', type(init).__qualname__)}"


def _train_lm(config: ModelConfig, corpus: Corpus, *, steps: int, batch_size: int, seq_len: int, lr: float,
              warmup: int, seed: int, clip: float, init: Callable[[nn.Module], None] | None, eval_batches: int,
              progress: Progress, desc: str, device: str) -> RunLog:
    model = initial_model(config, corpus, seed)
    if init is not None:
        init(model)
    model.to(device)
    optimizer = make_optimizer(model, lr=lr, weight_decay=0.1)
    generator = torch.Generator().manual_seed(seed)
    log = RunLog(model=model)
    start = time.perf_counter()
    model.train()
    for step in progress.steps(steps, desc):
        step_start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr * lr_factor("cosine", step, warmup=warmup, progress=step / steps)
        x, y = (t.to(device) for t in corpus.data.sample_batch("train", batch_size, seq_len, generator))  # (B, T)
        loss = model(x, labels=y, return_logits=False).loss
        if not torch.isfinite(loss):
            log.diverged = True
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        log.losses.append(loss.item())  # waits for the step on a GPU: its time is the step's
        log.step_seconds.append(time.perf_counter() - step_start)
    log.seconds = time.perf_counter() - start
    log.val_loss = math.nan if log.diverged else validation_loss(model, corpus, seq_len, batch_size, eval_batches)
    return log


@torch.no_grad()
def validation_loss(model: nn.Module, corpus: Corpus, seq_len: int, batch_size: int, max_batches: int) -> float:
    """Mean next-token loss over windows spread evenly over the validation split."""
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for x, y in corpus.data.iter_eval_batches("val", batch_size=batch_size, seq_len=seq_len, max_batches=max_batches):
        total += model(x.to(device), labels=y.to(device), return_logits=False).loss.item() * y.numel()
        count += y.numel()
    model.train()
    return total / count


def training_flops(config: ModelConfig, n_params: int, tokens: int, seq_len: int) -> float:
    """Training FLOPs: 6 per parameter per token (forward 2, backward 4; Kaplan et al. 2020) plus attention's
    scores and weighted sum, 6 * 2 * n_layers * T * d_attn per token (half of it under the causal mask)."""
    attention = 6 * 2 * config.n_layers * seq_len * config.n_heads * config.resolved.head_dim / 2
    return tokens * (6 * n_params + attention)
