"""The tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens"): the
logit lens with an affine translator per layer, trained so that each layer's stream, translated and read through the
model's own final norm and output layer, predicts what the model finally predicts (the KL from its final logits).

    h_l  ->  h_l + A_l h_l + b_l  ->  final norm? -> (MLM transform?) -> lm_head -> V      (A_l, b_l start at 0)

The layers are the logit lens's (the stream after the embeddings and after each block); the last is the model's own
input to its output layer and keeps no translator (its reading is the model's logits), as in the paper. Training reads
the model frozen: the streams of the given batches are taken once (the final distribution read back from the last as a
step needs it), then the translators are fitted on the KL summed over layers, all at once, by the paper's optimizer as
its package sets it: SGD with Nesterov momentum 0.9 and learning rate 1.0 decayed linearly to 0 over 250 steps, that
rate taken as the package takes it, times 1 - momentum (PyTorch's momentum scales a step by 1 / (1 - momentum), which
the package undoes: 0.1 as PyTorch reads it), weight decay 1e-3 (toward the identity, as the translator is
`h + A h + b`) and the gradient clipped to norm 1, each step on `batch_tokens` tokens drawn from the streams. A lens
is scored `SCORED_TOKENS` (512) tokens at a time, so that no more than (512, V) log-probabilities are held a layer.
(Adam, whose steps keep their size as the gradient vanishes, wanders off a translator that is already right: a layer
whose stream is the last's drifted to weights of 0.04 under it, and stays within 1e-5 of the identity under SGD.) A lens
is saved as safetensors (`translators.L.weight`, `.bias`) beside a JSON record of its layers, its width and the hash of
the output layer it was trained with (`output_digest`, as the tuned-lens package records its unembedding's), and checked
against the first two, and against the model, when read: read for a model whose output layer hashes otherwise, it warns.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.checkpoint import load_tensors, read_json, save_tensors
from attnkit.errors import CheckpointError, InputError
from attnkit.inspect.inputs import Batch, check_batch
from attnkit.inspect.logit_lens import LogitLens, lens_layers, lens_width, unembedding
from attnkit.inspect.points import evaluated, module_of
from attnkit.inspect.tracing import trace
from attnkit.outputs import atomic_output, atomic_write

log = logging.getLogger(__name__)

CONFIG_FILE, WEIGHTS_FILE = "tuned_lens.json", "tuned_lens.safetensors"
MOMENTUM, WEIGHT_DECAY, MAX_GRAD_NORM = 0.9, 1e-3, 1.0  # the paper's SGD, as the tuned-lens package sets it
PAPER_STEPS = 250  # the paper's training steps, over which its learning rate decays to 0
SCORED_TOKENS = 512  # tokens read through the output layer at once when scoring: (512, V) log-probabilities a layer


class TunedLens(nn.Module):
    """One affine translator per layer but the last, each `h + A h + b` (A (C, C), b (C,)), zero at the start: the
    logit lens. `layers` names the streams it reads, in the logit lens's order; `trained_on` is the `output_digest` of
    the model it was trained on (None: unknown)."""

    def __init__(self, layers: list[str], d_model: int, trained_on: str | None = None) -> None:
        super().__init__()
        self.layers = list(layers)
        self.trained_on = trained_on
        self.translators = nn.ModuleList(nn.Linear(d_model, d_model) for _ in layers[:-1])
        for translator in self.translators:
            nn.init.zeros_(translator.weight)
            nn.init.zeros_(translator.bias)

    @property
    def width(self) -> int | None:
        """The streams' width C (None: a lens of one layer, which translates nothing)."""
        return self.translators[0].in_features if len(self.translators) else None

    def forward(self, index: int, stream: Tensor) -> Tensor:
        """Layer `index`'s stream (…, C) translated toward the last layer's, in the stream's dtype (the translators
        compute in theirs: a bf16 model's stream is translated in fp32); the last layer's as it is."""
        if index == len(self.translators):
            return stream
        translator = self.translators[index]
        wide = stream.to(translator.weight.dtype)
        return (wide + translator(wide)).to(stream.dtype)


@dataclass(frozen=True)
class _Streams:
    """Every layer's stream at the tokens of some batches, (L + 1, N, C) in the model's dtype (which its output layer
    reads): what a lens is trained and scored on. The final distribution is read from the last layer's stream as it is
    needed (`final`), where keeping it, (N, V), took a 50k vocabulary's model about 1 MB a token."""

    layers: list[str]
    streams: Tensor

    def final(self, unembed: Callable[[Tensor], Tensor], tokens: Tensor | slice) -> Tensor:
        """The model's final log-probabilities at `tokens` (n, V), in fp32."""
        with torch.no_grad():
            return unembed(self.streams[-1, tokens]).float().log_softmax(-1)


