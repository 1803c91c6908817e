"""What the language models without a KV cache share (the recurrent, the convolutional and the feed-forward LMs):
a body that carries a decoding state of its own, `stack(input_ids, attention_mask=, position_ids=, cache=) ->
(hidden (B, T, C), state)`, called as a decoder's `TransformerStack` is, then the output layer. Their forward,
said once, and the padding mask they all take (`check_mask`: real tokens contiguous in each row; the recurrent
encoder-decoder checks its source and target masks with it too), and the check that a step continues the rows its
state holds (`check_state_rows`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnkit.deprecation import renamed_keywords
from attnkit.errors import InputError
from attnkit.layers.output_loss import LossPath
from attnkit.models.decoder import lm_logits_and_loss
from attnkit.models.output import ModelOutput


def init_embedding(embedding: nn.Embedding) -> None:
    """A table that is also the output layer starts U(-0.1, 0.1), as Zaremba et al. (2014) and AWD-LSTM start
    theirs: small enough for the logits. A table that only feeds the recurrence keeps torch's N(0, 1): the layer's
    weights, U(+-1/sqrt(H)), expect inputs of unit scale. At U(-0.1, 0.1) an untied gru-attn-seq2seq started with
    encoder states of rms 0.03 and flat attention, and learned Multi30k slower per step than the model without
    attention (benchmarks/results/multi30k-recurrent-probes.md)."""
    nn.init.uniform_(embedding.weight, -0.1, 0.1)


def output_projection(hidden: int, embedding_dim: int, tie_embeddings: bool) -> nn.Module:
    """H -> E before a tied output layer when the widths differ; nothing otherwise."""
    if tie_embeddings and hidden != embedding_dim:
        return nn.Linear(hidden, embedding_dim, bias=False)
    return nn.Identity()


def check_mask(mask: Tensor | None, ids: Tensor, name: str) -> Tensor | None:
    """Validate a (B, T) padding mask for ids (B, T): 1 at real tokens, each row's real tokens contiguous (padding
    on the left or the right only). Returns it as bool, or None when there is no padding (a recurrence's unpacked fast
    path). Raises InputError naming `name` for a wrong shape, a row of padding only, or padding between real tokens."""
    if mask is None:
        return None
    if mask.shape != ids.shape:
        raise InputError(
            f"{name} has shape {tuple(mask.shape)} but the ids {tuple(ids.shape)}: give one entry per token, "
            f"1 for real tokens and 0 for padding"
        )
    mask = mask.bool()
    if mask.is_meta:
        return mask
    lengths = mask.sum(dim=1)
    if not bool((lengths > 0).all()):
        raise InputError(f"{name} marks every token of some sequence as padding; each needs a real token")
    start = mask.int().argmax(dim=1)  # the first real token
    positions = torch.arange(mask.shape[1], device=mask.device)
    contiguous = (positions >= start[:, None]) & (positions < (start + lengths)[:, None])
    if not bool((contiguous == mask).all()):
        raise InputError(
            f"{name} has padding between real tokens; these models read each row's real tokens as one run, so "
            f"pad on the left or on the right only"
        )
    return None if bool(mask.all()) else mask


def step_mask(attention_mask: Tensor | None, input_ids: Tensor) -> Tensor | None:
    """A `stack`'s attention mask, checked: (B, T) over input_ids (B, T), or (B, S + T) over the tokens already read
    and these (a KV cache's convention), cut to its last T columns. Returns it as `check_mask` does."""
    length = input_ids.shape[1]
    if attention_mask is not None and attention_mask.shape[1] > length:
        attention_mask = attention_mask[:, -length:]  # (B, S + T) -> (B, T)
    return check_mask(attention_mask, input_ids, "attention_mask")


def check_state_rows(state: Any, ids: Tensor, name: str = "input_ids") -> None:
    """InputError where a decoding state (a `ConvState`, `PrefixState` or `RecurrentState`; None: nothing to check)
    already holds another number of sequences, its `rows`, than ids (B, T): a step continues the rows its state read,
    as a KV cache checks its batch. Without it the mismatch was torch's size error from inside a layer, or a step of
    one row silently broadcast over every row of a running average."""
    held = None if state is None else state.rows
    if held is not None and held != ids.shape[0]:
        raise InputError(f"the {type(state).__name__} holds {held} sequences but {name} holds {ids.shape[0]}; "
                         f"continue each with its own state, or allocate one with batch_size={ids.shape[0]}")


class StatefulLM(nn.Module):
    """A subclass sets `embedding` (V, E) and calls `output_layer` in its constructor, and defines `stack` (its
    docstring says what the mask and the state mean there)."""

    embedding: nn.Embedding
    lm_head: nn.Linear
    label_smoothing: float
    loss_path: LossPath  # without logits: how the loss is computed (the training plan's choice)

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    def output_layer(self, width: int, *, tie_embeddings: bool, label_smoothing: float) -> None:
        """Add the output layer, width -> V: the embedding table itself when tied (which then starts as
        `init_embedding` says, and `width` must be E); and the loss's settings."""
        self.lm_head = nn.Linear(width, self.vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.embedding.weight
            init_embedding(self.embedding)  # small enough for the logits
        self.label_smoothing = label_smoothing
        self.loss_path = LossPath()

    @renamed_keywords(targets="labels")
    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        cache: Any = None,
        return_logits: bool = True,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits (B, T, V).

        attention_mask, position_ids, cache: as `stack` takes them.
        labels: (B, T) next-token ids (labels[:, t] follows input_ids[:, t]); -100 where no loss is wanted.
        return_logits: with labels, False computes the loss chunk by chunk without the (B, T, V) logits.
        Raises InputError for ids outside the vocabulary or a malformed mask.
        """
        hidden, _ = self.stack(input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache)
        logits, loss = lm_logits_and_loss(self.lm_head, hidden, labels, self.label_smoothing, return_logits,
                                          self.loss_path)
        return ModelOutput(logits=logits, loss=loss, cache=cache)
