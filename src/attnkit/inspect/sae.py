"""Sparse autoencoders on a model's activations (Bricken et al. 2023, "Towards Monosemanticity"; Gao et al. 2024,
"Scaling and Evaluating Sparse Autoencoders"): an overcomplete dictionary whose features, few active at a time,
rebuild an activation, so that directions the model packs into fewer dimensions than it has features (superposition,
Elhage et al. 2022) come apart.

    encode   f = act((x - b_dec) W_enc + b_enc)       x (N, C) -> f (N, F), F > C features
    decode   x^ = f W_dec + b_dec                     W_dec's rows: the features' directions, kept at unit norm
    relu     act = ReLU, loss = ||x - x^||^2 + l1 * sum|f|           (Bricken et al. 2023)
    topk     act = ReLU of the k largest, loss = ||x - x^||^2 (+ AuxK: dead features rebuild what is left, Gao et al.)

The metrics are Anthropic's and Gao et al.'s: L0 (features active per activation), the share of dead features
(never active on the evaluation activations), the normalised MSE ||x - x^||^2 / ||x - mean x||^2 (explained variance:
1 minus it), and the model's own loss with the reconstruction spliced in at the point, beside its clean loss and its
loss with the point mean-ablated ("loss recovered": 1 = the SAE loses nothing, 0 = no better than the mean) and
zero-ablated (the baseline of SAELens's `ce_loss_score`, `loss_recovered_zero`).

An SAE is saved as SAELens saves one: a directory with `cfg.json` (d_in, d_sae, architecture "standard" or "topk",
k, apply_b_dec_to_input, normalize_activations, meta.hook_name ...) and `sae_weights.safetensors` (W_enc (C, F),
b_enc (F,), W_dec (F, C), b_dec (C,)), so `sae_lens.SAE.load_from_disk` reads what attnkit writes and `load_sae`
reads SAELens's standard and TopK SAEs; attnkit's own training record sits under the config's "attnkit" key, and
the features' top contexts on the evaluation texts in `features.json` beside them (`save_features`, `load_features`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.checkpoint import load_tensors, read_json, save_tensors
from attnkit.errors import CheckpointError, InputError
from attnkit.inspect.edits import mean_ablate, zero_ablate
from attnkit.inspect.inputs import Batch, check_batch, token_losses
from attnkit.inspect.points import HookPoint, evaluated, module_of, resolve
from attnkit.models.modes import evaluating
from attnkit.outputs import atomic_output, atomic_write

log = logging.getLogger(__name__)
Architecture = Literal["standard", "topk"]  # SAELens's names: "standard" is ReLU with an L1 penalty
CONFIG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"  # SAELens's file names
FEATURES_FILE = "features.json"  # attnkit's own: each live feature's top contexts (SAELens reads no such file)
SHAPES = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}


@dataclass(frozen=True)
class SAEConfig:
    """An SAE's shape and training. `hook_name`: the hook point it reads (`blocks.1.resid_post`)."""

    d_in: int
    d_sae: int
    architecture: Architecture = "standard"
    k: int | None = None  # topk: features kept per activation
    l1_coefficient: float = 0.3  # standard: weight of the L1 penalty on the features (scale-free: `train_sae`)
    hook_name: str = ""
    model_name: str = ""

    def __post_init__(self) -> None:
        if self.d_in < 1 or self.d_sae < 1:
            raise InputError(f"an SAE needs d_in >= 1 and d_sae >= 1 features; got {self.d_in} and {self.d_sae}")
        if self.architecture not in ("standard", "topk"):
            raise InputError(f"unknown SAE architecture {self.architecture!r}; use standard (ReLU + L1) or topk")
        if self.architecture == "topk" and not (self.k and 1 <= self.k <= self.d_sae):
            raise InputError(f"a TopK SAE keeps k of its {self.d_sae} features: give k between 1 and {self.d_sae}")