@torch.no_grad()
@evaluated
def _read_streams(model: nn.Module, batches: Iterable[Batch]) -> _Streams:
    """Every layer a lens reads, at the tokens of `batches` but their padding (InputError for none)."""
    model = module_of(model)
    layers = lens_layers(model)  # InputError for a model with no output layer over a stack
    streams = []
    for batch in batches:
        check_batch(batch, "a tuned lens's batch")
        read = trace(model, *batch.args, names=layers, **batch.kwargs)
        stacked = torch.stack([read[name] for name in layers])  # (L + 1, B, T, C)
        mask = batch.kwargs.get("tgt_mask", batch.kwargs.get("attention_mask"))  # the read stack's (a target's)
        keep = (mask.bool() if isinstance(mask, Tensor) and mask.shape == stacked.shape[1:3] else
                torch.ones(stacked.shape[1:3], dtype=torch.bool, device=stacked.device))  # (B, T): padding no token
        streams.append(stacked[:, keep])  # (L + 1, N, C)
    if not streams:
        raise InputError("a tuned lens is trained and scored on texts: give at least one batch")
    return _Streams(layers, torch.cat(streams, 1))


def _divergences(model: nn.Module, lens: TunedLens | None, found: _Streams) -> Tensor:
    """Each layer's mean KL(final || lens reading) over the tokens, (L + 1,); `lens` None: the logit lens. Read
    SCORED_TOKENS tokens at a time."""
    _, unembed = unembedding(module_of(model))
    tokens = found.streams.shape[1]
    total = torch.zeros(len(found.layers))  # (L + 1,): summed KL per layer
    for start in range(0, tokens, SCORED_TOKENS):
        span = slice(start, start + SCORED_TOKENS)
        final = found.final(unembed, span)  # (n, V)
        for index in range(len(found.layers)):
            stream = found.streams[index, span]  # (n, C)
            read = unembed(stream if lens is None else lens(index, stream)).float().log_softmax(-1)  # (n, V)
            total[index] += F.kl_div(read, final, log_target=True, reduction="sum").cpu()
    return total / tokens


