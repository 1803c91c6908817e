"""Attention from a recurrent decoder to its encoder's states (lecture: "Seq2Seq with Attention").

    scores   e_tj = score(h_t, hbar_j)          dot: h_t . hbar_j                    (Luong et al. 2015)
                                                general: h_t^T W hbar_j              (Luong et al. 2015)
                                                additive: v^T tanh(W h_t + U hbar_j) (Bahdanau et al. 2015)
    weights  a_t = softmax_j(e_tj)              over real source positions only; exactly 0 at padding
    context  c_t = sum_j a_tj hbar_j            (B, M): one vector per decoding step, not one per sentence

The score functions are the Transformer's own (`layers/attention.py`), with one head: the query is the decoder's
state (width H), the keys and values the encoder's states (width M, 2 x the encoder's width when bidirectional).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from attnkit.layers.attention import AdditiveScore, BilinearScore, DotScore

AttentionKind = Literal["none", "bahdanau", "luong-dot", "luong-general"]


class SourceAttention(nn.Module):
    """Decoder states (B, T, H) attend to encoder states (B, S, M) -> contexts (B, T, M), weights (B, 1, T, S)."""

    def __init__(self, kind: AttentionKind, *, query_dim: int, memory_dim: int, additive_dim: int | None = None):
        super().__init__()
        if kind == "luong-dot":
            if query_dim != memory_dim:
                raise ValueError(
                    f"luong-dot needs queries and keys of one width, got {query_dim} and {memory_dim}; use "
                    f"luong-general or bahdanau, or make the encoder's output as wide as the decoder"
                )
            self.score: nn.Module = DotScore(1.0)
        elif kind == "luong-general":
            self.score = BilinearScore(query_dim, key_dim=memory_dim)
        elif kind == "bahdanau":
            self.score = AdditiveScore(query_dim, additive_dim or query_dim, key_dim=memory_dim)
        else:
            raise ValueError(f"unknown attention {kind!r}; use bahdanau, luong-dot or luong-general")

    def keys(self, memory: Tensor) -> Tensor:
        """The scores' side that depends on the source alone, (B, S, M) -> (B, 1, S, K): U hbar (additive), W hbar
        (general), hbar (dot). Computed once per source, not at every decoding step."""
        return self.score.project_keys(memory.unsqueeze(1))  # one head

    def forward(
        self, query: Tensor, memory: Tensor, src_mask: Tensor | None, keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """query (B, T, H), memory (B, S, M), src_mask (B, S) bool (True at real tokens) or None; keys: `keys(memory)`
        when already computed."""
        keys = self.keys(memory) if keys is None else keys
        scores = self.score.from_keys(query.unsqueeze(1), keys)  # (B, 1, T, S)
        if src_mask is not None:
            scores = scores.masked_fill(~src_mask[:, None, None, :], float("-inf"))  # every row keeps a real key
        weights = torch.softmax(scores.float(), dim=-1).to(memory.dtype)  # (B, 1, T, S)
        context = torch.matmul(weights, memory.unsqueeze(1)).squeeze(1)  # (B, 1, T, S) @ (B, 1, S, M) -> (B, T, M)
        return context, weights