class SparseAutoencoder(nn.Module):
    """The SAE of the module docstring; parameters named as SAELens names them."""

    def __init__(self, config: SAEConfig, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        directions = F.normalize(torch.randn(config.d_sae, config.d_in, generator=generator), dim=-1)  # (F, C)
        self.W_dec = nn.Parameter(directions)
        self.W_enc = nn.Parameter(directions.T.clone())  # the decoder's transpose (Gao et al. 2024)
        self.b_enc = nn.Parameter(torch.zeros(config.d_sae))
        self.b_dec = nn.Parameter(torch.zeros(config.d_in))
        self.apply_b_dec_to_input = True

    def pre_activation(self, x: Tensor) -> Tensor:
        """(…, C) -> (…, F), before the activation."""
        centred = x - self.b_dec if self.apply_b_dec_to_input else x
        return centred @ self.W_enc + self.b_enc

    def activate(self, pre: Tensor) -> Tensor:
        if self.config.architecture == "standard":
            return F.relu(pre)
        top = pre.topk(self.config.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, F.relu(top.values))  # the k largest, the rest 0

    def encode(self, x: Tensor) -> Tensor:
        """(…, C) -> the features (…, F)."""
        return self.activate(self.pre_activation(x))

    def decode(self, features: Tensor) -> Tensor:
        """(…, F) -> (…, C)."""
        return features @ self.W_dec + self.b_dec

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        """Unit-norm decoder rows, so that the L1 penalty cannot be dodged by shrinking f and growing W_dec."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-8))


@dataclass(frozen=True)
class SAEMetrics:
    """What one SAE does on a set of activations (module docstring); the losses are None until `spliced_loss`."""

    l0: float
    dead_share: float
    normalised_mse: float
    explained_variance: float
    clean_loss: float | None = None
    spliced_loss: float | None = None
    ablated_loss: float | None = None  # the point mean-ablated
    zero_ablated_loss: float | None = None  # the point set to 0, as SAELens's evaluation ablates it

    @property
    def loss_recovered(self) -> float | None:
        """(ablated - spliced) / (ablated - clean), against the mean ablation."""
        return self.recovered(self.ablated_loss)

    @property
    def loss_recovered_zero(self) -> float | None:
        """The same against the zero ablation: SAELens's `ce_loss_score`."""
        return self.recovered(self.zero_ablated_loss)

    def recovered(self, ablated: float | None) -> float | None:
        """The share of the loss the ablation costs that the SAE gives back; None before `spliced_loss`, or when the
        ablation costs nothing."""
        if self.spliced_loss is None or ablated is None or self.clean_loss is None:
            return None
        gap = ablated - self.clean_loss
        return (ablated - self.spliced_loss) / gap if abs(gap) > 1e-12 else None

    def row(self) -> dict:
        scores = {"loss_recovered": self.loss_recovered, "loss_recovered_zero": self.loss_recovered_zero}
        return {k: (None if v is None else round(v, 4)) for k, v in {**asdict(self), **scores}.items()}


def train_sae(config: SAEConfig, batches: Callable[[], Iterable[Tensor]], *, steps: int, lr: float = 1e-3,
              seed: int = 0, log_every: int = 0) -> tuple[SparseAutoencoder, list[float]]:
    """Train an SAE for `steps` steps with Adam on the activation batches (N, C) that `batches()` yields, started
    again when it runs out (a stream: activations are never all in memory). b_dec starts at the first batch's mean.
    The loss is scale-free: the squared error over the first batch's variance sum ||x - mean||^2 / N (so its first
    term is the normalised MSE) plus l1 times the features' L1 over that variance's square root (features are
    lengths along unit directions). Returns the SAE and each step's loss. Raises InputError for fewer than 1 step."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps={steps!r}: an SAE trains for 1 step or more (attnkit inspect RUN sae --steps N)")
    stream, losses = _cycle(batches), []
    first = next(stream).float()  # (N, C): where the SAE lives, its b_dec's start and the loss's scale
    sae = SparseAutoencoder(config, generator=torch.Generator().manual_seed(seed)).to(first.device)
    optimizer = torch.optim.Adam(sae.parameters(), lr=lr)
    fired = torch.zeros(config.d_sae, dtype=torch.long, device=first.device)  # steps since each feature last fired
    with torch.no_grad():
        sae.b_dec.copy_(first.mean(0))
        variance = float((first - first.mean(0)).pow(2).sum(-1).mean().clamp_min(1e-12))
    for step in range(steps):
        x = first if step == 0 else next(stream).float()  # (N, C)
        pre = sae.pre_activation(x)  # (N, F)
        features = sae.activate(pre)
        rebuilt = sae.decode(features)
        loss = (rebuilt - x).pow(2).sum(-1).mean() / variance
        if config.architecture == "standard":
            loss = loss + config.l1_coefficient * features.abs().sum(-1).mean() / math.sqrt(variance)
        else:
            fired = torch.where((features > 0).any(0), 0, fired + 1)
            loss = loss + AUX_K_WEIGHT * _aux_k(sae, pre, x - rebuilt.detach(), fired > DEAD_AFTER) / variance
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        sae.normalise_decoder()
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            log.info("sae step %d/%d: loss %.4f", step + 1, steps, losses[-1])
    return sae.eval(), losses


DEAD_AFTER = 200  # AuxK: a feature silent for this many steps counts as dead
AUX_K_WEIGHT = 1 / 32  # AuxK's weight beside the reconstruction loss (Gao et al. 2024's alpha)


def _aux_k(sae: SparseAutoencoder, pre: Tensor, residual: Tensor, dead: Tensor) -> Tensor:
    """Gao et al. 2024's auxiliary loss: the dead features' top k_aux (half the width) rebuild what the live ones
    left, so that they get a gradient again."""
    if not bool(dead.any()):
        return pre.new_zeros(())
    k_aux = min(int(dead.sum()), max(1, sae.config.d_in // 2))
    candidates = pre.masked_fill(~dead, float("-inf")).topk(k_aux, dim=-1)  # (N, k_aux)
    aux = torch.zeros_like(pre).scatter(-1, candidates.indices, F.relu(candidates.values))
    return (aux @ sae.W_dec - residual).pow(2).sum(-1).mean()


def _cycle(batches: Callable[[], Iterable[Tensor]]) -> Iterator[Tensor]:
    while True:
        empty = True
        for batch in batches():
            empty = False
            yield batch
        if empty:
            raise InputError("the activations to train the SAE on are empty; give texts with at least one token")


@torch.no_grad()
def evaluate(sae: SparseAutoencoder, activations: Iterable[Tensor]) -> SAEMetrics:
    """L0, dead share, normalised MSE and explained variance over activation batches (N, C)."""
    device = sae.b_dec.device
    active, fired, error, count = 0.0, torch.zeros(sae.config.d_sae, dtype=torch.bool, device=device), 0.0, 0
    total, total_sq = torch.zeros(sae.config.d_in, dtype=torch.float64, device=device), 0.0
    for x in activations:
        x = x.float()
        features = sae.encode(x)
        active += float((features > 0).sum())
        fired |= (features > 0).any(0)
        error += float((sae.decode(features) - x).double().pow(2).sum())
        total += x.double().sum(0)
        total_sq += float(x.double().pow(2).sum())
        count += x.shape[0]
    if not count:
        raise InputError("no activations to evaluate the SAE on")
    variance = total_sq - float(total.pow(2).sum()) / count  # sum ||x - mean||^2
    nmse = error / variance if variance > 0 else math.inf
    return SAEMetrics(active / count, 1 - float(fired.float().mean()), nmse, 1 - nmse)


def splice(sae: SparseAutoencoder):
    """An edit for `hooked`/`trace` that replaces the point's activation (…, C) by the SAE's reconstruction."""
    def edit(activation: Tensor, point: HookPoint) -> Tensor:
        if activation.shape[-1] != sae.config.d_in:
            raise InputError(f"{point.name} has width {activation.shape[-1]}, the SAE reads {sae.config.d_in}")
        return sae(activation.float()).to(activation.dtype)

    return edit


@torch.no_grad()
@evaluated
def spliced_loss(model: nn.Module, sae: SparseAutoencoder, batches: list[Batch], metrics: SAEMetrics,
                 reference: Tensor) -> SAEMetrics:
    """`metrics` with the model's mean loss on the batches' targets clean, with the SAE spliced in at its point,
    with the point mean-ablated over `reference` (the point's activations, (N, C)), and with it set to 0. Every
    target counts once, as SAELens's `get_downstream_reconstruction_metrics` averages its per-token losses."""
    model = module_of(model)
    point = sae.config.hook_name
    mean = mean_ablate(reference.reshape(1, -1, reference.shape[-1]))

    def loss(edits: dict) -> float:
        values = [token_losses(b.logits(b.run(model, edits=edits).output), b.labels) for b in batches]
        return float(torch.cat([v.flatten() for v in values]).nanmean())

    for batch in batches:
        check_batch(batch, "a batch")
    if any(b.labels is None for b in batches):
        raise InputError("the spliced loss scores the model's predictions: give batches with targets")
    return SAEMetrics(metrics.l0, metrics.dead_share, metrics.normalised_mse, metrics.explained_variance,
                      loss({}), loss({point: splice(sae)}), loss({point: mean}), loss({point: zero_ablate()}))


def save_sae(sae: SparseAutoencoder, directory: str | Path, *, record: dict | None = None) -> Path:
    """Write `directory` (cfg.json, sae_weights.safetensors) in SAELens's layout, whole or not at all; `record` (the
    metrics, the training settings) goes under the config's "attnkit" key."""
    config = sae.config
    names = {"model_name": config.model_name or None, "hook_name": config.hook_name or None}
    # SAELens 6 reads a config without a version as an older one: it takes the names from the top level and fills in
    # the rest, so they are written there as well as under "meta", with the activation as older versions name it
    document = {"d_in": config.d_in, "d_sae": config.d_sae, "dtype": "float32", "device": "cpu",
                "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
                "reshape_activations": "none", "architecture": config.architecture, **names,
                "hook_head_index": None, "activation_fn": "relu" if config.k is None else "topk", "meta": names,
                "attnkit": {"l1_coefficient": config.l1_coefficient, **(record or {})}}
    if config.k is not None:
        document.update(k=config.k, activation_fn_kwargs={"k": config.k})
    with atomic_output(directory, directory=True, overwrite=True) as partial:
        save_tensors({name: getattr(sae, name).detach().float() for name in SHAPES}, partial / WEIGHTS_FILE)
        atomic_write(partial / CONFIG_FILE, json.dumps(document, indent=2) + "\n")
    return Path(directory)


def load_sae(directory: str | Path) -> SparseAutoencoder:
    """Read an SAE that `save_sae` (or SAELens) wrote; every field and tensor is checked first. Raises
    CheckpointError naming the file and what is wrong."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory} has no {name}: an SAE's directory holds {CONFIG_FILE} and "
                                  f"{WEIGHTS_FILE} (attnkit inspect RUN sae writes one to OUT/sae)")
    document = read_json(directory / CONFIG_FILE)
    where = directory / CONFIG_FILE
    if not isinstance(document, dict) or not all(isinstance(document.get(k), int) for k in ("d_in", "d_sae")):
        raise CheckpointError(f"{where} has no integer d_in and d_sae: it is not an SAE's config")
    architecture = document.get("architecture", "standard")
    if architecture not in ("standard", "topk"):
        raise CheckpointError(f"{where} is a {architecture!r} SAE; attnkit reads standard (ReLU) and topk SAEs")
    if document.get("normalize_activations", "none") != "none" or document.get("reshape_activations",
                                                                                "none") != "none":
        raise CheckpointError(f"{where} normalises or reshapes its input before encoding; attnkit reads SAEs that "
                              "take the activation as it is (normalize_activations and reshape_activations 'none')")
    meta = {**{k: document.get(k) for k in ("model_name", "hook_name")}, **(document.get("meta") or {})}
    record = document.get("attnkit") or {}
    try:
        config = SAEConfig(document["d_in"], document["d_sae"], architecture, document.get("k"),
                           float(record.get("l1_coefficient", 0.0)), meta.get("hook_name") or "",
                           meta.get("model_name") or "")
    except InputError as err:
        raise CheckpointError(f"{where}: {err}") from None
    tensors = load_tensors(directory / WEIGHTS_FILE)
    sizes = {"d_in": config.d_in, "d_sae": config.d_sae}
    for name, axes in SHAPES.items():
        expected = tuple(sizes[a] for a in axes)
        if name not in tensors or tuple(tensors[name].shape) != expected:
            found = tuple(tensors[name].shape) if name in tensors else "missing"
            raise CheckpointError(f"{directory / WEIGHTS_FILE}: {name} should be {expected} by {CONFIG_FILE}, "
                                  f"found {found}")
    sae = SparseAutoencoder(config)
    with torch.no_grad():
        for name in SHAPES:
            getattr(sae, name).copy_(tensors[name].float())
    sae.apply_b_dec_to_input = bool(document.get("apply_b_dec_to_input", True))
    return sae.eval()


def point_activations(model: nn.Module, batches: Iterable[Batch], point: str) -> Iterator[Tensor]:
    """The activations at `point` on each batch, (B, T, C) -> (B * T, C), one batch at a time. Raises InputError for
    a point that is not one vector per position (heads' points: read the sublayer's `.out` instead)."""
    model = module_of(model)
    if not resolve(model, point)[0].editable:  # an unknown name: InputError listing the model's points
        raise InputError(f"an SAE is spliced in where it reads, and {point} is read only (the model does not take it "
                         "back): use a resid_pre / resid_post / attn.out / mlp.out point")
    with evaluating(model):  # dropout off while read, as spliced_loss reads it; its modes given back after
        for batch in batches:
            check_batch(batch, "a batch")
            activation = batch.run(model, names=[point])[point]
            if activation.dim() != 3:
                raise InputError(f"an SAE reads one vector per position, (B, T, C); {point} is "
                                 f"{tuple(activation.shape)}: use a resid_pre / resid_post / attn.out / mlp.out point")
            yield activation.flatten(0, 1)


@dataclass(frozen=True)
class Feature:
    """One feature on a set of activations: how often it fires, and its top activations with their contexts."""

    index: int
    frequency: float
    top: list[tuple[float, str]]  # (activation, context), largest first


@torch.no_grad()
def features_in_context(sae: SparseAutoencoder, activations: Tensor, contexts: list[str], *, k: int = 3
                        ) -> list[Feature]:
    """Every feature that fires on `activations` (N, C), most frequent first, with its k top-activating `contexts`
    (one per activation: the text up to that token)."""
    features = sae.encode(activations.float())  # (N, F)
    frequency = (features > 0).float().mean(0)  # (F,)
    top = features.topk(min(k, features.shape[0]), dim=0)  # (k, F)
    found = []
    for index in frequency.argsort(descending=True).tolist():
        if frequency[index] == 0:
            break
        pairs = zip(top.values[:, index].tolist(), top.indices[:, index].tolist(), strict=True)
        found.append(Feature(index, float(frequency[index]), [(v, contexts[i]) for v, i in pairs if v > 0]))
    return found


def save_features(features: list[Feature], directory: str | Path) -> Path:
    """Write the features (`features_in_context`) to `directory`/features.json, whole or not at all."""
    path = Path(directory) / FEATURES_FILE
    document = [{"feature": f.index, "frequency": f.frequency, "top": [[v, c] for v, c in f.top]} for f in features]
    atomic_write(path, json.dumps(document) + "\n")
    return path


def load_features(directory: str | Path, d_sae: int) -> list[Feature]:
    """The features `save_features` wrote for an SAE of `d_sae` features, each entry checked; [] where the file is
    absent (an SAE SAELens wrote). Raises CheckpointError naming the file and the entry that is wrong."""
    path = Path(directory) / FEATURES_FILE
    if not path.is_file():
        return []
    document = read_json(path)
    if not isinstance(document, list):
        raise CheckpointError(f"{path} is not a list of features: write it again with attnkit inspect RUN sae")
    found = []
    for entry in document:
        try:
            index, frequency = entry["feature"], float(entry["frequency"])
            top = [(float(v), c) for v, c in entry["top"]]
            valid = isinstance(index, int) and 0 <= index < d_sae and all(isinstance(c, str) for _, c in top)
        except (KeyError, TypeError, ValueError):
            valid = False
        if not valid:
            raise CheckpointError(f"{path}: {str(entry)[:80]} is not a feature of this SAE ({{'feature': 0..{d_sae - 1}"
                                  ", 'frequency', 'top': [[activation, context], ...]}): write it again with "
                                  "attnkit inspect RUN sae")
        found.append(Feature(index, frequency, top))
    return found
