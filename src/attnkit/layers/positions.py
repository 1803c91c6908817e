"""Position information: the Transformer's attention is order-blind without it (lecture: "Positional Encoding").

Every scheme is one module behind one interface, `PositionScheme`, whose hooks the model calls at fixed points;
a scheme overrides the hooks where it acts and inherits "do nothing" for the others:

    hook                                              where it is called          schemes
    embed(position_ids)             -> (B, T, C)      added to token embeddings   sinusoidal, learned
    prepare(position_ids)           -> what rotate    once per forward pass       rope
                                       needs          (for every layer)
    rotate(q, k, prepared)          -> q, k           after the q/k projections   rope
    score_bias(q, mask, S, score,   -> bias           added to the scores         relative (Shaw), alibi
               key_positions=)
    flex_score_mod(mask)            -> score_mod      the same, for FlexAttention alibi
    value_term(weights, mask, S,    -> term           added to the output         relative (Shaw)
               key_positions=)

Absolute schemes act at the embeddings (`Embeddings.positions`); relative ones (their scores depend on i - j)
act inside each self-attention (`Attention.relative`). Every scheme reads where the queries sit from the forward
pass's `AttentionMask` (`mask.query_positions`, (T,): their absolute positions, with a KV cache the cache positions
they were written to), the same object the masks come from, so relative terms stay right with a cache. Keys sit at
0 .. S - 1 unless the attention says otherwise (`key_positions`: a sliding window's ring buffer holds them out of
order; `mask.key_positions` reads either). A scheme initialises its own parameters (`init_weights`) and says whether
they take weight decay (`weight_decay`); `make_positions` builds one by name.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.layers.masks import AttentionMask


class PositionScheme(nn.Module):
    """The position slot: every hook leaves its input unchanged (no positions: a bag of tokens)."""

    embeds: ClassVar[bool] = False  # whether `embed` adds anything: the builder hands it to the embeddings
    rotates: ClassVar[bool] = False  # whether `rotate` acts
    biases: ClassVar[bool] = False  # whether `score_bias` (and `value_term`) act: they read the queries' positions
    needs_weights: ClassVar[bool] = False  # whether `value_term` reads the weights (rules out fused kernels)
    flex: ClassVar[bool] = False  # whether `flex_score_mod` expresses `score_bias` for FlexAttention
    weight_decay: ClassVar[bool] = False  # whether its parameters take weight decay (position tables: no)
    title: ClassVar[str] = "the position scheme"  # what plans call it (`--explain`)
    max_len: int | None = None  # positions it can represent (a learned table's rows); None: any

    def embed(self, position_ids: Tensor) -> Tensor | None:
        """position_ids (B, T) -> (B, T, C) to add to the token embeddings, or None."""
        return None

    def prepare(self, position_ids: Tensor) -> Tensor | tuple[Tensor, ...]:
        """What `rotate` needs from the positions (B or 1, T), computed once per forward pass for every layer."""
        return position_ids

    def rotate(self, q: Tensor, k: Tensor, prepared: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """q (B, H, T, D), k (B, Hkv, T, D) at the positions `prepare` prepared -> q, k."""
        return q, k

    def score_bias(self, q: Tensor, mask: AttentionMask, key_len: int, score: nn.Module, *,
                   key_positions: Tensor | None = None) -> Tensor | None:
        """An additive bias broadcastable to the scores (B, H, T, S), or None, for queries at
        `mask.query_positions` against keys at `key_positions` (S,), by default 0 .. key_len - 1. `score` is the
        attention's score function, for terms scored like the keys (Shaw)."""
        return None

    def value_term(self, weights: Tensor, mask: AttentionMask, key_len: int, *,
                   key_positions: Tensor | None = None) -> Tensor | None:
        """A term (B, H, T, D) added to the weighted sum of values, from the weights (B, H, T, S) over keys at
        `key_positions` (as `score_bias`); or None."""
        return None

    def flex_score_mod(self, mask: AttentionMask):
        """`score_bias` as FlexAttention's `score_mod(score, b, h, q_idx, kv_idx) -> score` for queries at
        `mask.start + q_idx` and keys at kv_idx, or None where FlexAttention cannot express the scheme (a bias that
        reads the queries' vectors, a value term) or it adds nothing (`flex` says which)."""
        return None

    def init_weights(self) -> None:
        """Initialise the scheme's parameters (none here)."""

    @property
    def attends(self) -> bool:
        """Whether it acts inside attention: the builder gives each self-attention one."""
        return self.rotates or self.biases


