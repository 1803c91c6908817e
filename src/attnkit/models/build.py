"""The Transformer families' builders: a `DecoderConfig`, `EncoderConfig` or `EncoderDecoderConfig` becomes modules
(registered in `models/families.py`, whose `build_model` calls them)."""

from __future__ import annotations

import math
from typing import TypeVar

from torch import nn

from attnkit.blocks import DecoderBlock, EncoderBlock
from attnkit.config import DecoderConfig, EncoderConfig, EncoderDecoderConfig, TransformerConfig, head_output
from attnkit.layers.attention import Attention
from attnkit.layers.embedding import Embeddings
from attnkit.layers.feedforward import make_feedforward
from attnkit.layers.norms import make_norm
from attnkit.layers.positions import PositionScheme, make_positions
from attnkit.models.decoder import DecoderLM, DecoderSequenceClassifier, DecoderTokenClassifier
from attnkit.models.encoder import (
    EncoderClassifier,
    EncoderMaskedLM,
    EncoderModel,
    EncoderTokenClassifier,
    Pooler,
    PredictionTransform,
)
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.models.stack import TransformerStack

M = TypeVar("M", bound=nn.Module)


def build_decoder(config: DecoderConfig) -> DecoderLM | DecoderTokenClassifier | DecoderSequenceClassifier:
    """A decoder-only language model (GPT-2, Llama), a token classifier, or a scorer of sequences (a reward model):
    what `decoder_head` outputs (`attnkit.config.HEADS`), initialised."""
    stack = _stack(config, config.vocab_size, config.n_layers, decoder=True)
    return _init_weights(_DECODER_HEADS[head_output("decoder", config.decoder_head)](config, stack), config)


def _decoder_lm(config: DecoderConfig, stack: TransformerStack) -> DecoderLM:
    return DecoderLM(stack=stack, lm_head=_lm_head(config, stack, config.vocab_size),
                     label_smoothing=config.label_smoothing)


def _decoder_token_classifier(config: DecoderConfig, stack: TransformerStack) -> DecoderTokenClassifier:
    return DecoderTokenClassifier(stack=stack, classifier=nn.Linear(config.d_model, config.n_classes),
                                  dropout=config.dropout, label_smoothing=config.label_smoothing)


def _decoder_sequence_classifier(config: DecoderConfig, stack: TransformerStack) -> DecoderSequenceClassifier:
    # no bias, as Hugging Face's `score` head: a reward's offset is arbitrary (only differences are learnt)
    return DecoderSequenceClassifier(stack=stack, classifier=nn.Linear(config.d_model, config.n_classes, bias=False))


_DECODER_HEADS = {"token": _decoder_lm, "position": _decoder_token_classifier,  # what the head outputs -> builder
                  "sequence": _decoder_sequence_classifier}


def build_encoder(config: EncoderConfig) -> nn.Module:
    """An encoder (BERT) with the head `encoder_head` names, built by what it outputs (`attnkit.config.HEADS`): a
    classifier of texts or of positions, a masked-LM head, or none; initialised weights."""
    stack = _stack(config, config.vocab_size, config.n_layers, decoder=False)
    return _init_weights(_ENCODER_HEADS[head_output("encoder", config.encoder_head)](config, stack), config)


def _classifier(config: EncoderConfig, stack: TransformerStack) -> EncoderClassifier:
    return EncoderClassifier(stack=stack, classifier=nn.Linear(config.d_model, config.n_classes),
                             pooling=config.pooling, pooler=_pooler(config), label_smoothing=config.label_smoothing)


def _token_classifier(config: EncoderConfig, stack: TransformerStack) -> EncoderTokenClassifier:
    return EncoderTokenClassifier(stack=stack, classifier=nn.Linear(config.d_model, config.n_classes),
                                  dropout=config.dropout, label_smoothing=config.label_smoothing)


def _masked_lm(config: EncoderConfig, stack: TransformerStack) -> EncoderMaskedLM:
    transform = (
        PredictionTransform(config.d_model, activation=config.activation, norm=_norm(config))
        if config.mlm_transform else None
    )
    return EncoderMaskedLM(stack=stack, lm_head=_lm_head(config, stack, config.vocab_size), transform=transform,
                           label_smoothing=config.label_smoothing)


def _bare(config: EncoderConfig, stack: TransformerStack) -> EncoderModel:
    return EncoderModel(stack=stack, pooling=config.pooling, pooler=_pooler(config))


def _pooler(config: EncoderConfig) -> Pooler | None:
    return Pooler(config.d_model) if config.pooler else None


