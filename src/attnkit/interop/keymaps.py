"""The Hugging Face architectures attnkit converts: one registry entry (`FamilyMap`) per model family.

Each entry is the one place that says everything about its family: its config.json fields both ways, its weight
names, the few values that need arithmetic, and its bare class (no task head). The classes with a task's head
(GPT2LMHeadModel, BertForTokenClassification, ...) are declared by the task's registration (`TaskSpec.
hf_architectures`, `attnkit.tasks.HFClass`) and listed here under their model_type, each implying its task's head.
Every user-facing list of supported architectures (error messages, `attnkit convert --help`, the docs) is
generated from `FAMILIES` by `supported_text`, `supported_lines` and `supported_table`.

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
`ours_fixed` is what the family always is in attnkit terms. `from_hf` and `to_hf` add the values that need more than
a rename (GPT-2's `n_inner`, RoPE parameters, Marian's two vocabularies, BERT's labels); `attnkit.interop.hf_config`
drives them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from attnkit.config import ModelConfig, head_output
from attnkit.errors import ConfigError
from attnkit.readback import FileFields
from attnkit.tasks import task_of_config, tasks

HF_CONFIG_FIX = "write the field as transformers does (save_pretrained), or convert a model whose config.json has it so"


class Rule(NamedTuple):
    ours: str
    theirs: str
    layout: str = "same"  # "same" | "conv1d" | "row"
    part: tuple[int, int] | None = None
    when: tuple[str, Any] | None = None


# from_hf(config.json, the ModelConfig fields read so far, architecture, Hugging Face tensor names, source for
# messages) -> more ModelConfig fields; to_hf(config, labels) -> more config.json fields.
FromHF = Callable[[dict[str, Any], dict[str, Any], str, set[str], str], dict[str, Any]]
ToHF = Callable[[ModelConfig, Sequence[str] | None], dict[str, Any]]


@dataclass(frozen=True)
class FamilyMap:
    model_type: str
    name: str  # as people write it, for messages and docs ("GPT-2")
    own_architectures: dict[str, dict[str, Any]]  # classes no task declares (bare models) -> the fields they imply
    default_architecture: str  # the class a config.json that names none describes
    base_prefix: str  # the prefix that a bare base model's own checkpoint omits ("transformer.", "bert.")
    bare_architectures: tuple[str, ...]  # classes saved without `base_prefix`
    config_fields: dict[str, str]
    hf_defaults: dict[str, Any]
    hf_fixed: dict[str, Any]
    ours_fixed: dict[str, Any]
    tensors: tuple[Rule, ...]
    summary: str  # what a checkpoint of the family sets, for the docs' table
    from_hf: FromHF
    to_hf: ToHF
    ignored: tuple[str, ...] = ()  # buffers recomputed at load time (causal masks, rotary tables, position ids)
    zero_if_missing: tuple[str, ...] = ()  # Hugging Face tensors that default to zeros when a checkpoint omits them
    # (Hugging Face tensor, config.json field): a table of `field` rows the Hugging Face class always reads
    # (BertEmbeddings adds token_type_embeddings(token_type_ids=0) to every input; a table of no rows crashes it). A
    # model without one (field 0) is written with one row of zeros (field 1), adding nothing; one row of zeros reads
    # back as none.
    zero_row_tables: tuple[tuple[str, str], ...] = ()
    special_ids: tuple[str, ...] = ("bos_token_id", "eos_token_id", "pad_token_id")  # token ids config.json carries
    special_id_fallbacks: tuple[tuple[str, str], ...] = ()  # (id, the id that stands in for it when unknown)

    @property
    def architectures(self) -> dict[str, dict[str, Any]]:
        """Hugging Face class -> the ModelConfig fields it implies: the registered tasks' classes of this model_type
        (their head and their own fields), in the tasks' order, then the family's own."""
        family = self.ours_fixed["family"]
        declared = {c.name: {**spec.head_of(family), **c.fields} for spec in tasks() for c in spec.hf_architectures
                    if c.model_type == self.model_type}
        return {**declared, **self.own_architectures}

    def dropped(self, architecture: str) -> tuple[str, ...]:
        """The tensors of a checkpoint that `architecture` leaves out when it loads (its task's declaration)."""
        return next((c.drops for spec in tasks() for c in spec.hf_architectures if c.name == architecture), ())


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


# GPT-2 ----------------------------------------------------------------------------------------------------------
def _labels_from_hf(hf, fields, source) -> dict[str, Any]:
    """n_classes from config.json's label names (a head without classes leaves the field inert). A sequence
    classifier must be a single-label one, as attnkit's classify head is (softmax over two or more labels, the
    likeliest read as the answer): a regression head (one output, `problem_type` 'regression', as `transformers`
    trains any one-label classifier: cross-encoders' relevance scores) or a multi-label one (a sigmoid per label)
    would load and read as a class, and is refused."""
    labels = hf.get("id2label")
    n_classes = len(labels) if labels else int(hf.get("num_labels", 2))
    head = fields.get("encoder_head", fields.get("decoder_head"))
    problem = hf.get("problem_type")
    output = None if head is None else head_output(fields["family"], head)  # "sequence": one answer per text
    if output == "sequence" and (n_classes == 1 or problem not in (None, "single_label_classification")):
        raise ConfigError(
            f"{source}: problem_type={problem!r} with {n_classes} label(s) is a classifier attnkit does not read: a "
            f"regression head (one label) gives a score and a multi-label head a sigmoid per label, where attnkit's "
            f"classify head picks one of two or more labels by softmax, so their outputs would read as a class; "
            f"attnkit converts single-label classifiers (problem_type 'single_label_classification' or unset, two "
            f"labels or more): run this one with transformers")
    return {"n_classes": n_classes}


def _labels_to_hf(config, labels) -> dict[str, Any]:
    """id2label and label2id for the head of a task that learns labels (classify, tag); nothing for others."""
    task = task_of_config(config)
    if task is None or not task.labelled:
        return {}
    names = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(config.n_classes)]
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def _gpt2_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    d_ff = hf.get("n_inner") or 4 * fields["d_model"]  # n_inner None: GPT-2's 4 C
    return {"d_ff": d_ff, **_labels_from_hf(hf, fields, source)}


