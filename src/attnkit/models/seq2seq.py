"""Encoder-decoder (Vaswani et al. 2017): the encoder reads the source, the decoder writes the target while
cross-attending to the encoder's output.

    src (B, S) -> encoder stack -> memory (B, S, C) ---------------.
    tgt (B, T) -> decoder stack (causal self-attn, cross-attn to memory) -> lm_head -> logits (B, T, V)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.deprecation import renamed_keywords
from attnkit.errors import InputError
from attnkit.layers.kv_cache import KVCache
from attnkit.layers.output_loss import LossPath
from attnkit.models.decoder import allocate_cache_for, lm_logits_and_loss
from attnkit.models.output import ModelOutput
from attnkit.models.stack import TransformerStack


def check_paired(targets: int, sources: int) -> None:
    """Raise InputError for a target batch of another number of sequences than its source batch: each target is
    decoded against its own source."""
    if targets != sources:
        raise InputError(f"the target batch has {targets} sequences but the source batch {sources}; pass one target "
                         "per source")


class EncoderDecoder(nn.Module):
    """Sequence-to-sequence Transformer with separate `encode()` and `decode()`."""

    def __init__(
        self,
        *,
        encoder: TransformerStack,
        decoder: TransformerStack,
        lm_head: nn.Linear,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.lm_head = lm_head
        self.label_smoothing = label_smoothing
        self.loss_path = LossPath()  # without logits: how the loss is computed (the training plan's choice)

    def encode(self, src_ids: Tensor, *, src_mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """src_ids (B, S) -> memory (B, S, C)."""
        memory, _ = self.encoder(src_ids, attention_mask=src_mask, need_weights=need_weights)
        return memory

    @renamed_keywords(targets="labels")
    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        labels: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        return_logits: bool = True,
    ) -> ModelOutput:
        """tgt_ids (B, T), memory (B, S, C) -> logits (B, T, V_tgt).

        src_mask, tgt_mask: (B, S) and (B, T) padding masks of the source and the target, 1 at real tokens.
        labels: (B, T) the token each position predicts, aligned with tgt_ids (labels[:, t] follows tgt_ids[:, t],
            as Hugging Face's seq2seq labels), -100 at padding.
        return_logits: with labels, False computes the loss chunk by chunk and returns logits=None.
        """
        width = self.decoder.embeddings.token.embedding_dim
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[-1] != width:
            raise InputError(f"memory has shape {tuple(getattr(memory, 'shape', ()))}; decode reads the encoder's "
                             f"output (B, S, {width}): pass what encode() returned")
        cross = cache.layers[0].cross if cache is not None else None
        if cross is not None and cross[0].shape[2] != memory.shape[1]:  # (B, Hkv, S, D) computed from the first memory
            raise InputError(f"the KV cache holds the keys of a source of {cross[0].shape[2]} tokens, this memory has "
                             f"{memory.shape[1]}: a cache serves one source; allocate a new one for a new source")
        if cross is not None and cache.memory is not None and cache.memory is not memory:  # identity: no device sync
            raise InputError("the KV cache holds the cross-attention keys of another memory than this one: a cache "
                             "serves one source; pass the memory of its first step every step, or allocate a new "
                             "cache for a new source")
        if tgt_ids.dim() == 2:
            check_paired(tgt_ids.shape[0], memory.shape[0])
        hidden, attentions = self.decoder(
            tgt_ids,
            attention_mask=tgt_mask,
            cache=cache,
            context=memory,
            context_mask=src_mask.bool() if src_mask is not None else None,
            need_weights=need_weights,
        )
        if cache is not None:
            cache.memory = memory  # what the cross keys now in the cache came from (or were kept for)
        logits, loss = lm_logits_and_loss(self.lm_head, hidden, labels, self.label_smoothing, return_logits,
                                          self.loss_path)
        return ModelOutput(logits=logits, loss=loss, attentions=attentions if need_weights else None, cache=cache)

    @renamed_keywords(targets="labels")
    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        labels: Tensor | None = None,
        need_weights: bool = False,
        return_logits: bool = True,
    ) -> ModelOutput:
        """Teacher-forced pass: src (B, S), tgt (B, T) -> logits (B, T, V) (see `decode` for the arguments)."""
        if tgt_ids.dim() == 2 and src_ids.dim() == 2:  # before the encoder runs
            check_paired(tgt_ids.shape[0], src_ids.shape[0])
        # the class's encode and decode: sharded training (FSDP2) wraps the instance's to gather the whole model for
        # a call of their own, and inside forward, which has gathered it, torch 2.11 freed it again after encode
        encoder_attentions = None
        if need_weights:
            memory, encoder_attentions = self.encoder(src_ids, attention_mask=src_mask, need_weights=True)
        else:
            memory = EncoderDecoder.encode(self, src_ids, src_mask=src_mask)
        out = EncoderDecoder.decode(
            self,
            tgt_ids,
            memory,
            src_mask=src_mask,
            tgt_mask=tgt_mask,
            labels=labels,
            need_weights=need_weights,
            return_logits=return_logits,
        )
        out.encoder_attentions = encoder_attentions
        return out

    def allocate_cache(
        self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None, device=None
    ) -> KVCache:
        """A decoder cache; cross-attention keys/values are filled on the first decode call."""
        return allocate_cache_for(self.decoder, batch_size, max_len, dtype=dtype, device=device)