_ENCODER_HEADS = {"sequence": _classifier, "position": _token_classifier, "token": _masked_lm, "none": _bare}


def build_encoder_decoder(config: EncoderDecoderConfig) -> EncoderDecoder:
    """An encoder-decoder (Vaswani et al. 2017) with initialised weights."""
    encoder = _stack(config, config.vocab_size, config.n_layers, decoder=False)
    decoder = _stack(config, config.target_vocab_size, config.resolved.n_decoder_layers, decoder=True, cross=True)
    if config.tie_embeddings and config.tgt_vocab_size is None:  # one shared vocabulary: one table
        decoder.embeddings.token.weight = encoder.embeddings.token.weight
    lm_head = _lm_head(config, decoder, config.target_vocab_size)
    model = EncoderDecoder(encoder=encoder, decoder=decoder, lm_head=lm_head, label_smoothing=config.label_smoothing)
    return _init_weights(model, config)


def _positions(config: TransformerConfig) -> PositionScheme:
    return make_positions(
        config.position,
        d_model=config.d_model,
        n_heads=config.n_heads,
        head_dim=config.resolved.head_dim,
        max_seq_len=config.max_seq_len,
        rope_theta=config.rope_theta,
        relative_max_distance=config.relative_max_distance,
        sinusoidal_layout=config.sinusoidal_layout,
    )


def _attention(config: TransformerConfig, *, relative: PositionScheme | None, window: int | None = None) -> Attention:
    return Attention(
        config.d_model,
        config.n_heads,
        n_kv_heads=config.resolved.n_kv_heads,
        head_dim=config.resolved.head_dim,
        score=config.score,
        bias=config.bias,
        dropout=config.attention_dropout,
        additive_dim=config.additive_dim,
        relative=relative,
        window=window,
        softcap=config.attn_softcap,
    )


def _norm(config: TransformerConfig) -> nn.Module:
    return make_norm(config.norm, config.d_model, eps=config.norm_eps, bias=config.bias)


def _block(
    config: TransformerConfig, *, decoder: bool, cross: bool, relative: PositionScheme | None, window: int | None
) -> nn.Module:
    parts = dict(
        self_attn=_attention(config, relative=relative, window=window),
        attn_norm=_norm(config),
        mlp=make_feedforward(config.activation, config.d_model, config.d_ff, bias=config.bias, dropout=config.dropout),
        mlp_norm=_norm(config),
        norm_position=config.norm_position,
        dropout=config.dropout,
    )
    if cross:
        parts.update(cross_attn=_attention(config, relative=None), cross_attn_norm=_norm(config))
    return DecoderBlock(**parts) if decoder else EncoderBlock(**parts)


def _stack(config: TransformerConfig, vocab_size: int, n_layers: int, *, decoder: bool, cross: bool = False):
    positions = _positions(config)  # absolute schemes act in the embeddings, relative ones in each self-attention
    # a scheme without parameters (RoPE, ALiBi) is one instance for every layer, prepared once per forward pass by
    # the stack; one with parameters (Shaw's tables) is a new instance for each layer
    shared = positions.attends and not list(positions.parameters())

    def relative() -> PositionScheme | None:
        return (positions if shared else _positions(config)) if positions.attends else None

    embeddings = Embeddings(
        vocab_size,
        config.d_model,
        positions=positions if positions.embeds else None,
        scale=config.scale_embeddings,
        dropout=config.dropout,
        type_vocab_size=config.type_vocab_size,
        norm=_norm(config) if config.embedding_norm else None,
    )
    return TransformerStack(
        embeddings=embeddings,
        blocks=[_block(config, decoder=decoder, cross=cross, relative=relative(), window=config.window_of(index))
                for index in range(n_layers)],
        final_norm=_norm(config) if config.resolved.final_norm else None,
        positions=positions if shared else None,
    )


def _lm_head(config: TransformerConfig, stack: TransformerStack, vocab_size: int) -> nn.Linear:
    head = nn.Linear(config.d_model, vocab_size, bias=config.lm_head_bias)
    if config.tie_embeddings:
        head.weight = stack.embeddings.token.weight
    return head


def _init_weights(model: M, config: TransformerConfig) -> M:
    """GPT-2's scheme: N(0, 0.02) weights, zero biases, residual output projections scaled by 1/sqrt(2 N)."""
    if next(model.parameters()).is_meta:
        return model
    n_residual = 2 * config.residual_layers
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(n_residual) if name.endswith(("o_proj", "down_proj")) else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, PositionScheme):  # each scheme initialises its own parameters
            module.init_weights()
    return model
