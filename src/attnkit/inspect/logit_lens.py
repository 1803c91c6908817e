"""The logit lens (nostalgebraist 2020): read each layer's residual stream through the model's own final norm and
output layer, as if the model stopped there, to see where its answer forms.

    stream after embeddings, after block 1, ..., after block L  -> final norm? -> (MLM transform?) -> lm_head -> V

The last row is the model's own logits. For an encoder-decoder the stream is the decoder's; an encoder's only when
it predicts tokens (a masked LM). Rank 0 means the layer already puts the final answer first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.points import evaluated, hook_points, module_of
from attnkit.inspect.tracing import trace
from attnkit.models.stack import TransformerStack


@dataclass(frozen=True)
class LogitLens:
    """layers[i] names the stream read; logits (L + 1, B, T, V); answer (B, T): the model's final argmax."""

    layers: list[str]
    logits: Tensor

    @property
    def answer(self) -> Tensor:
        return self.logits[-1].argmax(-1)  # (B, T)

    def ranks(self) -> Tensor:
        """Each layer's rank of the final answer: (L + 1, B, T), 0 = first."""
        chosen = self.logits.gather(-1, self.answer[None, ..., None].expand(len(self.layers), -1, -1, 1))
        return (self.logits > chosen).sum(-1)

    def probabilities(self) -> Tensor:
        """Each layer's probability of the final answer: (L + 1, B, T)."""
        probs = self.logits.float().softmax(-1)
        return probs.gather(-1, self.answer[None, ..., None].expand(len(self.layers), -1, -1, 1)).squeeze(-1)

    def top(self, k: int = 5, row: int = 0) -> Tensor:
        """Each layer's top-k token ids at each position of one row: (L + 1, T, k)."""
        return self.logits[:, row].topk(k, dim=-1).indices


def _stack(model: nn.Module) -> TransformerStack | None:
    """The stack whose stream becomes tokens: an encoder-decoder's decoder, else the model's one stack."""
    return getattr(model, "decoder", None) or getattr(model, "stack", None)


def unembedding(model: nn.Module) -> tuple[str, Callable[[Tensor], Tensor]]:
    """The prefix of the stack whose stream becomes tokens, and the map from that stream (…, C) to logits (…, V).
    Raises InputError for a model without an output layer over a Transformer stack."""
    stack = _stack(model)
    lm_head = getattr(model, "lm_head", None)
    if not isinstance(stack, TransformerStack) or lm_head is None:
        raise InputError(f"the logit lens reads a Transformer stack through its output layer; {type(model).__name__} "
                         "has none (use a decoder LM, an encoder-decoder or a masked LM)")
    transform = getattr(model, "transform", None)

    def unembed(hidden: Tensor) -> Tensor:
        if stack.final_norm is not None:
            hidden = stack.final_norm(hidden)
        if transform is not None:
            hidden = transform(hidden)
        return lm_head(hidden)  # (…, V)

    return ("decoder." if stack is getattr(model, "decoder", None) else ""), unembed


@torch.no_grad()
@evaluated
def logit_lens(model: nn.Module, *args: Tensor) -> LogitLens:
    """Run `model(*args)` and read its stream after the embeddings and after every block through `unembedding`."""
    model = module_of(model)  # a pipeline from attnkit.load: its model
    _, unembed = unembedding(model)
    names = lens_layers(model)
    read = trace(model, *args, names=names)
    return LogitLens(names, torch.stack([unembed(read[n]) for n in names]))


def lens_layers(model: nn.Module) -> list[str]:
    """The streams a lens reads: after the embeddings (`blocks.0.resid_pre`) and after each block (`.resid_post`) of
    the stack `unembedding` reads. Raises InputError as `unembedding` does."""
    model = module_of(model)
    prefix, _ = unembedding(model)
    n_blocks = sum(1 for n in hook_points(model) if n.startswith(f"{prefix}blocks.") and n.endswith(".resid_post"))
    return [f"{prefix}blocks.0.resid_pre", *(f"{prefix}blocks.{i}.resid_post" for i in range(n_blocks))]


def lens_width(model: nn.Module) -> int:
    """The width C of the stream `unembedding` reads. Raises InputError as `unembedding` does."""
    model = module_of(model)
    unembedding(model)  # a model with no stack to read: InputError naming what it reads
    return _stack(model).embeddings.token.embedding_dim