def _gpt2_to_hf(config, labels) -> dict[str, Any]:
    return {"n_inner": config.d_ff, **_labels_to_hf(config, labels)}


GPT2 = FamilyMap(
    model_type="gpt2",
    name="GPT-2",
    own_architectures={"GPT2Model": {}},
    default_architecture="GPT2LMHeadModel",
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
        Rule("classifier", "classifier"),
    ),
    summary="learned positions, pre-norm, `gelu_tanh`; Conv1D weights transposed, fused `c_attn` split into q/k/v",
    from_hf=_gpt2_from_hf,
    to_hf=_gpt2_to_hf,
    ignored=("transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias"),
)


# Llama and Mistral ----------------------------------------------------------------------------------------------
def _rope_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    """rope_theta, from `rope_parameters` (transformers 5) or the top level; RoPE scaling in either `rope_parameters`
    or `rope_scaling` is refused (attnkit implements plain RoPE), never dropped for the other's default."""
    checked = FileFields(hf, source, fix=HF_CONFIG_FIX, error=ConfigError)
    thetas = {}
    for name in ("rope_parameters", "rope_scaling"):
        rope = checked.mapping(name, default=None)
        if rope is None:
            continue
        rope_type = rope.string("rope_type", default=None) or rope.string("type", default="default")
        if rope_type != "default":
            raise ConfigError(f"{source}: {name}: RoPE scaling {rope_type!r} is not supported; attnkit implements "
                              "plain RoPE (rope_type 'default', Su et al. 2021): convert a model without RoPE scaling")
        if "rope_theta" in rope:
            thetas[f"{name}.rope_theta"] = rope.number("rope_theta", positive=True)
    if "rope_theta" in checked:
        thetas["rope_theta"] = checked.number("rope_theta", positive=True)
    if len(set(thetas.values())) > 1:
        given = ", ".join(f"{name}={value!r}" for name, value in thetas.items())
        raise ConfigError(f"{source} gives RoPE two bases ({given}); keep one of them")
    return {"rope_theta": float(next(iter(thetas.values()), 10000.0))}


