"""BertForMeanPooledSequenceClassification: BERT whose classifier reads the mean of the real tokens' final states
(sentence-transformers' mean pooling, Reimers & Gurevych 2019), not BERT's pooled [CLS] token.

attnkit does not import this file: `attnkit convert RUN --to-hf` copies it beside the weights of a mean-pooled
classifier, whose config.json names it in `auto_map`, and `transformers` runs it:

    AutoModelForSequenceClassification.from_pretrained("exported/classifier", trust_remote_code=True)

transformers' own BertForSequenceClassification classifies `tanh(dense(h_CLS))`; a model trained on the mean of its
tokens has nothing there, so this class keeps BERT's body and weight names (`bert.*`, `classifier.*`) and changes
only the pooling.
"""

import torch
from torch import nn
from transformers import BertModel, BertPreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput


class BertForMeanPooledSequenceClassification(BertPreTrainedModel):
    """BertModel without its pooler, the mean over real tokens, dropout, a linear classifier."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        """input_ids (B, T) -> logits (B, num_labels); the cross-entropy loss when labels (B,) are given."""
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           **kwargs).last_hidden_state  # (B, T, C)
        if attention_mask is None:
            attention_mask = torch.ones(hidden.shape[:2], device=hidden.device)
        weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1), 1 at real tokens
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # (B, C)
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)