@evaluated
def train_tuned_lens(model: nn.Module, batches: list[Batch], *, steps: int = PAPER_STEPS, lr: float = 1.0,
                     batch_tokens: int = 256, generator: torch.Generator | None = None) -> TunedLens:
    """Fit a TunedLens to `model`'s streams on `batches` (their tokens, padding left out by `attention_mask`, or a
    translation's `tgt_mask`): `steps` SGD steps (module docstring) on the KL from the final logits summed over layers,
    `batch_tokens` tokens drawn per step (the paper's 2^18 are more than a small run's texts hold), at the paper's
    learning rate `lr` (PyTorch's lr * (1 - momentum)). The model is left as it was. Raises InputError for no batches or
    steps below 1."""
    if steps < 1:
        raise InputError(f"steps={steps}: a tuned lens needs at least one training step (the paper's uses 250)")
    found = _read_streams(model, batches)
    model = module_of(model)
    lens = TunedLens(found.layers, found.streams.shape[-1], output_digest(model)).to(found.streams.device)
    _, unembed = unembedding(model)
    trainable = [p for p in model.parameters() if p.requires_grad]  # frozen for the run, thawed after
    optimizer = torch.optim.SGD(lens.parameters(), lr=lr * (1 - MOMENTUM), momentum=MOMENTUM, nesterov=True,
                                weight_decay=WEIGHT_DECAY)  # lr: the paper's rate (module docstring)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    tokens = found.streams.shape[1]
    try:
        for p in trainable:  # the model's weights are read, never trained, and their .grad is left alone
            p.requires_grad_(False)
        for step in range(1, steps + 1):
            picked = torch.randint(tokens, (min(batch_tokens, tokens),), generator=generator)  # (n,) token indices
            picked = picked.to(found.streams.device)
            final = found.final(unembed, picked)  # (n, V)
            loss = 0.0
            for index in range(len(lens.translators)):  # the last layer reads as it is: KL 0
                read = unembed(lens(index, found.streams[index, picked])).float().log_softmax(-1)  # (n, V)
                loss = loss + F.kl_div(read, final, log_target=True, reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(lens.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            schedule.step()
            if step % max(1, steps // 10) == 0 or step == steps:  # progress: ten lines a run
                log.info("tuned lens step %d/%d: KL summed over layers %.4f", step, steps, float(loss.detach()))
    finally:
        for p in trainable:
            p.requires_grad_(True)
    return lens.requires_grad_(False).eval()


@torch.no_grad()
@evaluated
def tuned_lens(model: nn.Module, lens: TunedLens, *args: Tensor) -> LogitLens:
    """Run `model(*args)` and read each layer's stream through its translator and `unembedding`: the logit lens's
    result, (L + 1, B, T, V), its last row the model's own logits. Raises InputError for a lens of another model."""
    model = module_of(model)
    check_lens(lens, model)
    _, unembed = unembedding(model)
    read = trace(model, *args, names=lens.layers)
    readings = [unembed(lens(i, read[n])) for i, n in enumerate(lens.layers)]  # (B, T, C) -> (B, T, V) each
    return LogitLens(lens.layers, torch.stack(readings))  # (L + 1, B, T, V)


@torch.no_grad()
@evaluated
def lens_divergences(model: nn.Module, batches: list[Batch], lens: TunedLens | None = None) -> Tensor:
    """Each layer's mean KL (nats per token) from the model's final distribution to the lens's reading of that layer
    on `batches`, (L + 1,): the tuned lens's, or the logit lens's where `lens` is None. The last is 0."""
    if lens is not None:
        check_lens(lens, module_of(model))
    return _divergences(model, lens, _read_streams(model, batches))


def check_lens(lens: TunedLens, model: nn.Module) -> None:
    """Raise InputError unless `lens` reads `model`'s layers at its width."""
    layers, width = lens_layers(model), lens_width(model)
    if lens.layers != layers or lens.width not in (None, width):
        raise InputError(f"this tuned lens reads {len(lens.layers)} layers ({lens.layers[0]} ...) of width "
                         f"{lens.width}; the model has {len(layers)} of width {width}: train a lens for this model")


def save_tuned_lens(lens: TunedLens, directory: str | Path, *, record: dict | None = None) -> Path:
    """Write `directory` (tuned_lens.json, tuned_lens.safetensors) whole or not at all; `record` (the KL per layer,
    the training settings) goes into the JSON."""
    document = {"method": "tuned lens (Belrose et al. 2023)", "layers": lens.layers, "d_model": lens.width or 0,
                **({"trained_on": lens.trained_on} if lens.trained_on else {}), **(record or {})}
    with atomic_output(directory, directory=True, overwrite=True) as partial:
        save_tensors({name: t.detach().float() for name, t in lens.state_dict().items()}, partial / WEIGHTS_FILE)
        atomic_write(partial / CONFIG_FILE, json.dumps(document, indent=2) + "\n")
    return Path(directory)


def load_tuned_lens(directory: str | Path, model: nn.Module | None = None) -> TunedLens:
    """Read a lens `save_tuned_lens` wrote, every tensor checked against the JSON's layers and width (present, of its
    shape, finite) and, given `model`, the lens against the model and on its device, with a warning where the model's
    output layer is not the one the lens was trained with (`output_digest`). Raises CheckpointError naming the file and
    what is wrong, InputError for a lens of another model's layers or width."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory} has no {name}: a tuned lens's directory holds {CONFIG_FILE} and "
                                  f"{WEIGHTS_FILE} (attnkit inspect RUN tuned-lens writes one to OUT/tuned-lens)")
    where = directory / CONFIG_FILE
    document = read_json(where)
    layers, width = (document.get("layers"), document.get("d_model")) if isinstance(document, dict) else (None, None)
    if not (isinstance(layers, list) and len(layers) >= 1 and all(isinstance(n, str) for n in layers)
            and isinstance(width, int) and width >= 0):
        raise CheckpointError(f"{where} has no list of layers and d_model: it is not a tuned lens's record "
                              "(attnkit inspect RUN tuned-lens writes one to OUT/tuned-lens)")
    tensors = load_tensors(directory / WEIGHTS_FILE)
    trained_on = document.get("trained_on")
    lens = TunedLens(layers, width, trained_on if isinstance(trained_on, str) else None)
    expected = {name: tuple(t.shape) for name, t in lens.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if found != expected:
        wrong = sorted(set(found) ^ set(expected)) or [n for n in expected if found[n] != expected[n]]
        raise CheckpointError(f"{directory / WEIGHTS_FILE} does not hold the translators {where} describes "
                              f"({len(layers) - 1} of width {width}): {wrong[0]} is missing, extra or of another shape")
    bad = [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(f"{directory / WEIGHTS_FILE}: {bad[0]} holds NaN or infinite values; the lens is damaged")
    lens.load_state_dict(tensors)
    if model is not None:
        model = module_of(model)
        check_lens(lens, model)
        lens.to(next(model.parameters()).device)  # where the model's streams are (a CUDA run's --lens)
        digest = output_digest(model)
        if lens.trained_on and digest and digest != lens.trained_on:  # as the tuned-lens package, a warning
            log.warning("%s was trained on a model with another output layer (sha256 %s..., this one's %s...): its "
                        "readings may not hold here; train a lens for this model (attnkit inspect RUN tuned-lens)",
                        directory, lens.trained_on[:12], digest[:12])
    return lens.eval()


def output_digest(model: nn.Module) -> str | None:
    """The sha256 of `model`'s output layer's weight (as fp32): which model a lens was trained on, as the tuned-lens
    package records its unembedding's hash. None for an output layer without a plain weight, or without values (on the
    meta device)."""
    weight = getattr(getattr(module_of(model), "lm_head", None), "weight", None)
    if not isinstance(weight, Tensor) or weight.is_meta:
        return None
    return hashlib.sha256(weight.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()