class NoPositions(PositionScheme):
    """No positions at all: attention is permutation-equivariant (lecture: self-attention is order-blind)."""


class SinusoidalPositions(PositionScheme):
    """PE(pos, 2i) = sin(pos / 10000^(2i/C)), PE(pos, 2i+1) = cos(...). No parameters; any length.

    The same C/2 frequencies can be laid out two ways:

        interleaved (Vaswani et al. 2017)    sin f0, cos f0, sin f1, cos f1, ...
        halves (Marian)                      sin f0, sin f1, ..., cos f0, cos f1, ...
    """

    embeds = True

    def __init__(self, d_model: int, *, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        if layout not in ("interleaved", "halves"):
            raise ValueError(f"unknown sinusoidal layout {layout!r}; use 'interleaved' or 'halves'")
        inv_freq = torch.exp(-math.log(base) * torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (C/2,)
        self.layout = layout

    def embed(self, position_ids: Tensor) -> Tensor:
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq  # (B, T, C/2)
        if self.layout == "halves":
            return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (B, T, C)
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (B, T, C/2, 2) -> (B, T, C)

    forward = embed


class LearnedPositions(PositionScheme):
    """A learned vector per position, up to `max_seq_len` (GPT-2, BERT); nothing beyond its last row."""

    embeds = True

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_seq_len
        self.weight = nn.Parameter(torch.zeros(max_seq_len, d_model))

    def embed(self, position_ids: Tensor) -> Tensor:
        return F.embedding(position_ids, self.weight)  # (B, T, C)

    def init_weights(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=0.02)


class RotaryEmbedding(PositionScheme):
    """RoPE (Su et al. 2021): rotate each pair of query/key dimensions by an angle proportional to the position.

    Rotating q at position m and k at position n makes q_m . k_n depend only on m - n, and leaves norms unchanged.
    Pairs are (i, i + D/2), the layout of Hugging Face's Llama checkpoints ("rotate half").
    """

    rotates = True

    def __init__(self, head_dim: int, *, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,)

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """position_ids (B, T) or (T,) -> cos, sin, each (B, 1, T, D) or (1, 1, T, D), float32."""
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq  # (B, T, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (B, T, D)
        if angles.dim() == 2:
            angles = angles.unsqueeze(0)
        return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)

    prepare = forward

    def rotate(self, q: Tensor, k: Tensor, prepared: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        cos, sin = prepared
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, D) by the angles behind cos/sin (B or 1, 1, T, D)."""
    x32 = x.float()
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)


class RelativePositions(PositionScheme):
    """Shaw et al. 2018: learned embeddings a^K_ij, a^V_ij of the clipped distance j - i, shared across heads.

        e_ij = score(q_i, k_j) + score(q_i, a^K_ij)        z_i = sum_j alpha_ij (v_j + a^V_ij)

    For the dot scores this is Shaw's e_ij = q_i . (k_j + a^K_ij) * scale, and for the bilinear score
    q_i^T W (k_j + a^K_ij), since both are linear in the key. The additive score is not, so there the distance is
    scored as a key of its own: w^T tanh(W1 q_i + W2 k_j) + w^T tanh(W1 q_i + W2 a^K_ij). Distances beyond +-k
    share one embedding each side.
    """

    biases = True
    needs_weights = True
    title = "Shaw's relative positions"

    def __init__(self, max_distance: int, head_dim: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.key = nn.Parameter(torch.zeros(2 * max_distance + 1, head_dim))
        self.value = nn.Parameter(torch.zeros(2 * max_distance + 1, head_dim))

    def _index(self, mask: AttentionMask, key_len: int, key_positions: Tensor | None) -> Tensor:
        """(T, S): the table row of each query-key pair, its distance j - i clipped to [-k, k], shifted to 0 .. 2k."""
        keys, queries = mask.key_positions(key_len, key_positions), mask.query_positions
        distance = (keys[None, :] - queries[:, None]).clamp(-self.max_distance, self.max_distance)  # (T, S)
        return distance + self.max_distance

    def score_bias(self, q: Tensor, mask: AttentionMask, key_len: int, score: nn.Module, *,
                   key_positions: Tensor | None = None) -> Tensor:
        index = self._index(mask, key_len, key_positions)  # (T, S)
        return score.per_query(q, self.key[index])  # (B, H, T, S)

    def value_term(self, weights: Tensor, mask: AttentionMask, key_len: int, *,
                   key_positions: Tensor | None = None) -> Tensor:
        rel_v = self.value[self._index(mask, key_len, key_positions)].to(weights.dtype)  # (T, S, D)
        return torch.einsum("bhts,tsd->bhtd", weights, rel_v)

    def init_weights(self) -> None:
        for parameter in (self.key, self.value):
            nn.init.normal_(parameter, mean=0.0, std=0.02)


class ALiBi(PositionScheme):
    """ALiBi (Press et al. 2022, "Train Short, Test Long"): no position embeddings; head h adds -m_h * |i - j| to
    its scores, a penalty linear in the distance with a slope per head (`alibi_slopes`).

    Nothing depends on where the sequence starts or how long it is, so a model trained on short sequences runs on
    longer ones and, as the paper shows, extrapolates to them. Causal models see j <= i only, where this is the
    paper's -m_h (i - j) (BLOOM adds m_h * j, equal after the softmax); encoders see both sides, at the same cost.
    """

    biases = True
    flex = True
    title = "ALiBi"

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # (H,)

    def score_bias(self, q: Tensor, mask: AttentionMask, key_len: int, score: nn.Module, *,
                   key_positions: Tensor | None = None) -> Tensor:
        distance = (mask.query_positions[:, None] - mask.key_positions(key_len, key_positions)[None, :]).abs()  # (T, S)
        return -self.slopes.float()[:, None, None] * distance  # (H, 1, 1) * (T, S) -> (H, T, S)

    def flex_score_mod(self, mask: AttentionMask):
        slopes, start = self.slopes.float(), mask.start

        def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score - slopes[h] * (q_idx + start - kv_idx).abs()

        return alibi


def alibi_slopes(n_heads: int) -> Tensor:
    """The paper's head slopes: for n heads, n a power of 2, the geometric sequence 2^(-8/n), 2^(-16/n), .., 2^-8;
    otherwise those of the largest power of 2 below n, then every other slope of twice that many (Press et al.
    2022, section 3, and their code). (H,) float32"""

    def geometric(count: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / count) for i in range(count)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def make_positions(
    kind: str,
    *,
    d_model: int,
    n_heads: int,
    head_dim: int,
    max_seq_len: int,
    rope_theta: float = 10000.0,
    relative_max_distance: int = 16,
    sinusoidal_layout: str = "interleaved",
) -> PositionScheme:
    """The scheme `kind` names, for these sizes. Raises ValueError for an unknown kind."""
    if kind == "none":
        return NoPositions()
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model, layout=sinusoidal_layout)
    if kind == "learned":
        return LearnedPositions(max_seq_len, d_model)
    if kind == "rope":
        return RotaryEmbedding(head_dim, theta=rope_theta)
    if kind == "relative":
        return RelativePositions(relative_max_distance, head_dim)
    if kind == "alibi":
        return ALiBi(n_heads)
    raise ValueError(f"unknown position scheme {kind!r}; use none, sinusoidal, learned, rope, relative or alibi")
