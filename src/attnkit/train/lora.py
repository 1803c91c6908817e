"""LoRA fine-tuning (Hu et al. 2021): which linear maps get adapters, freezing the rest, and folding them back.

    apply_lora(model, targets=("q_proj", "v_proj"), rank=8, alpha=16)   wraps each matching nn.Linear in a
        `LoRALinear` (attnkit.layers.lora) and freezes every other parameter: only adapters train
    merge_lora(model)                                                   replaces each wrapper by a plain nn.Linear
        with the update folded in (what inference and `convert --to-hf` use)

A target pattern names modules as the model does: the last part of a module's name (`q_proj` matches every
layer's query projection) or a glob over the whole name (`stack.blocks.0.*`). The paper adapts the query and value
projections (its Table 5: W_q and W_v together beat any one matrix at the same parameter count).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Sequence

from torch import Tensor, nn

from attnkit.checkpoint import check_state_matches
from attnkit.errors import ConfigError
from attnkit.layers.lora import LoRALinear, adapter_tensors
from attnkit.models import count_parameters

log = logging.getLogger(__name__)

DEFAULT_TARGETS = ("q_proj", "v_proj")


def linear_names(model: nn.Module) -> list[str]:
    """The names of the model's nn.Linear modules (the ones LoRA can adapt)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def lora_targets(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """The linear modules that `patterns` select, in model order.

    Raises ConfigError for a pattern that selects nothing, listing the linear modules there are.
    """
    names = linear_names(model)
    if not patterns:
        raise ConfigError("lora_targets is empty; name the linear modules to adapt, e.g. q_proj,v_proj")
    chosen: set[str] = set()
    for pattern in patterns:
        hits = [n for n in names if n.rsplit(".", 1)[-1] == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            short = sorted({n.rsplit(".", 1)[-1] for n in names})
            raise ConfigError(
                f"lora_targets: {pattern!r} matches no linear module of this model; its linear modules are named "
                f"{', '.join(short)} (or give a glob over full names such as {names[0] if names else 'stack.*'})"
            )
        chosen.update(hits)
    return [n for n in names if n in chosen]


def tied_modules(model: nn.Module) -> dict[str, str]:
    """{module name: the module it shares its weight with} for every module whose weight is another's (an output
    layer tied to the token embedding)."""
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name.rpartition(".")[0])
    tied: dict[str, str] = {}
    for modules in owners.values():
        for module in modules[1:]:
            tied[module] = modules[0]
    return tied


def apply_lora(
    model: nn.Module, *, targets: Sequence[str] = DEFAULT_TARGETS, rank: int, alpha: float, dropout: float = 0.0
) -> list[str]:
    """Freeze every parameter of `model`, then wrap the selected linear modules in trainable LoRA adapters
    (in place). Returns the names of the adapted modules. Raises ConfigError as `lora_targets` does, and for a
    rank below 1."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"lora_rank={rank!r} must be a positive integer (the paper uses 1 to 64; 8 is usual)")
    names = lora_targets(model, targets)
    tied = tied_modules(model)
    for name in names:
        if name in tied:
            free = sorted({n.rsplit(".", 1)[-1] for n in linear_names(model) if n not in tied})
            fix = (f"leave {name.rsplit('.', 1)[-1]} out of --lora-targets (this model's other linear modules: "
                   f"{', '.join(free)})" if free else "this model has no other linear module for an adapter, so "
                   "fine-tune it in full (leave out --lora-rank)")
            raise ConfigError(
                f"lora_targets: {name} shares its weight with {tied[name]} (tied embeddings): its output reads that "
                f"weight directly, so an adapter there would never train; {fix}, or train a model without tied "
                "embeddings"
            )
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, LoRALinear(getattr(owner, child), rank=rank, alpha=alpha, dropout=dropout))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = count_parameters(model)
    log.info("LoRA rank %d on %d modules (%s): %s of %s parameters train (%.2f%%)", rank, len(names),
             ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names})), f"{trainable:,}", f"{total:,}",
             100 * trainable / total)
    return names


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRA wrapper by the plain nn.Linear it computes (in place); returns `model`."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.merged())
    return model


def load_adapters(model: nn.Module, tensors: dict[str, Tensor], *, source: str) -> None:
    """Copy saved adapters into a model already wrapped by `apply_lora`, checking names and shapes exactly."""
    expected = adapter_tensors(model)
    check_state_matches(expected, tensors, source)
    for name, target in expected.items():
        target.data.copy_(tensors[name])
