"""A mean-pooled BERT encoder (the fine-tune guide's recipe: `--init-from` all-MiniLM-L6-v2 with `pooling=mean` and
`pooler=false`) in the layouts Hugging Face's libraries load, as data; `attnkit.interop.hf.save` writes them.

    DIR/                          sentence-transformers: SentenceTransformer(DIR).encode(texts) gives attnkit's
                                  pooled vectors (the mean of the real tokens' final states, not normalised)
      modules.json                  0: Transformer (this folder), 1: Pooling (1_Pooling/)
      sentence_bert_config.json     max_seq_length: the model's max_seq_len, where attnkit cuts a text
      1_Pooling/config.json         mean over the real tokens
      config.json, model.safetensors, tokenizer.json, tokenizer_config.json    the body, a BertModel
    DIR/classifier/               a classifier's head with its body, for transformers:
                                  AutoModelForSequenceClassification.from_pretrained(DIR/classifier,
                                  trust_remote_code=True) gives attnkit's logits
      config.json                   BERT's, with id2label and `auto_map` naming the class below
      model.safetensors             bert.* and classifier.*, BertForSequenceClassification's names
      hf_mean_pooled_bert.py        the class: BERT's body, the mean of the real tokens, the classifier

Hugging Face's BertForSequenceClassification classifies BERT's pooled [CLS] token (`tanh(dense(h_CLS))`); a model
trained on the mean of its tokens has no form there, so the classifier comes with its own class
(`attnkit.interop.hf_mean_pooled_bert`). The files are written in the classic sentence-transformers layout
(`sentence_transformers.models.*`), which versions 2 to 6 read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnkit.config import EncoderConfig, ModelConfig, head_output

CLASSIFIER_DIR = "classifier"
REMOTE_CODE = Path(__file__).with_name("hf_mean_pooled_bert.py")  # copied beside the classifier's weights
CLASSIFIER_CLASS = "BertForMeanPooledSequenceClassification"
POOLING_DIR = "1_Pooling"


def mean_pooled_body(config: ModelConfig) -> EncoderConfig | None:
    """The body of a mean-pooled encoder without a pooler (a classifier or a bare encoder) as the BertModel that
    holds it (`pooling` is BERT's `cls`: the body's states are the same, sentence-transformers pools them); None for
    any other model."""
    if not isinstance(config, EncoderConfig) or config.pooling != "mean" or config.pooler:
        return None
    if head_output(config.family, config.encoder_head) not in ("sequence", "none"):  # a label per text, or states
        return None
    return dataclasses.replace(config, encoder_head="none", pooling="cls")


def has_classifier(config: ModelConfig) -> bool:
    """Whether a mean-pooled encoder also gets its classifier written (`CLASSIFIER_DIR`)."""
    return isinstance(config, EncoderConfig) and head_output(config.family, config.encoder_head) == "sequence"


def sentence_transformers_files(config: EncoderConfig) -> dict[str, Any]:
    """The sentence-transformers files of a mean-pooled encoder: relative path -> JSON value."""
    return {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"},
        ],
        "sentence_bert_config.json": {"max_seq_length": config.max_seq_len, "do_lower_case": False},
        f"{POOLING_DIR}/config.json": {
            "word_embedding_dimension": config.d_model, "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    }


def classifier_fields() -> dict[str, Any]:
    """The classifier's config.json fields beyond BERT's: its class, and where transformers finds it."""
    return {"architectures": [CLASSIFIER_CLASS],
            "auto_map": {"AutoModelForSequenceClassification": f"{REMOTE_CODE.stem}.{CLASSIFIER_CLASS}"}}
