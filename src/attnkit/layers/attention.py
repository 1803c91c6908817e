"""Attention: scores between queries and keys, a softmax over keys, a weighted sum of values.

Score functions (lecture: "Attention Score Functions") share one signature `score(q, k) -> (B, H, T, S)`:

    dot         q . k                        (Luong et al. 2015)
    scaled_dot  q . k / sqrt(D)              (Vaswani et al. 2017)
    bilinear    q^T W k                      (Luong et al. 2015, "general")
    additive    w^T tanh(W1 q + W2 k)        (Bahdanau et al. 2015)

Heads: H query heads share Hkv key/value heads, each serving H / Hkv query heads:

    multi-head (Hkv = H)      grouped-query (1 < Hkv < H)     multi-query (Hkv = 1)
    q q q q                   q q q q                         q q q q
    | | | |                   \\ / \\ /                          \\ \\ / /
    k k k k                    k   k                            k
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.deprecation import warn_renamed
from attnkit.layers.autocast import cast_for_autocast
from attnkit.layers.kernels import MathKernel, attend, flex_attend, soft_capped
from attnkit.layers.kv_cache import LayerCache
from attnkit.layers.masks import AttentionMask
from attnkit.layers.positions import PositionScheme


class DotScore(nn.Module):
    """`scale * q . k`; scale 1 is Luong's dot score, 1/sqrt(D) Vaswani's scaled dot product."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.from_keys(q, self.project_keys(k))

    def project_keys(self, k: Tensor) -> Tensor:
        """The keys' side of the score, which depends on the keys alone (nothing to project here)."""
        return k

    def from_keys(self, q: Tensor, keys: Tensor) -> Tensor:
        """Scores from `project_keys(k)`: q (B, H, T, D), keys (B, H, S, D) -> (B, H, T, S)."""
        return torch.matmul(q, keys.transpose(-2, -1)) * self.scale  # (B, H, T, D) @ (B, H, D, S) -> (B, H, T, S)

    def per_query(self, q: Tensor, keys: Tensor) -> Tensor:
        """Each query t against its own keys: q (B, H, T, D), keys (T, S, D) -> (B, H, T, S)."""
        return torch.einsum("bhtd,tsd->bhts", q, keys) * self.scale


