"""Decoder-only models (GPT-2, Llama): a causal stack and an output projection to the vocabulary, a classifier of
each position (token classification), or a score of the whole sequence read at its last token (a reward model).

    ids (B, T) -> TransformerStack of DecoderBlocks (causal) -> lm_head (C -> V) -> logits (B, T, V)
                                                             -> classifier (C -> n_classes)      (tokens)
                                                             -> last real token -> classifier (C -> n_classes)
                                                                                    -> logits (B, n_classes) (sequence)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.deprecation import renamed_keywords
from attnkit.layers.kv_cache import KVCache, StaticKVCache
from attnkit.layers.output_loss import LossPath, linear_cross_entropy
from attnkit.models.output import ModelOutput, check_labels, cross_entropy
from attnkit.models.stack import TransformerStack


class DecoderLM(nn.Module):
    """Predicts each next token from the ones before it."""

    def __init__(self, *, stack: TransformerStack, lm_head: nn.Linear, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.stack = stack
        self.lm_head = lm_head
        self.label_smoothing = label_smoothing
        self.loss_path = LossPath()  # without logits: how the loss is computed (the training plan's choice)

    @renamed_keywords(targets="labels")
    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        cache: KVCache | None = None,
        prefix_len: int | Tensor | None = None,
        document_ids: Tensor | None = None,
        need_weights: bool = False,
        return_logits: bool = True,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits (B, T, V).

        labels: (B, T) the token each position predicts, aligned with the logits: labels[:, t] is the token after
            input_ids[:, t] (already shifted, unlike Hugging Face's causal LMs, which shift inside); -100 where no
            loss is wanted.
        attention_mask: (B, S) 1 at real tokens, 0 at padding (S includes cached positions).
        cache: a KVCache from `allocate_cache`; the new keys and values are appended to it.
        prefix_len: a prefix LM's prompt length (an int, or (B,) per row): the tokens below it see each other both
            ways, those after it only what came before them (Raffel et al. 2020, 3.2.3). None: causal throughout.
        document_ids: (B, T) the document of each position of a packed row: none attends across documents (with
            position_ids restarting at each; `data/packing.py`).
        return_logits: with labels, False computes the loss along `loss_path` (`layers/output_loss.py`; by default
            chunk by chunk, no (B, T, V) logits kept) and returns logits=None.
        """
        hidden, attentions = self.stack(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            prefix_len=prefix_len,
            document_ids=document_ids,
            need_weights=need_weights,
        )
        logits, loss = lm_logits_and_loss(self.lm_head, hidden, labels, self.label_smoothing, return_logits,
                                          self.loss_path)
        return ModelOutput(logits=logits, loss=loss, attentions=attentions if need_weights else None, cache=cache)

    def allocate_cache(
        self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None, device=None, static: bool = False,
        rolling: bool = True,
    ) -> KVCache:
        """A preallocated cache for `batch_size` sequences of up to `max_len` positions; `static` for a compiled
        decoding step (`StaticKVCache`); `rolling=False` keeps every position of sliding-window layers too (the mask
        hides what the window hides), so that the cache can be rewound (`KVCache.rewind`)."""
        return allocate_cache_for(self.stack, batch_size, max_len, dtype=dtype, device=device, static=static,
                                  rolling=rolling)


