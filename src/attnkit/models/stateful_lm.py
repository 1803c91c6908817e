"""What the language models without a KV cache share (the recurrent, the convolutional and the feed-forward LMs):
a body that carries a decoding state of its own, `stack(input_ids, attention_mask=, position_ids=, cache=) ->
(hidden (B, T, C), state)`, called as a decoder's `TransformerStack` is, then the output layer. Their forward,
said once."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from attnkit.deprecation import renamed_keywords
from attnkit.layers.output_loss import LossPath
from attnkit.models.decoder import lm_logits_and_loss
from attnkit.models.output import ModelOutput


class StatefulLM(nn.Module):
    """A subclass sets `embedding` (V, E), `lm_head` (-> V), `label_smoothing` and `loss_path` in its constructor and
    defines `stack` (its docstring says what the mask and the state mean there)."""

    embedding: nn.Embedding
    lm_head: nn.Linear
    label_smoothing: float
    loss_path: LossPath  # without logits: how the loss is computed (the training plan's choice)

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

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
