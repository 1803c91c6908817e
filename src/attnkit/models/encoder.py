"""Encoder-only models (BERT): a bidirectional stack with a head that classifies texts or positions, a masked-LM
head, or none.

    ids (B, T) -> TransformerStack of EncoderBlocks -> pool (cls | mean) -> pooler? -> classifier (C -> n_classes)
                                                    -> classifier at every position (C -> n_classes)  (tokens)
                                                    -> transform? -> lm_head (C -> V)           (masked LM)
                                                    -> hidden states, pool -> pooler?            (bare encoder)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.layers.feedforward import activation_function
from attnkit.models.output import ModelOutput, cross_entropy
from attnkit.models.stack import TransformerStack


def pool(hidden: Tensor, attention_mask: Tensor | None, how: str) -> Tensor:
    """(B, T, C) -> (B, C): the first real token's state (`cls`: a left-padded row's [CLS] comes after its padding)
    or the mean over real tokens (`mean`); attention_mask (B, T), True at real tokens.

    `cls` departs from BertPooler, which reads position 0, only for left-padded rows; unpadded and right-padded
    rows (attnkit pads encoder batches on the right) read position 0 as it does. A left-padded row reads as it would
    alone only where its positions start at its first real token: with RoPE, ALiBi or Shaw's (offsets alone matter), or,
    with absolute positions (learned, sinusoidal), given position_ids = cumsum(mask) - 1 (`TransformerStack`'s
    position_ids; `transformers`' BertModel takes them too); without them its tokens sit at shifted positions.
    """
    if how == "cls":
        if attention_mask is None:
            return hidden[:, 0]
        first = attention_mask.int().argmax(dim=1)  # (B,): each row's first real position
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]  # (B, C)
    if attention_mask is None:
        return hidden.mean(dim=1)
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


class Pooler(nn.Module):
    """BERT's pooler: `tanh(dense(h))` on the pooled vector, trained with next-sentence prediction. (B, C) -> (B, C)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, pooled: Tensor) -> Tensor:
        return torch.tanh(self.dense(pooled))


class PredictionTransform(nn.Module):
    """BERT's masked-LM head transform: `norm(act(dense(h)))` before the output projection. (…, C) -> (…, C)."""

    def __init__(self, d_model: int, *, activation: str, norm: nn.Module) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = activation_function(activation)
        self.norm = norm

    def forward(self, hidden: Tensor) -> Tensor:
        return self.norm(self.act(self.dense(hidden)))


class _Encoder(nn.Module):
    """The stack and the pooling every encoder model shares; `label_smoothing` spreads that share of each target's
    weight evenly over the classes (or the vocabulary) in the loss (Szegedy et al. 2016)."""

    def __init__(self, *, stack: TransformerStack, pooling: str = "cls", pooler: nn.Module | None = None,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.stack = stack
        self.pooling = pooling
        self.pooler = pooler
        self.label_smoothing = label_smoothing

    def _encode(self, input_ids: Tensor, attention_mask, token_type_ids, need_weights: bool):
        return self.stack(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, need_weights=need_weights
        )

    def _output(self, logits: Tensor, labels: Tensor | None, attentions, hidden: Tensor, need_weights: bool
                ) -> ModelOutput:
        loss = cross_entropy(logits, labels, label_smoothing=self.label_smoothing) if labels is not None else None
        return ModelOutput(
            logits=logits, loss=loss, attentions=attentions if need_weights else None, hidden_states=hidden
        )

    def _pool(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """(B, T, C) -> (B, C): pooled over the real tokens, through the pooler when there is one."""
        pooled = pool(hidden, attention_mask.bool() if attention_mask is not None else None, self.pooling)
        return self.pooler(pooled) if self.pooler is not None else pooled


class _HeadedEncoder(_Encoder):
    """An encoder with a task head: the stack's states go through `head`, and labels give the loss."""

    def head(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """The head's logits from the states (B, T, C)."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T) -> the head's logits; the loss when labels are given (-100: no loss)."""
        hidden, attentions = self._encode(input_ids, attention_mask, token_type_ids, need_weights)
        return self._output(self.head(hidden, attention_mask), labels, attentions, hidden, need_weights)


class EncoderModel(_Encoder):
    """The bare encoder (Hugging Face's BertModel): contextual states of every token and one pooled vector.

    Sentence embeddings read `hidden_states`, pooled as the embedding model was trained (e.g. mean pooling).
    """

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits: the pooled vector (B, C); hidden_states: (B, T, C)."""
        hidden, attentions = self._encode(input_ids, attention_mask, token_type_ids, need_weights)
        return ModelOutput(
            logits=self._pool(hidden, attention_mask),
            attentions=attentions if need_weights else None,
            hidden_states=hidden,
        )


class EncoderClassifier(_HeadedEncoder):
    """Sequence classification: one label per input sequence."""

    def __init__(
        self, *, stack: TransformerStack, classifier: nn.Module, pooling: str = "cls", pooler: nn.Module | None = None,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(stack=stack, pooling=pooling, pooler=pooler, label_smoothing=label_smoothing)
        self.classifier = classifier

    def head(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """(B, T, C) -> logits (B, n_classes) of the pooled sequence; labels (B,)."""
        return self.classifier(self._pool(hidden, attention_mask))


class EncoderMaskedLM(_HeadedEncoder):
    """Masked language modelling: predict the tokens hidden behind [MASK] from both sides."""

    def __init__(self, *, stack: TransformerStack, lm_head: nn.Linear, transform: nn.Module | None = None,
                 label_smoothing: float = 0.0) -> None:
        super().__init__(stack=stack, label_smoothing=label_smoothing)
        self.transform = transform
        self.lm_head = lm_head

    def head(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """(B, T, C) -> logits (B, T, V); labels (B, T) hold original ids at masked places, else -100."""
        return self.lm_head(self.transform(hidden) if self.transform is not None else hidden)


class EncoderTokenClassifier(_HeadedEncoder):
    """Token classification (Hugging Face's BertForTokenClassification): one label per input position, read from
    that position's contextual state; labels of -100 (continuation pieces, padding, CLS/SEP) carry no loss."""

    def __init__(self, *, stack: TransformerStack, classifier: nn.Module, dropout: float = 0.0,
                 label_smoothing: float = 0.0) -> None:
        super().__init__(stack=stack, label_smoothing=label_smoothing)
        self.dropout = nn.Dropout(dropout)
        self.classifier = classifier

    def head(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """(B, T, C) -> logits (B, T, n_classes), one per position; labels (B, T), -100 where there is no label."""
        return self.classifier(self.dropout(hidden))