class DecoderTokenClassifier(nn.Module):
    """Token classification on a causal stack (GPT2ForTokenClassification, LlamaForTokenClassification): a label per
    position from the tokens up to it; labels of -100 carry no loss."""

    def __init__(self, *, stack: TransformerStack, classifier: nn.Linear, dropout: float = 0.0,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.stack = stack
        self.dropout = nn.Dropout(dropout)
        self.classifier = classifier
        self.label_smoothing = label_smoothing

    def forward(
        self, input_ids: Tensor, *, attention_mask: Tensor | None = None, labels: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits (B, T, n_classes); loss when labels (B, T) are given."""
        hidden, attentions = self.stack(input_ids, attention_mask=attention_mask, need_weights=need_weights)
        logits = self.classifier(self.dropout(hidden))  # (B, T, n_classes)
        loss = cross_entropy(logits, labels, label_smoothing=self.label_smoothing) if labels is not None else None
        return ModelOutput(logits=logits, loss=loss, attentions=attentions if need_weights else None)


class DecoderSequenceClassifier(nn.Module):
    """A score per sequence from a causal stack, read at its last real token, the one that has seen them all (Hugging
    Face's GPT2ForSequenceClassification and LlamaForSequenceClassification, whose head is `score`). With one output
    it is a reward model (Ouyang et al. 2022; Touvron et al. 2023, sec. 3.2.2: the language model's next-token head
    replaced by a scalar one), which `attnkit.tasks.reward` trains on preference pairs."""

    def __init__(self, *, stack: TransformerStack, classifier: nn.Linear) -> None:
        super().__init__()
        self.stack = stack
        self.classifier = classifier

    def forward(self, input_ids: Tensor, *, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                need_weights: bool = False) -> ModelOutput:
        """input_ids (B, T) -> logits (B, n_classes), read at each row's last real token.

        attention_mask: (B, T) 1 at real tokens, 0 at padding, before them (left-padded rows) or after them
            (right-padded); None: every position is real. The padding is masked out of attention and, by default,
            each row's real tokens are at positions 0, 1, ... (`positions_from_mask`), so a row's score is the one it
            has alone whichever side it is padded on, as Hugging Face's head reads the last non-padding token.
        position_ids: (B, T) to give other positions than those."""
        if attention_mask is not None and position_ids is None:
            position_ids = positions_from_mask(attention_mask)
        hidden, attentions = self.stack(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                        need_weights=need_weights)  # (B, T, C)
        if attention_mask is None:
            pooled = hidden[:, -1]  # (B, T, C) -> (B, C)
        else:  # the last column holding a real token; a gather, not len(): the batch stays dynamic in `--to-onnx`
            columns = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
            last = (columns * (attention_mask != 0)).argmax(dim=1)  # (B,)
            pooled = hidden.gather(1, last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1)  # (B, C)
        return ModelOutput(logits=self.classifier(pooled), attentions=attentions if need_weights else None)


def positions_from_mask(mask: Tensor) -> Tensor:
    """(B, L) bool -> (B, L) positions: 0, 1, 2, ... over each row's real tokens, 0 at left padding: the positions a
    left-padded row's tokens have alone (`generate/decoder.py` decodes such rows)."""
    return (mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def lm_logits_and_loss(
    lm_head: nn.Linear, hidden: Tensor, labels: Tensor | None, label_smoothing: float, return_logits: bool,
    path: LossPath,
) -> tuple[Tensor | None, Tensor | None]:
    """Project hidden (B, T, C) to logits (B, T, V) and, given labels, the loss; along `path` (`layers/output_loss.py`)
    when logits are not wanted and the head is a plain linear layer (a LoRA-wrapped head adds its adapter's update,
    which the weight lacks)."""
    if labels is not None and not return_logits and type(lm_head) is nn.Linear and lm_head.bias is None:
        check_labels(labels, hidden.shape[:-1], lm_head.out_features)
        return None, linear_cross_entropy(hidden, lm_head.weight, labels, path=path, label_smoothing=label_smoothing)
    logits = lm_head(hidden)  # (B, T, V)
    loss = cross_entropy(logits, labels, label_smoothing=label_smoothing) if labels is not None else None
    return logits, loss


def allocate_cache_for(
    stack: TransformerStack, batch_size: int, max_len: int, *, dtype=None, device=None, static: bool = False,
    rolling: bool = True,
) -> KVCache:
    attention = stack.blocks[0].self_attn
    reference = stack.embeddings.token.weight  # the activations' dtype and device
    return (StaticKVCache if static else KVCache).allocate(
        n_layers=len(stack.blocks),
        batch_size=batch_size,
        n_kv_heads=attention.n_kv_heads,
        head_dim=attention.head_dim,
        max_len=max_len,
        dtype=dtype or reference.dtype,
        device=device or reference.device,
        windows=[block.self_attn.window for block in stack.blocks] if rolling else None,
    )
