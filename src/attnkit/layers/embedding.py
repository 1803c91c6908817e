"""The input end of the model: token embedding, optional sqrt(C) scaling, absolute positions, dropout.

`check_token_ids` is what the models call at their edge, with `Embeddings.check_positions`, which refuses
positions beyond what the position scheme represents (a learned table has nothing beyond its last row).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.layers.positions import PositionScheme

_INPUTS_CHECKED: ContextVar[bool] = ContextVar("inputs_checked", default=False)


@contextmanager
def inputs_checked() -> Iterator[None]:
    """Within it, models read no input values to check them: for a caller whose inputs are checked already, as the
    trainer's batches are (drawn by the task from data the run's tokenizer made, its vocabulary held to the model's
    when the run was set up). A check reads a value from the device: on a GPU each waits for the step before."""
    token = _INPUTS_CHECKED.set(True)
    try:
        yield
    finally:
        _INPUTS_CHECKED.reset(token)


def has_values(tensor: Tensor) -> bool:
    """Whether a check may read `tensor`'s values: not for shape-only tensors (parameter counting, dry runs), graphs
    being exported (ONNX) or compiled (a compiled training step or decoding step: reading a value there would split
    the graph and, on a GPU, wait for the device; their inputs are checked before, eagerly or by their task), nor
    inside `inputs_checked`."""
    return not (tensor.is_meta or torch.compiler.is_exporting() or torch.compiler.is_compiling()
                or _INPUTS_CHECKED.get())


def check_token_ids(ids: Tensor, vocab_size: int, *, name: str = "input_ids") -> None:
    """Raise InputError unless ids is a (B, T) integer tensor with values in [0, vocab_size)."""
    if not isinstance(ids, Tensor):
        raise InputError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InputError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}; use ids.long()")
    if ids.dim() != 2:
        raise InputError(f"{name} must have shape (batch, length), got {tuple(ids.shape)}; add a batch dimension")
    if ids.shape[1] == 0:
        raise InputError(f"{name} is empty (length 0); give at least one token")
    if ids.shape[0] == 0:
        raise InputError(f"{name} holds no sequences (batch size 0); give at least one")
    if not has_values(ids):
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(
            f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size}); check that the tokenizer "
            f"matches the model (vocab_size={vocab_size})"
        )


class Embeddings(nn.Module):
    """ids (B, T) and position_ids (B, T) -> (B, T, C). `token` is the table an output layer may tie to.

        token(ids) * scale (+ token_types(token_type_ids)) (+ positions) -> norm? -> dropout

    Token types (BERT's segments A/B) and the norm after the sum (BERT, BART) are optional parts.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        *,
        positions: PositionScheme | None = None,
        scale: bool = False,
        dropout: float = 0.0,
        type_vocab_size: int = 0,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.token_types = nn.Embedding(type_vocab_size, d_model) if type_vocab_size else None
        self.positions = positions  # an absolute scheme: its `embed` is added to the token embeddings
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.norm = norm
        self.dropout = nn.Dropout(dropout)

    @property
    def vocab_size(self) -> int:
        return self.token.num_embeddings

    @property
    def max_positions(self) -> int | None:
        """The positions the scheme represents (a learned table's length); None: any."""
        return self.positions.max_len if self.positions is not None else None

    def check_positions(self, position_ids: Tensor, *, last: int | None = None) -> None:
        """Raise InputError for a position beyond a learned table (other positions have no end). `last`: the highest
        position where the caller knows it (read already, or built), saving a read of the tensor from the device."""
        if self.max_positions is None or not has_values(position_ids):
            return
        last = int(position_ids.max()) if last is None else last
        if last >= self.max_positions:
            raise InputError(
                f"position {last} is beyond max_seq_len={self.max_positions} of the learned position table; "
                f"shorten the input to {self.max_positions} tokens, or use a model with sinusoidal, relative or "
                f"rotary positions"
            )

    def forward(self, ids: Tensor, position_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """token_type_ids: (B, T) segment ids; all 0 when omitted (models with token-type embeddings only)."""
        x = self.token(ids)  # (B, T, C)
        if self.scale != 1:
            x = x * self.scale
        if self.token_types is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            check_token_ids(token_type_ids, self.token_types.num_embeddings, name="token_type_ids")
            if token_type_ids.shape != ids.shape:
                raise InputError(
                    f"token_type_ids has shape {tuple(token_type_ids.shape)} but input_ids {tuple(ids.shape)}; "
                    f"give one segment id per token"
                )
            x = x + self.token_types(token_type_ids)
        elif token_type_ids is not None:
            raise InputError(
                "token_type_ids were given but this model has no token-type embeddings (type_vocab_size=0); drop them"
            )
        if self.positions is not None:
            x = x + self.positions.embed(position_ids).to(x.dtype)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)
