"""Tiny random Hugging Face models for the interop tests, built locally with `transformers` (nothing downloaded).

Every parameter (biases, norm weights and Marian's final_logits_bias included) is redrawn at std 0.2 (norm gains
around 1), so a tensor loaded into the wrong place, or left at its initial value, changes the logits. Models are
written with `save_pretrained` (safetensors) and the reference is always the model `transformers` reads back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers", reason="the interop tests compare against transformers (dev extra)")

VOCAB = 99
PAD = 0
TAGS = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]  # the token classifiers' labels


def mistral_config(*, sliding_window: int | None):
    """A tiny MistralConfig: grouped-query heads (4 query, 2 key/value), each query sees its last `sliding_window`
    keys (None: all)."""
    return transformers.MistralConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500.0,
        sliding_window=sliding_window, bos_token_id=1, eos_token_id=2, pad_token_id=PAD)


def _configs():
    t = transformers
    return {
        "gpt2": (t.GPT2LMHeadModel, t.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2,
            pad_token_id=PAD)),
        "llama": (t.LlamaForCausalLM, t.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            vocab_size=VOCAB, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500.0,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=PAD)),
        "gpt2-tagger": (t.GPT2ForTokenClassification, t.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2,
            pad_token_id=PAD, id2label=dict(enumerate(TAGS)), label2id={tag: i for i, tag in enumerate(TAGS)})),
        "llama-tagger": (t.LlamaForTokenClassification, t.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            vocab_size=VOCAB, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500.0, bos_token_id=1,
            eos_token_id=2, pad_token_id=PAD, id2label=dict(enumerate(TAGS)),
            label2id={tag: i for i, tag in enumerate(TAGS)})),
        "llama-tied": (t.LlamaForCausalLM, t.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=1, intermediate_size=48,
            vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
            pad_token_id=PAD)),
        # Mistral: Llama without biases plus a sliding window, here wider than every sequence of the shared tests
        # (tests/test_interop_mistral.py builds narrower windows with mistral_config)
        "mistral": (t.MistralForCausalLM, mistral_config(sliding_window=32)),
        "bert": (t.BertModel, t.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=64, type_vocab_size=2, pad_token_id=PAD)),
        "bert-classifier": (t.BertForSequenceClassification, t.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=64, id2label={0: "negative", 1: "neutral", 2: "positive"},
            label2id={"negative": 0, "neutral": 1, "positive": 2}, pad_token_id=PAD)),
        "bert-tagger": (t.BertForTokenClassification, t.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=64, id2label=dict(enumerate(TAGS)), label2id={tag: i for i, tag in enumerate(TAGS)},
            pad_token_id=PAD)),
        "bert-mlm": (t.BertForMaskedLM, t.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=64, pad_token_id=PAD)),
        "marian": (t.MarianMTModel, t.MarianConfig(
            encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
            activation_function="swish", scale_embedding=True, pad_token_id=PAD, eos_token_id=2,
            decoder_start_token_id=PAD, forced_eos_token_id=2)),
        "marian-two-vocabularies": (t.MarianMTModel, t.MarianConfig(
            encoder_layers=1, decoder_layers=2, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, decoder_vocab_size=77,
            share_encoder_decoder_embeddings=False, max_position_embeddings=64, activation_function="relu",
            pad_token_id=PAD, eos_token_id=2, decoder_start_token_id=PAD, forced_eos_token_id=2)),
    }


FAMILIES = ("gpt2", "gpt2-tagger", "llama", "llama-tagger", "llama-tied", "mistral", "bert", "bert-classifier",
            "bert-tagger", "bert-mlm", "marian", "marian-two-vocabularies")


def hf_model(name: str, directory: Path, *, seed: int = 0, config=None):
    """Build, randomise and save the tiny model `name` (with `config` in place of its own when given); return the
    reference `transformers` reads back (eval)."""
    cls, own = _configs()[name]
    config = config if config is not None else own
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "embed_positions" not in param_name:  # Marian's sinusoid is recomputed, never saved
                param.normal_(0.0, 0.2)
            if param.dim() == 1 and param_name.endswith("weight"):  # norm gains around 1 keep the logits O(1)
                param.add_(1.0)
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("final_logits_bias"):
                buffer.normal_(0.0, 0.2)
    model.save_pretrained(directory)
    return cls.from_pretrained(directory).eval()


def batch(seed: int, *, size: int = 3, length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, T) and their mask: the first row full, the others shorter (padding = PAD)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (size, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, size):
        real = max(2, length - 2 * row - seed % 3)
        mask[row, real:] = 0
    return ids.masked_fill(mask == 0, PAD), mask


def word_tokenizer(directory: Path) -> None:
    """Write a word-level `tokenizer.json` matching the tiny models' vocabulary (<pad>=0, <s>=1, </s>=2, <unk>=3,
    then w4 .. w98) and the tokenizer_config.json that names its special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + [f"w{i}" for i in range(len(specials), VOCAB)])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "bos_token": "<s>",
                "eos_token": "</s>", "unk_token": "<unk>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
