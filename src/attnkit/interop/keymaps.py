"""Hugging Face checkpoint layouts as plain data: one table per model family.

A `Rule` pairs an attnkit name with a Hugging Face name. Names are module or tensor paths; `{i}` stands for a layer
index, and a rule naming a module covers every tensor under it (`.weight`, `.bias`). Where the two layouts differ:

    layout "conv1d"   GPT-2's Conv1D stores a Linear weight transposed, (in, out) instead of (out, in)
    layout "row"      a bias kept as a (1, V) buffer (Marian's final_logits_bias) instead of (V,)
    part (k, n)       the k-th of n equal slices of a fused tensor along the output dimension (GPT-2's c_attn
                      holds q, k and v)
    when (field, v)   on save, use this rule only when the attnkit config has `field == v` (Marian writes its
                      embedding table as `model.shared` when source and target share one vocabulary)

Reading applies every rule whose Hugging Face name matches; a tensor two rules map to the same attnkit name (a tied
copy) must hold the same values. Writing uses the first rule that matches each attnkit tensor.

`config_fields` copy config values both ways (Hugging Face field -> ModelConfig field); `hf_defaults` are the values
`transformers` assumes when a config.json omits a field; `hf_fixed` must hold in config.json (and is written);
`ours_fixed` is what the family always is in attnkit terms. The few values that need arithmetic (GPT-2's `n_inner`,
Llama's RoPE parameters, Marian's two vocabularies, BERT's labels) live in `attnkit.interop.hf_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Rule(NamedTuple):
    ours: str
    theirs: str
    layout: str = "same"  # "same" | "conv1d" | "row"
    part: tuple[int, int] | None = None
    when: tuple[str, Any] | None = None


@dataclass(frozen=True)
class FamilyMap:
    model_type: str
    architectures: dict[str, dict[str, Any]]  # Hugging Face class -> the ModelConfig fields it implies
    base_prefix: str  # the prefix that a bare base model's own checkpoint omits ("transformer.", "bert.")
    bare_architectures: tuple[str, ...]  # classes saved without `base_prefix`
    config_fields: dict[str, str]
    hf_defaults: dict[str, Any]
    hf_fixed: dict[str, Any]
    ours_fixed: dict[str, Any]
    tensors: tuple[Rule, ...]
    ignored: tuple[str, ...] = ()  # buffers recomputed at load time (causal masks, rotary tables, position ids)
    ignored_by_architecture: tuple[tuple[str, tuple[str, ...]], ...] = ()  # tensors a class drops when it loads
    zero_if_missing: tuple[str, ...] = ()  # Hugging Face tensors that default to zeros when a checkpoint omits them
    special_ids: tuple[str, ...] = ("bos_token_id", "eos_token_id", "pad_token_id")  # token ids config.json carries
    special_id_fallbacks: tuple[tuple[str, str], ...] = ()  # (id, the id that stands in for it when unknown)


# Hugging Face `hidden_act` / `activation_function` values -> attnkit `activation`, and back.
ACTIVATIONS_FROM_HF = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


GPT2 = FamilyMap(
    model_type="gpt2",
    architectures={"GPT2LMHeadModel": {}, "GPT2Model": {}},
    base_prefix="transformer.",
    bare_architectures=("GPT2Model",),
    config_fields={
        "vocab_size": "vocab_size",
        "n_embd": "d_model",
        "n_layer": "n_layers",
        "n_head": "n_heads",
        "n_positions": "max_seq_len",
        "layer_norm_epsilon": "norm_eps",
        "resid_pdrop": "dropout",
        "attn_pdrop": "attention_dropout",
        "activation_function": "activation",
        "tie_word_embeddings": "tie_embeddings",
    },
    hf_defaults={
        "vocab_size": 50257,
        "n_positions": 1024,
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "activation_function": "gelu_new",
        "tie_word_embeddings": True,
    },
    hf_fixed={"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
    ours_fixed={
        "family": "decoder", "position": "learned", "norm": "layer", "norm_position": "pre", "bias": True,
        "score": "scaled_dot", "final_norm": True,
    },
    tensors=(
        Rule("stack.embeddings.token", "transformer.wte"),
        Rule("stack.embeddings.positions", "transformer.wpe"),
        Rule("stack.blocks.{i}.attn_norm", "transformer.h.{i}.ln_1"),
        Rule("stack.blocks.{i}.self_attn.q_proj", "transformer.h.{i}.attn.c_attn", "conv1d", (0, 3)),
        Rule("stack.blocks.{i}.self_attn.k_proj", "transformer.h.{i}.attn.c_attn", "conv1d", (1, 3)),
        Rule("stack.blocks.{i}.self_attn.v_proj", "transformer.h.{i}.attn.c_attn", "conv1d", (2, 3)),
        Rule("stack.blocks.{i}.self_attn.o_proj", "transformer.h.{i}.attn.c_proj", "conv1d"),
        Rule("stack.blocks.{i}.mlp_norm", "transformer.h.{i}.ln_2"),
        Rule("stack.blocks.{i}.mlp.up_proj", "transformer.h.{i}.mlp.c_fc", "conv1d"),
        Rule("stack.blocks.{i}.mlp.down_proj", "transformer.h.{i}.mlp.c_proj", "conv1d"),
        Rule("stack.final_norm", "transformer.ln_f"),
        Rule("lm_head", "lm_head"),
    ),
    ignored=("transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias"),
)

LLAMA = FamilyMap(
    model_type="llama",
    architectures={"LlamaForCausalLM": {}, "LlamaModel": {}},
    base_prefix="model.",
    bare_architectures=("LlamaModel",),
    config_fields={
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "head_dim": "head_dim",
        "intermediate_size": "d_ff",
        "max_position_embeddings": "max_seq_len",
        "rms_norm_eps": "norm_eps",
        "attention_dropout": "attention_dropout",
        "attention_bias": "bias",
        "tie_word_embeddings": "tie_embeddings",
    },
    hf_defaults={
        "vocab_size": 32000,
        "num_key_value_heads": None,
        "head_dim": None,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
    },
    hf_fixed={"hidden_act": "silu"},
    ours_fixed={
        "family": "decoder", "position": "rope", "norm": "rms", "norm_position": "pre", "activation": "swiglu",
        "score": "scaled_dot", "dropout": 0.0, "final_norm": True,
    },
    tensors=(
        Rule("stack.embeddings.token", "model.embed_tokens"),
        Rule("stack.blocks.{i}.attn_norm", "model.layers.{i}.input_layernorm"),
        Rule("stack.blocks.{i}.self_attn", "model.layers.{i}.self_attn"),  # q_proj k_proj v_proj o_proj
        Rule("stack.blocks.{i}.mlp_norm", "model.layers.{i}.post_attention_layernorm"),
        Rule("stack.blocks.{i}.mlp", "model.layers.{i}.mlp"),  # gate_proj up_proj down_proj
        Rule("stack.final_norm", "model.norm"),
        Rule("lm_head", "lm_head"),
    ),
    ignored=("model.layers.{i}.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq"),
)

BERT = FamilyMap(
    model_type="bert",
    architectures={
        "BertModel": {"encoder_head": "none"},
        "BertForSequenceClassification": {"encoder_head": "classify"},
        "BertForMaskedLM": {"encoder_head": "mlm", "mlm_transform": True, "lm_head_bias": True},
    },
    base_prefix="bert.",
    bare_architectures=("BertModel",),
    config_fields={
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "intermediate_size": "d_ff",
        "max_position_embeddings": "max_seq_len",
        "layer_norm_eps": "norm_eps",
        "hidden_dropout_prob": "dropout",
        "attention_probs_dropout_prob": "attention_dropout",
        "type_vocab_size": "type_vocab_size",
        "hidden_act": "activation",
        "tie_word_embeddings": "tie_embeddings",
    },
    hf_defaults={
        "vocab_size": 30522,
        "max_position_embeddings": 512,
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "type_vocab_size": 2,
        "hidden_act": "gelu",
        "tie_word_embeddings": True,
    },
    hf_fixed={"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False},
    ours_fixed={
        "family": "encoder", "position": "learned", "norm": "layer", "norm_position": "post", "bias": True,
        "score": "scaled_dot", "embedding_norm": True, "pooling": "cls", "final_norm": False,
    },
    tensors=(
        Rule("stack.embeddings.token", "bert.embeddings.word_embeddings"),
        Rule("stack.embeddings.positions", "bert.embeddings.position_embeddings"),
        Rule("stack.embeddings.token_types", "bert.embeddings.token_type_embeddings"),
        Rule("stack.embeddings.norm", "bert.embeddings.LayerNorm"),
        Rule("stack.blocks.{i}.self_attn.q_proj", "bert.encoder.layer.{i}.attention.self.query"),
        Rule("stack.blocks.{i}.self_attn.k_proj", "bert.encoder.layer.{i}.attention.self.key"),
        Rule("stack.blocks.{i}.self_attn.v_proj", "bert.encoder.layer.{i}.attention.self.value"),
        Rule("stack.blocks.{i}.self_attn.o_proj", "bert.encoder.layer.{i}.attention.output.dense"),
        Rule("stack.blocks.{i}.attn_norm", "bert.encoder.layer.{i}.attention.output.LayerNorm"),
        Rule("stack.blocks.{i}.mlp.up_proj", "bert.encoder.layer.{i}.intermediate.dense"),
        Rule("stack.blocks.{i}.mlp.down_proj", "bert.encoder.layer.{i}.output.dense"),
        Rule("stack.blocks.{i}.mlp_norm", "bert.encoder.layer.{i}.output.LayerNorm"),
        Rule("pooler", "bert.pooler"),
        Rule("classifier", "classifier"),
        Rule("transform.dense", "cls.predictions.transform.dense"),
        Rule("transform.norm", "cls.predictions.transform.LayerNorm"),
        Rule("lm_head.bias", "cls.predictions.bias"),
        Rule("lm_head.bias", "cls.predictions.decoder.bias"),
        Rule("lm_head.weight", "cls.predictions.decoder.weight"),
    ),
    ignored=("bert.embeddings.position_ids",),
    # BertForPreTraining checkpoints (bert-base-uncased) also hold the pooler and the next-sentence head, which
    # BertForMaskedLM leaves out as well.
    ignored_by_architecture=(("BertForMaskedLM", ("bert.pooler", "cls.seq_relationship")),),
    special_ids=("pad_token_id",),
)


_MARIAN_PROJECTIONS = (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("o_proj", "out_proj"))


def _marian_layer(stack: str) -> tuple[Rule, ...]:
    """One Marian encoder or decoder layer; the decoder's adds cross-attention (`encoder_attn`)."""
    ours, theirs = f"{stack}.blocks.{{i}}", f"model.{stack}.layers.{{i}}"
    attention = [("self_attn", "self_attn")] + ([("cross_attn", "encoder_attn")] if stack == "decoder" else [])
    rules = []
    for our_attn, their_attn in attention:
        for proj, their_proj in _MARIAN_PROJECTIONS:
            rules.append(Rule(f"{ours}.{our_attn}.{proj}", f"{theirs}.{their_attn}.{their_proj}"))
    rules += [
        Rule(f"{ours}.attn_norm", f"{theirs}.self_attn_layer_norm"),
        Rule(f"{ours}.mlp.up_proj", f"{theirs}.fc1"),
        Rule(f"{ours}.mlp.down_proj", f"{theirs}.fc2"),
        Rule(f"{ours}.mlp_norm", f"{theirs}.final_layer_norm"),
    ]
    if stack == "decoder":
        rules.append(Rule(f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm"))
    return tuple(rules)


MARIAN = FamilyMap(
    model_type="marian",
    architectures={"MarianMTModel": {}},
    base_prefix="model.",
    bare_architectures=(),
    config_fields={
        "vocab_size": "vocab_size",
        "d_model": "d_model",
        "encoder_layers": "n_layers",
        "decoder_layers": "n_decoder_layers",
        "encoder_attention_heads": "n_heads",
        "encoder_ffn_dim": "d_ff",
        "max_position_embeddings": "max_seq_len",
        "dropout": "dropout",
        "attention_dropout": "attention_dropout",
        "scale_embedding": "scale_embeddings",
        "activation_function": "activation",
        "tie_word_embeddings": "tie_embeddings",
    },
    hf_defaults={
        "vocab_size": 58101,
        "max_position_embeddings": 1024,
        "dropout": 0.1,
        "attention_dropout": 0.0,
        "scale_embedding": False,
        "activation_function": "gelu",
        "tie_word_embeddings": True,
    },
    hf_fixed={},
    ours_fixed={
        "family": "encoder-decoder", "position": "sinusoidal", "sinusoidal_layout": "halves", "norm": "layer",
        "norm_position": "post", "norm_eps": 1e-5, "bias": True, "score": "scaled_dot", "lm_head_bias": True,
        "final_norm": False,
    },
    tensors=(
        Rule("encoder.embeddings.token", "model.shared", when=("tgt_vocab_size", None)),
        Rule("encoder.embeddings.token", "model.encoder.embed_tokens"),
        Rule("decoder.embeddings.token", "model.decoder.embed_tokens"),
        *_marian_layer("encoder"),
        *_marian_layer("decoder"),
        Rule("lm_head.bias", "final_logits_bias", "row"),
        Rule("lm_head.weight", "lm_head.weight"),
    ),
    ignored=("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"),
    zero_if_missing=("final_logits_bias",),
    special_ids=("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_eos_token_id"),
    special_id_fallbacks=(("decoder_start_token_id", "pad_token_id"), ("forced_eos_token_id", "eos_token_id")),
)

FAMILIES: dict[str, FamilyMap] = {family.model_type: family for family in (GPT2, LLAMA, BERT, MARIAN)}
