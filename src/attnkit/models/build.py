"""`build_model(config)`: the one place a `ModelConfig` becomes modules."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit.blocks import DecoderBlock, EncoderBlock
from attnkit.config import ModelConfig
from attnkit.layers.attention import Attention
from attnkit.layers.embedding import Embeddings
from attnkit.layers.feedforward import make_feedforward
from attnkit.layers.norms import make_norm
from attnkit.layers.positions import LearnedPositions, RelativePositions, RotaryEmbedding, SinusoidalPositions
from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderClassifier, EncoderMaskedLM, EncoderModel, Pooler, PredictionTransform
from attnkit.models.seq2seq import EncoderDecoder
from attnkit.models.stack import TransformerStack


def build_model(config: ModelConfig) -> nn.Module:
    """Build the model a config describes, with initialised weights (on the current default device)."""
    if config.family == "decoder":
        stack = _stack(config, config.vocab_size, config.n_layers, decoder=True)
        lm_head = _lm_head(config, stack, config.vocab_size)
        model: nn.Module = DecoderLM(stack=stack, lm_head=lm_head, label_smoothing=config.label_smoothing)
    elif config.family == "encoder":
        stack = _stack(config, config.vocab_size, config.n_layers, decoder=False)
        pooler = Pooler(config.d_model) if config.pooler else None
        if config.encoder_head == "classify":
            classifier = nn.Linear(config.d_model, config.n_classes)
            model = EncoderClassifier(stack=stack, classifier=classifier, pooling=config.pooling, pooler=pooler)
        elif config.encoder_head == "none":
            model = EncoderModel(stack=stack, pooling=config.pooling, pooler=pooler)
        else:
            transform = (
                PredictionTransform(config.d_model, activation=config.activation, norm=_norm(config))
                if config.mlm_transform else None
            )
            lm_head = _lm_head(config, stack, config.vocab_size)
            model = EncoderMaskedLM(stack=stack, lm_head=lm_head, transform=transform)
    else:
        encoder = _stack(config, config.vocab_size, config.n_layers, decoder=False)
        decoder = _stack(config, config.target_vocab_size, config.decoder_layers, decoder=True, cross=True)
        if config.tie_embeddings and config.tgt_vocab_size is None:  # one shared vocabulary: one table
            decoder.embeddings.token.weight = encoder.embeddings.token.weight
        lm_head = _lm_head(config, decoder, config.target_vocab_size)
        model = EncoderDecoder(
            encoder=encoder, decoder=decoder, lm_head=lm_head, label_smoothing=config.label_smoothing
        )
    _init_weights(model, config)
    return model


def count_parameters(config: ModelConfig) -> int:
    """Number of distinct parameters (tied ones once), counted on the meta device without allocating."""
    with torch.device("meta"):
        model = build_model(config)
    return sum(p.numel() for p in model.parameters())


def _attention(config: ModelConfig, *, relative: bool) -> Attention:
    return Attention(
        config.d_model,
        config.n_heads,
        n_kv_heads=config.kv_heads,
        head_dim=config.head_size,
        score=config.score,
        bias=config.bias,
        dropout=config.attention_dropout,
        additive_dim=config.additive_dim,
        relative=RelativePositions(config.relative_max_distance, config.head_size) if relative else None,
    )


def _norm(config: ModelConfig) -> nn.Module:
    return make_norm(config.norm, config.d_model, eps=config.norm_eps, bias=config.bias)


def _block(config: ModelConfig, *, decoder: bool, cross: bool) -> nn.Module:
    parts = dict(
        self_attn=_attention(config, relative=config.position == "relative"),
        attn_norm=_norm(config),
        mlp=make_feedforward(config.activation, config.d_model, config.d_ff, bias=config.bias, dropout=config.dropout),
        mlp_norm=_norm(config),
        norm_position=config.norm_position,
        dropout=config.dropout,
    )
    if cross:
        parts.update(cross_attn=_attention(config, relative=False), cross_attn_norm=_norm(config))
    return DecoderBlock(**parts) if decoder else EncoderBlock(**parts)


def _stack(config: ModelConfig, vocab_size: int, n_layers: int, *, decoder: bool, cross: bool = False):
    absolute: nn.Module | None = None
    if config.position == "sinusoidal":
        absolute = SinusoidalPositions(config.d_model, layout=config.sinusoidal_layout)
    elif config.position == "learned":
        absolute = LearnedPositions(config.max_seq_len, config.d_model)
    embeddings = Embeddings(
        vocab_size,
        config.d_model,
        positions=absolute,
        max_positions=config.max_seq_len if config.position == "learned" else None,
        scale=config.scale_embeddings,
        dropout=config.dropout,
        type_vocab_size=config.type_vocab_size,
        norm=_norm(config) if config.embedding_norm else None,
    )
    rotary = RotaryEmbedding(config.head_size, theta=config.rope_theta) if config.position == "rope" else None
    return TransformerStack(
        embeddings=embeddings,
        blocks=[_block(config, decoder=decoder, cross=cross) for _ in range(n_layers)],
        final_norm=_norm(config) if config.use_final_norm else None,
        rotary=rotary,
    )


def _lm_head(config: ModelConfig, stack: TransformerStack, vocab_size: int) -> nn.Linear:
    head = nn.Linear(config.d_model, vocab_size, bias=config.lm_head_bias)
    if config.tie_embeddings:
        head.weight = stack.embeddings.token.weight
    return head


def _init_weights(model: nn.Module, config: ModelConfig) -> None:
    """GPT-2's scheme: N(0, 0.02) weights, zero biases, residual output projections scaled by 1/sqrt(2 N)."""
    if next(model.parameters()).is_meta:
        return
    n_residual = 2 * (config.n_layers + (config.decoder_layers if config.family == "encoder-decoder" else 0))
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(n_residual) if name.endswith(("o_proj", "down_proj")) else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, (LearnedPositions, RelativePositions)):
            for parameter in module.parameters():
                nn.init.normal_(parameter, mean=0.0, std=0.02)
