"""Transformer blocks: attention and feed-forward sublayers, each wrapped in a residual connection and a norm.

Where the norm sits is a choice (Xiong et al. 2020):

    post-norm (Vaswani 2017, BERT)          pre-norm (GPT-2, Llama)
    x -> sublayer -> + -> norm ->           x -> norm -> sublayer -> + ->
    '----------------'                      '-------------------------'

`EncoderBlock` has bidirectional self-attention; `DecoderBlock` has causal self-attention and, inside an
encoder-decoder, cross-attention to the encoder's output between the two.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnkit.deprecation import warn_renamed
from attnkit.errors import InputError
from attnkit.layers.attention import Attention
from attnkit.layers.kv_cache import LayerCache
from attnkit.layers.masks import AttentionMask


def _accepts_old_mask_keywords(forward):
    """`key_is_real=` and `context_is_real=`, which blocks took before the mask objects, still work with a
    DeprecationWarning: they become the block's `mask` and `cross_mask`."""

    @functools.wraps(forward)
    def wrapper(self: TransformerBlock, x: Tensor, *, key_is_real: Tensor | None = None,
                context_is_real: Tensor | None = None, **kwargs) -> tuple[Tensor, dict[str, Tensor]]:
        old_keywords = (("key_is_real", "mask", key_is_real), ("context_is_real", "cross_mask", context_is_real))
        for old, new, given in old_keywords:
            if given is not None and kwargs.get(new) is not None:
                raise TypeError(f"a block got {new}= and {old}=; give {new}= only")
        if key_is_real is not None:
            warn_renamed("a block's key_is_real=", "mask=AttentionMask(T, causal=..., attention_mask=...)")
            kwargs["mask"] = AttentionMask.for_queries(x, kwargs.get("cache"), causal=self.causal,
                                                       attention_mask=key_is_real)
        if context_is_real is not None:
            warn_renamed("a block's context_is_real=", "cross_mask=AttentionMask(T, attention_mask=...)")
            kwargs["cross_mask"] = AttentionMask.for_queries(x, attention_mask=context_is_real)
        return forward(self, x, **kwargs)

    return wrapper


