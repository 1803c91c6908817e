"""Encoder-only models (BERT): a bidirectional stack with a classification or masked-LM head.

    ids (B, T) -> TransformerStack of EncoderBlocks -> pool (cls | mean) -> classifier (C -> n_classes)
                                                    -> lm_head (C -> V)            (masked LM)
"""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.models.output import ModelOutput, cross_entropy
from attnkit.models.stack import TransformerStack


def pool(hidden: Tensor, mask: Tensor | None, how: str) -> Tensor:
    """(B, T, C) -> (B, C): the first token's state (`cls`) or the mean over real tokens (`mean`)."""
    if how == "cls":
        return hidden[:, 0]
    if mask is None:
        return hidden.mean(dim=1)
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


class EncoderClassifier(nn.Module):
    """Sequence classification: one label per input sequence."""

    family = "encoder"

    def __init__(self, *, stack: TransformerStack, classifier: nn.Module, pooling: str = "cls") -> None:
        super().__init__()
        self.stack = stack
        self.classifier = classifier
        self.pooling = pooling

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits (B, n_classes); loss when labels (B,) are given."""
        hidden, attentions = self.stack(input_ids, attention_mask=attention_mask, need_weights=need_weights)
        mask = attention_mask.bool() if attention_mask is not None else None
        logits = self.classifier(pool(hidden, mask, self.pooling))  # (B, n_classes)
        loss = cross_entropy(logits, labels) if labels is not None else None
        return ModelOutput(logits=logits, loss=loss, attentions=attentions if need_weights else None)


class EncoderMaskedLM(nn.Module):
    """Masked language modelling: predict the tokens hidden behind [MASK] from both sides."""

    family = "encoder"

    def __init__(self, *, stack: TransformerStack, lm_head: nn.Linear) -> None:
        super().__init__()
        self.stack = stack
        self.lm_head = lm_head

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits (B, T, V); labels (B, T) hold original ids at masked places, else -100."""
        hidden, attentions = self.stack(input_ids, attention_mask=attention_mask, need_weights=need_weights)
        logits = self.lm_head(hidden)  # (B, T, V)
        loss = cross_entropy(logits, labels) if labels is not None else None
        return ModelOutput(logits=logits, loss=loss, attentions=attentions if need_weights else None)