class BilinearScore(nn.Module):
    """`q^T W k` with one learned W (D, Dk) shared by the heads; Dk = D unless keys are wider (key_dim), as the
    encoder states of a bidirectional recurrent encoder are (Luong et al. 2015, "general")."""

    def __init__(self, head_dim: int, *, key_dim: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Linear(key_dim or head_dim, head_dim, bias=False)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.from_keys(q, self.project_keys(k))

    def project_keys(self, k: Tensor) -> Tensor:
        """W k: (B, H, S, Dk) -> (B, H, S, D), computed once when many queries meet the same keys (a recurrent
        decoder's steps)."""
        return self.weight(k)

    def from_keys(self, q: Tensor, keys: Tensor) -> Tensor:
        """Scores from `project_keys(k)`: q (B, H, T, D), keys (B, H, S, D) -> (B, H, T, S)."""
        return torch.matmul(q, keys.transpose(-2, -1))  # (B, H, T, S)

    def per_query(self, q: Tensor, keys: Tensor) -> Tensor:
        """Each query t against its own keys: q (B, H, T, D), keys (T, S, Dk) -> (B, H, T, S)."""
        return torch.einsum("bhtd,tsd->bhts", q, self.weight(keys))


class AdditiveScore(nn.Module):
    """`w^T tanh(W1 q + W2 k)`: a one-hidden-layer MLP of each query-key pair (hidden width A). Keys may be wider
    than queries (key_dim), as Bahdanau's bidirectional encoder states (2n) are than the decoder's (n)."""

    def __init__(self, head_dim: int, hidden_dim: int, *, key_dim: int | None = None) -> None:
        super().__init__()
        self.query_proj = nn.Linear(head_dim, hidden_dim, bias=False)
        self.key_proj = nn.Linear(key_dim or head_dim, hidden_dim, bias=True)
        self.out = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self.from_keys(q, self.project_keys(k))

    def project_keys(self, k: Tensor) -> Tensor:
        """W2 k: (B, H, S, Dk) -> (B, H, S, A), computed once when many queries meet the same keys (Bahdanau's
        decoder asks at every step)."""
        return self.key_proj(k)

    def from_keys(self, q: Tensor, keys: Tensor) -> Tensor:
        """Scores from `project_keys(k)`: q (B, H, T, D), keys (B, H, S, A) -> (B, H, T, S)."""
        hidden = self.query_proj(q).unsqueeze(3) + keys.unsqueeze(2)  # (B, H, T, 1, A) + (B, H, 1, S, A)
        return self.out(torch.tanh(hidden)).squeeze(-1)  # (B, H, T, S)

    def per_query(self, q: Tensor, keys: Tensor) -> Tensor:
        """Each query t against its own keys: q (B, H, T, D), keys (T, S, Dk) -> (B, H, T, S)."""
        hidden = self.query_proj(q).unsqueeze(3) + self.key_proj(keys)  # (B, H, T, 1, A) + (T, S, A)
        return self.out(torch.tanh(hidden)).squeeze(-1)  # (B, H, T, S)


def _concatenated(*layers: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """The weights (sum of outputs, C) and biases of linear layers reading the same input, stacked as one layer's."""
    weight = torch.cat([layer.weight for layer in layers])
    biases = [layer.bias for layer in layers]
    return weight, (torch.cat(biases) if all(b is not None for b in biases) else None)


def make_score(kind: str, head_dim: int, *, additive_dim: int | None = None) -> nn.Module:
    if kind == "scaled_dot":
        return DotScore(1.0 / math.sqrt(head_dim))
    if kind == "dot":
        return DotScore(1.0)
    if kind == "bilinear":
        return BilinearScore(head_dim)
    if kind == "additive":
        return AdditiveScore(head_dim, additive_dim or head_dim)
    raise ValueError(f"unknown score {kind!r}; use scaled_dot, dot, bilinear or additive")


def soft_cap(scores: Tensor, cap: float) -> Tensor:
    """cap * tanh(scores / cap): scores kept inside (-cap, cap), nearly unchanged well inside it (Gemma 2's attention
    logit soft-capping, Gemma Team 2024, section 2)."""
    return cap * torch.tanh(scores / cap)


def attention_weights(scores: Tensor, bias: Tensor | None) -> Tensor:
    """Softmax over keys (in float32 at least) of the scores plus the additive bias (masked keys: -inf, weight 0).
    (B, H, T, S)"""
    total = scores.to(_softmax_dtype(scores.dtype))
    if bias is not None:
        total = total + bias
    return torch.softmax(total, dim=-1).to(scores.dtype)


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """bf16/fp16 scores are summed with biases and normalised in float32; float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def _accepts_old_mask_keywords(forward):
    """`causal=` and `key_is_real=`, which attention took before the mask object, still work with a
    DeprecationWarning: they become the `AttentionMask` they describe."""

    @functools.wraps(forward)
    def wrapper(self: Attention, x: Tensor, *, causal: bool | None = None, key_is_real: Tensor | None = None,
                **kwargs) -> tuple[Tensor, Tensor | None]:
        if causal is not None or key_is_real is not None:
            if kwargs.get("mask") is not None:
                raise TypeError("Attention() got mask= and causal=/key_is_real=; give mask= only")
            warn_renamed("Attention() keywords causal= and key_is_real=",
                         "mask=AttentionMask(T, causal=..., attention_mask=...)")
            cache = kwargs.get("cache") if kwargs.get("context") is None else None
            kwargs["mask"] = AttentionMask.for_queries(x, cache, causal=bool(causal), attention_mask=key_is_real)
        return forward(self, x, **kwargs)

    return wrapper


class KernelPath(NamedTuple):
    """Which kernel one pass of an attention layer takes (`Attention.kernel_path`) and the rule that chose it.

    kernel: "sdpa" (`attend` with no mask tensor: SDPA or the machine's math kernel), "sdpa+bias" (`attend` with a
    dense (T, S) additive bias), "flex" (`flex_attend`) or "reference" (`Attention._reference`: scores and weights
    formed). rule: a key of `_PATHS`, worded only where a plan asks (`Attention.explain_kernel`), so that a forward
    pass, which reads the kernel alone, formats nothing.
    """

    kernel: str
    rule: str


# The rules of `Attention.kernel_path`, in the order it applies them -> the path each gives, built once.
_PATHS = {rule: KernelPath(kernel, rule) for rule, kernel in (
    ("score", "reference"), ("weights", "reference"), ("value term", "reference"), ("causal", "sdpa"),
    ("flex", "flex"), ("soft-cap", "reference"), ("visible", "sdpa"), ("bias", "sdpa+bias"))}


def _mask_parts(mask: AttentionMask, key_len: int, window: int | None) -> str:
    """What of `mask` hides keys, in words ("the causal mask, the window of 4")."""
    parts = (("the causal mask", mask.causal), ("the prefix", mask.prefix_len is not None),
             (f"the window of {window}", window is not None and window < key_len),
             ("the padding", mask.attention_mask is not None), ("the document mask", mask.documents is not None))
    return ", ".join(part for part, present in parts if present)


class Attention(nn.Module):
    """Multi-head (grouped-query, multi-query) attention, for self- and cross-attention.

    Projections `q_proj k_proj v_proj o_proj` follow the ecosystem's names. `relative` is the position scheme
    that acts inside self-attention (RoPE, Shaw, ALiBi: schemes whose scores depend on i - j); it may rotate q and
    k, add a bias to the scores and a term to the values (`layers/positions.py`). Masks and position biases
    become one additive float bias in one place (`_bias`), so every score function composes with every scheme.
    Dot scores run through the fused kernels of `layers/kernels.py` (SDPA, or plain products where the machine's
    plan hands the layer a `math_kernel`, or FlexAttention for a position bias or mask SDPA takes only as a dense
    bias, where the plan turns `flex_attention` on) unless weights are requested or the scheme reads them; the
    explicit path is the readable reference and tests hold them equal.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        score: str = "scaled_dot",
        bias: bool = True,
        dropout: float = 0.0,
        additive_dim: int | None = None,
        relative: PositionScheme | None = None,
        window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        if n_heads < 1 or (head_dim is None and d_model % n_heads):
            raise ValueError(f"d_model={d_model} must split into n_heads={n_heads} heads: choose n_heads >= 1 "
                             "dividing d_model, or give head_dim")
        if (window is not None and window < 1) or (softcap is not None and not softcap > 0):
            raise ValueError(f"window={window} must be >= 1 and softcap={softcap} > 0 (None: neither)")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.head_dim = head_dim or d_model // n_heads
        if n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={self.n_kv_heads}")
        self.grouped = self.n_kv_heads != n_heads  # a plain bool for the kernels' enable_gqa, never a shape test
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.qkv_proj: nn.Module | None = None  # set by `fuse_qkv` (inference)
        self.score_kind = score
        self.score = make_score(score, self.head_dim, additive_dim=additive_dim)
        self.pattern = nn.Identity()  # the weights (B, H, T, S) on the reference path: where a hook reads or edits them
        self.dropout = dropout
        self.relative = relative
        self.window = window  # sliding-window attention: a query sees keys fewer than `window` positions back
        self.softcap = softcap  # scores soft-capped to softcap * tanh(s / softcap) (`soft_cap`), or None
        self.math_kernel: MathKernel | None = None  # where plain products replace SDPA (`kernels.use_math_kernel`)
        self.flex_attention = False  # FlexAttention for biases and masks beyond causality (`use_flex_attention`)
        # what `kernel_path` reads on every pass, fixed at build as plain bools: reading the score and the scheme,
        # submodules, goes through nn.Module.__getattr__, which cost about half the decision
        self.dot_score = isinstance(self.score, DotScore)
        self.position_biases = relative is not None and relative.biases  # self-attention's scores take its bias
        self.position_reads_weights = self.position_biases and relative.needs_weights  # Shaw's value term
        self.position_flex = self.position_biases and relative.flex  # its bias as a FlexAttention score_mod

    def _split_heads(self, x: Tensor, n_heads: int) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, n_heads, self.head_dim).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)

    def _project_kv(self, source: Tensor) -> tuple[Tensor, Tensor]:
        source = cast_for_autocast(source)  # read by two products: one cast under autocast, not two
        keys = self._split_heads(self.k_proj(source), self.n_kv_heads)  # (B, Hkv, S, D)
        values = self._split_heads(self.v_proj(source), self.n_kv_heads)  # (B, Hkv, S, D)
        return keys, values

    def _project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries (B, H, T, D), keys and values (B, Hkv, T, D), through one product once fused."""
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x)  # (B, T, (H + 2 Hkv) D)
        elif self._trains_projections():
            qkv = F.linear(x, *_concatenated(self.q_proj, self.k_proj, self.v_proj))  # (B, T, (H + 2 Hkv) D)
        else:
            x = cast_for_autocast(x)  # read by three products: one cast under autocast, not three
            return (self._split_heads(self.q_proj(x), self.n_heads), *self._project_kv(x))
        # one view and one transpose for the three (fewer calls a decoding step), the same strides as split apart
        batch, length, _ = qkv.shape
        heads = qkv.view(batch, length, self.n_heads + 2 * self.n_kv_heads, self.head_dim).transpose(1, 2)
        return heads.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)  # (B, H + 2 Hkv, T, D) -> three

    def _trains_projections(self) -> bool:
        """Whether this pass trains the q/k/v weights through plain linear layers (train mode, gradients on). It then
        runs one product over the concatenated weights (one kernel forward, two backward, where there were three and
        six); the weights stay three parameters, so checkpoints, LoRA and optimizers see q_proj, k_proj and v_proj.
        Inference (and `attnkit.inspect`, in eval mode) calls the three layers, each weight read once."""
        parts = (self.q_proj, self.k_proj, self.v_proj)
        return (self.training and torch.is_grad_enabled() and len({p.bias is None for p in parts}) == 1
                and all(type(p) is nn.Linear and p.weight.requires_grad for p in parts))

    @torch.no_grad()
    def fuse_qkv(self) -> None:
        """For inference in self-attention: one projection to [q; k; v] replaces q_proj, k_proj and v_proj.

        Decoding then runs one matrix product per layer where it ran three (fewer, larger kernel calls), with the
        same numbers. The separate layers are removed, so a fused model's state dict is not a checkpoint's.
        """
        parts = (self.q_proj, self.k_proj, self.v_proj)
        fused = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=parts[0].bias is not None,
                          device=parts[0].weight.device, dtype=parts[0].weight.dtype)
        fused.weight.copy_(torch.cat([p.weight for p in parts]))  # (H*D + 2*Hkv*D, C)
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
        self.qkv_proj = fused
        del self.q_proj, self.k_proj, self.v_proj

    @_accepts_old_mask_keywords
    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        mask: AttentionMask | None = None,
        positions: Tensor | tuple[Tensor, ...] | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from x (B, T, C) to itself, or to `context` (B, S, C) for cross-attention.

        mask: which keys each query may see and where the queries sit (`layers/masks.py`), built once per forward
            pass by the model and shared by its layers; this layer asks it for the form its kernel wants, for its
            own window. None: every key, the queries at the positions after the cached ones.
        positions: the queries' positions (B or 1, T) as the position scheme prepares them for `rotate`
            (`PositionScheme.prepare`, once per forward pass for all layers); by default the mask's query positions.
        cache: the layer's KV cache; self-attention appends to it, cross-attention computes the context's
            keys and values once and reuses them.
        Returns the output (B, T, C) and, when `need_weights`, the weights (B, H, T, S).
        """
        length = x.shape[1]
        cross = context is not None
        if mask is None:
            mask = AttentionMask(length, start=cache.length if cache is not None and not cross else 0, device=x.device)
        relative = None if cross else self.relative  # positions act in self-attention only
        window = None if cross else self.window
        # 1-3. project to queries, keys and values, split into heads, place by position, extend by the cache
        if cross:
            q, k, v = self._cross_queries_keys_values(x, context, cache)
        else:
            q, k, v = self._self_queries_keys_values(x, positions, cache, mask)  # (B, H, T, D), (B, Hkv, S, D) twice
        key_len = k.shape[2]
        biased = self.position_biases and not cross  # as `kernel_path` reads it
        dropout = self.dropout if self.training else 0.0
        # 4-7. scores, + mask and position bias, softmax, weighted sum of values: one fused kernel where nothing reads
        # the weights (`kernel_path` says which)
        path = self.kernel_path(mask, key_len, cross=cross, cached=cache is not None, need_weights=need_weights)
        if path.kernel == "sdpa":  # causality alone needs no tensor: SDPA's is_causal, or a single newest query
            out = attend(q, k, v, None, causal=mask if mask.causal and length > 1 else None, scale=self.score.scale,
                         dropout=dropout, grouped=self.grouped, math_kernel=self.math_kernel)  # (B, H, T, D)
            return self._merge_heads(out), None
        if path.kernel == "flex":
            score_mod = soft_capped(self.softcap, relative.flex_score_mod(mask) if biased else None)
            out = flex_attend(q, k, v, mask=mask, window=window, score_mod=score_mod, scale=self.score.scale,
                              grouped=self.grouped)
            return self._merge_heads(out), None  # (B, T, C)
        key_positions = cache.key_positions() if cache is not None and not cross else None
        bias = self._bias(q, mask, key_len, window, key_positions, relative if biased else None)
        if path.kernel == "sdpa+bias":
            out, weights = attend(q, k, v, bias, scale=self.score.scale, dropout=dropout, grouped=self.grouped,
                                  math_kernel=self.math_kernel), None
        else:
            out, weights = self._reference(q, k, v, bias, dropout, mask if biased else None, key_positions)
        return self._merge_heads(out), (weights if need_weights else None)

    def kernel_path(self, mask: AttentionMask, key_len: int, *, cross: bool = False, cached: bool = False,
                    need_weights: bool = False, flex: bool | None = None, training: bool | None = None) -> KernelPath:
        """The kernel a pass of `mask`'s queries over `key_len` keys takes (the one `forward` runs) and the rule that
        chose it; cross: cross-attention (no positions, no window); cached: the keys come through a KV cache
        (FlexAttention takes none); flex, training: as if `flex_attention` and the train mode were these (None: as
        they are). `explain_kernel` says the rule in words."""
        window = None if cross else self.window
        biased = self.position_biases and not cross  # positions act in self-attention only
        if not self.dot_score:
            return _PATHS["score"]
        if need_weights:
            return _PATHS["weights"]
        if biased and self.position_reads_weights:
            return _PATHS["value term"]
        if self.softcap is None and not biased and mask.is_causal_only(key_len, window=window):
            return _PATHS["causal"]
        flex = self.flex_attention if flex is None else flex
        dropout = self.dropout if (self.training if training is None else training) else 0.0
        masks = mask.hides_keys(key_len, window=window)
        if (flex and dropout == 0 and not cached and isinstance(mask.start, int)
                and (self.position_flex if biased else self.softcap is not None or masks)):
            return _PATHS["flex"]
        if self.softcap is not None:
            return _PATHS["soft-cap"]
        return _PATHS["bias" if biased or masks else "visible"]

    def explain_kernel(self, mask: AttentionMask, key_len: int, *, cross: bool = False, cached: bool = False,
                       need_weights: bool = False, flex: bool | None = None, training: bool | None = None
                       ) -> tuple[str, str]:
        """`kernel_path`'s kernel for the same pass and, in words, why: what the inference and training plans print
        (`--explain`)."""
        path = self.kernel_path(mask, key_len, cross=cross, cached=cached, need_weights=need_weights, flex=flex,
                                training=training)
        flex_off = not (self.flex_attention if flex is None else flex)
        position = None if cross else self.relative
        if path.rule == "bias":
            window = None if cross else self.window
            hidden = [f"the score bias of {position.title}"] if position is not None and position.biases else []
            if mask.hides_keys(key_len, window=window):
                hidden.append(_mask_parts(mask, key_len, window))
            return path.kernel, (f"{', '.join(hidden)} reach SDPA as a dense (T, S) additive bias"
                                 + (" (FlexAttention is off here)" if flex_off else ""))
        why = {"score": f"the {self.score_kind} score is no dot product, all fused kernels compute",
               "weights": "the weights are asked for",
               "value term": f"the value term of {getattr(position, 'title', '')} reads the weights",
               "causal": "plain causal attention: no mask tensor to build, no (T, S) weights kept",
               "flex": "the position bias and soft-cap as a score_mod, the mask as a block mask: one fused kernel "
                       "with no (T, S) bias",
               "soft-cap": "SDPA cannot soft-cap scores" + (", and FlexAttention is off here" if flex_off else ""),
               "visible": "every key visible: no mask, no (T, S) weights kept"}[path.rule]
        return path.kernel, why

    def _merge_heads(self, out: Tensor) -> Tensor:
        """8. Merge the heads and project back to the model width: (B, H, T, D) -> (B, T, C)."""
        batch, _, length, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.n_heads * self.head_dim))

    def _self_queries_keys_values(
        self, x: Tensor, positions: Tensor | tuple[Tensor, ...] | None, cache: LayerCache | None, mask: AttentionMask
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention: q (B, H, T, D) from x, k and v (B, Hkv, S, D) from x and the cached positions; a rotating
        position scheme (RoPE) turns q and k by their positions before k is cached."""
        q, k, v = self._project_qkv(x)  # (B, H, T, D), (B, Hkv, T, D) twice
        if self.relative is not None and self.relative.rotates:
            if positions is None:
                positions = self.relative.prepare(mask.query_positions[None])  # (1, T)
            q, k = self.relative.rotate(q, k, positions)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hkv, S, D)
        return q, k, v

    def _cross_queries_keys_values(
        self, x: Tensor, context: Tensor, cache: LayerCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-attention: q from x, k and v from the context (B, S, C), computed once when there is a cache."""
        q = self._split_heads(self.q_proj(x), self.n_heads)  # (B, H, T, D)
        if cache is not None and cache.cross is not None:
            return q, *cache.cross
        k, v = self._project_kv(context)  # (B, Hkv, S, D)
        if cache is not None:
            cache.cross = (k, v)
        return q, k, v

    def _bias(
        self, q: Tensor, mask: AttentionMask, key_len: int, window: int | None, key_positions: Tensor | None,
        relative: PositionScheme | None,
    ) -> Tensor | None:
        """The one place masks and position biases meet: one additive float bias (float32 at least) broadcastable
        to (B, H, T, S), 0 where a key is visible, -inf where it is masked, plus the position scheme's score bias
        (`relative`, a scheme that biases); None: neither."""
        dtype = _softmax_dtype(q.dtype)
        bias = mask.bias(key_len, dtype=dtype, window=window, key_positions=key_positions)
        if relative is not None:
            position = relative.score_bias(q, mask, key_len, self.score, key_positions=key_positions)
            if position is not None:
                bias = position.to(dtype) if bias is None else bias + position.to(dtype)
        return bias

    def _reference(
        self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout: float, mask: AttentionMask | None,
        key_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The lecture's path: scores, + bias (masks, positions), softmax, dropout, weighted sum (+ the position
        scheme's value term, given the `mask` that places the queries and the keys' positions where a rolling cache
        holds them out of order)."""
        if self.n_kv_heads != self.n_heads:  # each kv head serves n_heads / n_kv_heads query heads
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, Hkv, S, D) -> (B, H, S, D)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        scores = self.score(q, k)  # (B, H, T, S)
        if self.softcap is not None:
            scores = soft_cap(scores, self.softcap)
        weights = self.pattern(attention_weights(scores, bias))  # (B, H, T, S)
        dropped = F.dropout(weights, p=dropout) if dropout > 0 else weights
        out = torch.matmul(dropped, v)  # (B, H, T, S) @ (B, H, S, D) -> (B, H, T, D)
        if mask is not None and self.relative.needs_weights:
            out = out + self.relative.value_term(dropped, mask, k.shape[2], key_positions=key_positions)
        return out, weights