class TransformerBlock(nn.Module):
    """A block built from its parts. x (B, T, C) -> (B, T, C), plus attention weights when asked."""

    causal: ClassVar[bool] = False

    def __init__(
        self,
        *,
        self_attn: Attention,
        attn_norm: nn.Module,
        mlp: nn.Module,
        mlp_norm: nn.Module,
        cross_attn: Attention | None = None,
        cross_attn_norm: nn.Module | None = None,
        norm_position: str = "pre",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        if (cross_attn is None) != (cross_attn_norm is None):
            raise ValueError("cross_attn and cross_attn_norm come together")
        self.self_attn = self_attn
        self.attn_norm = attn_norm
        self.cross_attn = cross_attn
        self.cross_attn_norm = cross_attn_norm
        self.mlp = mlp
        self.mlp_norm = mlp_norm
        self.pre_norm = norm_position == "pre"
        self.dropout = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))

    @_accepts_old_mask_keywords
    def forward(
        self,
        x: Tensor,
        *,
        mask: AttentionMask | None = None,
        positions: Tensor | tuple[Tensor, ...] | None = None,
        cache: LayerCache | None = None,
        context: Tensor | None = None,
        cross_mask: AttentionMask | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """mask: the self-attention's mask, built once per forward pass by the stack (None: this block's own
        structure, causal or not, over x alone); cross_mask: the cross-attention's (the context's padding).
        positions: x's token positions as the self-attention's position scheme prepared them.
        Returns the new x (B, T, C) and {"self": (B, H, T, S), "cross": (B, H, T, S_src)} when asked."""
        if mask is None:
            mask = AttentionMask(x.shape[1], start=cache.length if cache is not None else 0, causal=self.causal,
                                 device=x.device)
        elif mask.causal != self.causal:
            raise ValueError(f"{type(self).__name__} attends {'causally' if self.causal else 'both ways'}: give it a "
                             f"mask with causal={self.causal}")
        weights: dict[str, Tensor] = {}

        def self_attention(h: Tensor) -> Tensor:
            out, w = self.self_attn(h, mask=mask, positions=positions, cache=cache, need_weights=need_weights)
            if w is not None:
                weights["self"] = w
            return out

        def cross_attention(h: Tensor) -> Tensor:
            out, w = self.cross_attn(h, context=context, mask=cross_mask, cache=cache, need_weights=need_weights)
            if w is not None:
                weights["cross"] = w
            return out

        x = self._residual(x, self.attn_norm, self_attention)
        if self.cross_attn is not None:
            if context is None:
                raise ValueError("this block has cross-attention: pass the encoder output as context")
            x = self._residual(x, self.cross_attn_norm, cross_attention)
        x = self._residual(x, self.mlp_norm, self.mlp)
        return x, weights


class EncoderBlock(TransformerBlock):
    """Bidirectional self-attention + FFN (the Transformer encoder layer; BERT)."""

    causal = False

    def __init__(self, **parts) -> None:
        if parts.get("cross_attn") is not None:
            raise ValueError("an encoder block has no cross-attention")
        super().__init__(**parts)


class DecoderBlock(TransformerBlock):
    """Causal self-attention, optional cross-attention, FFN (the Transformer decoder layer; GPT; Llama)."""

    causal = True


# What users pass as `compile` -> torch.compile's mode. "max-autotune" times several kernels for each matrix product
# while compiling (minutes, cached on disk); CUDA graphs are left out, since the decoding cache is written in place.
# "aot" captures a decoder's decoding step ahead of time (`generate/captured_step.py`); a model whose step cannot be
# captured is compiled as by "default".
COMPILE_MODES = {"default": "default", "max-autotune": "max-autotune-no-cudagraphs", "aot": "default"}


def torch_compile_mode(compile: bool | str) -> str | None:
    """`compile` as users give it (False, True, "default", "max-autotune", "aot") -> torch.compile's mode; None:
    eager."""
    if compile is False or compile is None:
        return None
    name = "default" if compile is True else compile
    if name not in COMPILE_MODES:
        raise InputError(f"compile={compile!r} is not a compile mode; use True, False, {', '.join(COMPILE_MODES)}")
    return COMPILE_MODES[name]


def compile_blocks(model: nn.Module, *, dynamic: bool | None = None, mode: str = "default") -> nn.Module:
    """torch.compile every transformer block of `model` in place (parameter names and checkpoints unchanged).

    Blocks rather than the whole model: the edge checks on token ids stay eager, the blocks of a stack share one
    compiled graph, and compile time stays that of one block. `dynamic=True` compiles for varying lengths at once
    (decoding, whose cache grows every step). Returns the model.
    """
    for module in model.modules():
        if isinstance(module, TransformerBlock):
            module.compile(dynamic=dynamic, mode=mode)
    return model


def attention_kernels(model: nn.Module, *, cached: bool, training: bool = False, flex: bool | None = None,
                      packed: bool = False, padded: bool = False) -> list[tuple[str, str, str]]:
    """The kernel each attention layer of `model`'s blocks takes, and why (`Attention.explain_kernel`), in a pass over
    more tokens than any window spans: each (where, kernel, why) once, in the blocks' order. cached: keys through a
    KV cache (decoding); training, flex: as `kernel_path` takes them; packed: rows of several documents (a document
    mask); padded: batches carry an attention mask over their keys (padded rows: classify, tag, translate)."""
    blocks = [module for module in model.modules() if isinstance(module, TransformerBlock)]
    length = 1 + max((block.self_attn.window or 1 for block in blocks), default=1)
    documents = torch.zeros(1, length, dtype=torch.long) if packed else None
    real = torch.ones(1, length, dtype=torch.bool) if padded else None  # (B, S): the mask a padded batch brings
    paths = []
    for block in blocks:
        where = "causal self-attention" if block.causal else "self-attention"
        mask = AttentionMask(length, causal=block.causal, attention_mask=real, documents=documents)
        paths.append((where, *block.self_attn.explain_kernel(mask, length, cached=cached, training=training,
                                                             flex=flex)))
        if block.cross_attn is not None:
            sources = AttentionMask(length, attention_mask=real)
            paths.append(("cross-attention", *block.cross_attn.explain_kernel(sources, length, cross=True,
                                                                              cached=cached, training=training,
                                                                              flex=flex)))
    return list(dict.fromkeys(paths))