def _rope_to_hf(config, labels) -> dict[str, Any]:
    return {"rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "rope_theta": config.rope_theta}


def _llama_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    if hf.get("mlp_bias", False) != fields["bias"]:
        raise ConfigError(
            f"{source}: attention_bias={fields['bias']} but mlp_bias={hf.get('mlp_bias')}; attnkit's `bias` switches "
            f"the biases of attention and feed-forward together"
        )
    return {**_rope_from_hf(hf, fields, architecture, names, source), **_labels_from_hf(hf, fields, source)}


def _llama_to_hf(config, labels) -> dict[str, Any]:
    return {**_rope_to_hf(config, labels), "mlp_bias": config.bias, **_labels_to_hf(config, labels)}


_LLAMA_FIELDS = {
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
    "tie_word_embeddings": "tie_embeddings",
}
_LLAMA_FIXED = {
    "family": "decoder", "position": "rope", "norm": "rms", "norm_position": "pre", "activation": "swiglu",
    "score": "scaled_dot", "dropout": 0.0, "final_norm": True,
}
_LLAMA_TENSORS = (
    Rule("stack.embeddings.token", "model.embed_tokens"),
    Rule("stack.blocks.{i}.attn_norm", "model.layers.{i}.input_layernorm"),
    Rule("stack.blocks.{i}.self_attn", "model.layers.{i}.self_attn"),  # q_proj k_proj v_proj o_proj
    Rule("stack.blocks.{i}.mlp_norm", "model.layers.{i}.post_attention_layernorm"),
    Rule("stack.blocks.{i}.mlp", "model.layers.{i}.mlp"),  # gate_proj up_proj down_proj
    Rule("stack.final_norm", "model.norm"),
    Rule("lm_head", "lm_head"),
    Rule("classifier", "score"),  # a Llama classifier head's (LlamaFor...Classification)
)
_LLAMA_IGNORED = ("model.layers.{i}.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq")

LLAMA = FamilyMap(
    model_type="llama",
    name="Llama",
    own_architectures={"LlamaModel": {}},
    default_architecture="LlamaForCausalLM",
    base_prefix="model.",
    bare_architectures=("LlamaModel",),
    config_fields={**_LLAMA_FIELDS, "attention_bias": "bias"},
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
    ours_fixed=_LLAMA_FIXED,
    tensors=_LLAMA_TENSORS,
    summary="RoPE (`rope_theta`, rotate-half layout), RMSNorm eps, SwiGLU, grouped-query heads, tied or untied "
            "output",
    from_hf=_llama_from_hf,
    to_hf=_llama_to_hf,
    ignored=_LLAMA_IGNORED,
)

def _mistral_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    """A sliding_window longer than max_position_embeddings hides no key within the context: attention to every key
    (attnkit refuses a window longer than max_seq_len, which would change nothing). Compared only when both are
    integers: any other value is left for ModelConfig's type check to name."""
    window, context = fields.get("attention_window"), fields["max_seq_len"]
    fields_read = _rope_from_hf(hf, fields, architecture, names, source)
    sizes = all(isinstance(v, int) and not isinstance(v, bool) for v in (window, context))
    if sizes and window > context:
        fields_read["attention_window"] = None
    return fields_read


# Mistral is Llama without biases plus sliding-window attention: `sliding_window` is attnkit's
# `attention_window` (a query sees its last W keys, itself included), on every layer.
MISTRAL = FamilyMap(
    model_type="mistral",
    name="Mistral",
    own_architectures={"MistralModel": {}},
    default_architecture="MistralForCausalLM",
    base_prefix="model.",
    bare_architectures=("MistralModel",),
    config_fields={**_LLAMA_FIELDS, "sliding_window": "attention_window"},
    hf_defaults={
        "vocab_size": 32000,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 4096 * 32,
        "rms_norm_eps": 1e-6,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
    },
    hf_fixed={"hidden_act": "silu"},
    ours_fixed={**_LLAMA_FIXED, "bias": False, "global_every": 0},
    tensors=_LLAMA_TENSORS,
    summary="as Llama, without biases, plus `sliding_window` as `attention_window` (each query sees its last W "
            "keys; null, or longer than the context: all)",
    from_hf=_mistral_from_hf,
    to_hf=_rope_to_hf,
    ignored=_LLAMA_IGNORED,
)


# BERT -----------------------------------------------------------------------------------------------------------
def _bert_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    if "pooler" not in fields:  # BertModel(add_pooling_layer=False) leaves no trace but its tensors
        return {"pooler": "bert.pooler.dense.weight" in names}
    return _labels_from_hf(hf, fields, source)


def _bert_to_hf(config, labels) -> dict[str, Any]:
    return _labels_to_hf(config, labels)


BERT = FamilyMap(
    model_type="bert",
    name="BERT",
    own_architectures={"BertModel": {"encoder_head": "none"}},
    default_architecture="BertModel",
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
    summary="post-norm, exact GELU, `type_vocab_size`, `embedding_norm`, `pooler`; a classifier's labels "
            "(`labels.json`) from `id2label`; the masked LM's `mlm_transform` (dense, GELU, LayerNorm) and output "
            "bias. Pre-training checkpoints (bert-base-uncased) load as the masked LM, without their pooler and "
            "next-sentence head",
    from_hf=_bert_from_hf,
    to_hf=_bert_to_hf,
    ignored=("bert.embeddings.position_ids",),
    zero_row_tables=(("bert.embeddings.token_type_embeddings.weight", "type_vocab_size"),),
    special_ids=("pad_token_id",),
)


# Marian ---------------------------------------------------------------------------------------------------------
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


def _marian_from_hf(hf, fields, architecture, names, source) -> dict[str, Any]:
    for decoder_field, encoder_field in (("decoder_attention_heads", "encoder_attention_heads"),
                                         ("decoder_ffn_dim", "encoder_ffn_dim")):
        if hf.get(decoder_field, hf.get(encoder_field)) != hf.get(encoder_field):
            raise ConfigError(
                f"{source}: {decoder_field}={hf.get(decoder_field)} differs from {encoder_field}="
                f"{hf.get(encoder_field)}; attnkit's encoder and decoder share n_heads and d_ff"
            )
    target_vocab = hf.get("decoder_vocab_size") or fields["vocab_size"]
    if hf.get("share_encoder_decoder_embeddings", True):
        if target_vocab != fields["vocab_size"]:
            raise ConfigError(
                f"{source}: share_encoder_decoder_embeddings is set but decoder_vocab_size={target_vocab} differs "
                f"from vocab_size={fields['vocab_size']}"
            )
        return {"tgt_vocab_size": None}
    return {"tgt_vocab_size": target_vocab}


def _marian_to_hf(config, labels) -> dict[str, Any]:
    return {
        "decoder_attention_heads": config.n_heads,
        "decoder_ffn_dim": config.d_ff,
        "decoder_vocab_size": config.target_vocab_size,
        "share_encoder_decoder_embeddings": config.tgt_vocab_size is None,
        "is_encoder_decoder": True,
    }


MARIAN = FamilyMap(
    model_type="marian",
    name="Marian",
    own_architectures={},
    default_architecture="MarianMTModel",
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
    summary="sinusoids in halves (`sinusoidal_layout=\"halves\"`), `silu`, `scale_embeddings`, `lm_head_bias` "
            "(final_logits_bias), shared or separate vocabularies",
    from_hf=_marian_from_hf,
    to_hf=_marian_to_hf,
    ignored=("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"),
    zero_if_missing=("final_logits_bias",),
    special_ids=("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_eos_token_id"),
    special_id_fallbacks=(("decoder_start_token_id", "pad_token_id"), ("forced_eos_token_id", "eos_token_id")),
)


# The registry, in the order a model is tried when it is written (the first family that holds it exactly) --------
FAMILIES: dict[str, FamilyMap] = {family.model_type: family for family in (GPT2, LLAMA, MISTRAL, BERT, MARIAN)}


def architecture_names() -> list[str]:
    """Every Hugging Face class attnkit reads and writes, in the registry's order."""
    return [architecture for family in FAMILIES.values() for architecture in family.architectures]


def _head(fields: dict[str, Any]) -> str:
    return f" (head {fields['encoder_head']})" if "encoder_head" in fields else ""


def supported_text() -> str:
    """The registry in one line, for messages: `gpt2: GPT2LMHeadModel, GPT2Model; llama: ...` (model_type: classes)."""
    return "; ".join(f"{family.model_type}: {', '.join(family.architectures)}" for family in FAMILIES.values())


def supported_lines(indent: str = "  ") -> str:
    """The registry one family a line, for `--help` texts: `  GPT-2     gpt2: GPT2LMHeadModel, GPT2Model`."""
    width = max(len(family.name) for family in FAMILIES.values())
    return "\n".join(
        f"{indent}{family.name:<{width}}  {family.model_type}: "
        + ", ".join(f"{architecture}{_head(fields)}" for architecture, fields in family.architectures.items())
        for family in FAMILIES.values()
    )


def supported_table() -> str:
    """The registry as a markdown table, for the docs: family, classes with their heads, what a checkpoint sets."""
    lines = ["| family (`model_type`) | Hugging Face classes | attnkit model | what the checkpoint sets |",
             "| --- | --- | --- | --- |"]
    for family in FAMILIES.values():
        classes = ", ".join(f"`{architecture}`{_head(fields)}" for architecture, fields in family.architectures.items())
        lines.append(f"| {family.name} (`{family.model_type}`) | {classes} | {family.ours_fixed['family']} | "
                     f"{family.summary} |")
    return "\n".join(lines) + "\n"
