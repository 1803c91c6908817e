"""Blocks and the encoder-decoder against PyTorch's own Transformer (Vaswani et al. 2017, as `torch.nn` builds it):
`nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer` (with and without biases) and the whole `nn.Transformer`,
post-norm and `norm_first`, ReLU and GELU, with padded sources and a causal target; and attention against
`F.scaled_dot_product_attention` with grouped heads. The same weights go into both; the outputs must agree."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnkit import ModelConfig, build_model
from attnkit.layers.attention import Attention
from attnkit.layers.masks import AttentionMask

# torch's encoder runs padded batches as nested tensors and says so; the outputs are what is compared
pytestmark = pytest.mark.filterwarnings("ignore:.*nested tensor:UserWarning")

WIDTH, HEADS, FF = 32, 4, 48
TOLERANCE = dict(atol=1e-5, rtol=1e-5)


def _model(norm_position: str, activation: str, **overrides):
    config = ModelConfig(family="encoder-decoder", vocab_size=40, d_model=WIDTH, n_heads=HEADS, d_ff=FF,
                         n_layers=2, max_seq_len=16, position="sinusoidal", norm_position=norm_position,
                         activation=activation, **overrides)
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():  # norm gains and every bias away from 1 and 0, so a misplaced one shows
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3)
    return model


@torch.no_grad()
def _copy_attention(ours: Attention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.out_proj.weight.copy_(ours.o_proj.weight)
    if theirs.in_proj_bias is not None:  # built with bias=False: neither side has any
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.bias.copy_(ours.o_proj.bias)


@torch.no_grad()
def _copy_block(ours: nn.Module, theirs: nn.Module) -> None:
    """Our block's weights into a torch encoder or decoder layer (norm1: self-attention's, norm2: cross-attention's
    in a decoder layer, the feed-forward's in an encoder layer, norm3: the decoder layer's feed-forward)."""
    _copy_attention(ours.self_attn, theirs.self_attn)
    norms = [ours.attn_norm, ours.mlp_norm]
    if ours.cross_attn is not None:
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
        norms = [ours.attn_norm, ours.cross_attn_norm, ours.mlp_norm]
    for index, norm in enumerate(norms, start=1):
        getattr(theirs, f"norm{index}").load_state_dict(norm.state_dict())
    theirs.linear1.load_state_dict(ours.mlp.up_proj.state_dict())
    theirs.linear2.load_state_dict(ours.mlp.down_proj.state_dict())


def _inputs(seed: int = 1):
    """Sources (2, 7, C) with the second padded after 4 tokens, targets (2, 5, C), and that padding (True: real)."""
    generator = torch.Generator().manual_seed(seed)
    real = torch.ones(2, 7, dtype=torch.bool)
    real[1, 4:] = False
    return torch.randn(2, 7, WIDTH, generator=generator), torch.randn(2, 5, WIDTH, generator=generator), real


LAYER_CASES = [("post", "relu"), ("post", "gelu"), ("pre", "relu"), ("pre", "gelu")]


def _torch_layer(layer_class: type[nn.Module], norm_position: str, activation: str, bias: bool) -> nn.Module:
    """torch's encoder or decoder layer of the blocks' sizes, without dropout, pre-norm where ours is, and without
    biases in its linear layers and norms where ours has none (`bias=False`)."""
    return layer_class(WIDTH, HEADS, dim_feedforward=FF, dropout=0.0, activation=activation, batch_first=True,
                       norm_first=norm_position == "pre", bias=bias).eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("norm_position", "activation"), LAYER_CASES)
def test_encoder_block_matches_torch_encoder_layer(norm_position, activation, bias):
    block = _model(norm_position, activation, bias=bias).encoder.blocks[0]
    reference = _torch_layer(nn.TransformerEncoderLayer, norm_position, activation, bias)
    _copy_block(block, reference)
    x, _, real = _inputs()
    with torch.no_grad():
        ours, _ = block(x, mask=AttentionMask(7, attention_mask=real))
        theirs = reference(x, src_key_padding_mask=~real)
    torch.testing.assert_close(ours[real], theirs[real], **TOLERANCE)  # padded rows: torch's fast path zeroes them


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("norm_position", "activation"), LAYER_CASES)
def test_decoder_block_matches_torch_decoder_layer(norm_position, activation, bias):
    block = _model(norm_position, activation, bias=bias).decoder.blocks[0]
    reference = _torch_layer(nn.TransformerDecoderLayer, norm_position, activation, bias)
    _copy_block(block, reference)
    memory, y, real = _inputs()
    with torch.no_grad():
        ours, _ = block(y, mask=AttentionMask(5, causal=True), context=memory,
                        cross_mask=AttentionMask(5, attention_mask=real))
        theirs = reference(y, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5), tgt_is_causal=True,
                           memory_key_padding_mask=~real)
    torch.testing.assert_close(ours, theirs, **TOLERANCE)


@pytest.mark.parametrize(("norm_position", "activation"), [("post", "relu"), ("pre", "gelu")])
def test_encoder_decoder_matches_torch_transformer(norm_position, activation):
    """The whole model: our embeddings (token x sqrt(C) + sinusoid) feed `nn.Transformer` (2 encoder layers, 3
    decoder layers, a final norm after each stack, as it always has), and our output layer reads its output."""
    model = _model(norm_position, activation, n_decoder_layers=3, final_norm=True, scale_embeddings=True)
    reference = nn.Transformer(WIDTH, HEADS, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=FF,
                               dropout=0.0, activation=activation, batch_first=True,
                               norm_first=norm_position == "pre").eval()
    for ours, theirs in ((model.encoder, reference.encoder), (model.decoder, reference.decoder)):
        for block, layer in zip(ours.blocks, theirs.layers, strict=True):
            _copy_block(block, layer)
        theirs.norm.load_state_dict(ours.final_norm.state_dict())
    generator = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(0, 40, (2, 7), generator=generator), torch.randint(0, 40, (2, 5), generator=generator)
    real = torch.ones(2, 7, dtype=torch.bool)
    real[1, 4:] = False
    with torch.no_grad():
        ours = model(src, tgt, src_mask=real).logits
        embedded_src = model.encoder.embeddings(src, torch.arange(7)[None], None)  # (B, S, C)
        embedded_tgt = model.decoder.embeddings(tgt, torch.arange(5)[None], None)  # (B, T, C)
        hidden = reference(embedded_src, embedded_tgt, src_key_padding_mask=~real, memory_key_padding_mask=~real,
                           tgt_mask=nn.Transformer.generate_square_subsequent_mask(5), tgt_is_causal=True)
        theirs = model.lm_head(hidden)
    torch.testing.assert_close(ours, theirs, **TOLERANCE)


@settings(max_examples=12, deadline=None)
@given(n_kv_heads=st.sampled_from([4, 2, 1]), length=st.integers(1, 9), causal=st.booleans(),
       padded=st.integers(0, 3), seed=st.integers(0, 100))
def test_attention_matches_scaled_dot_product_attention(n_kv_heads, length, causal, padded, seed):
    """Grouped-query attention with a causal mask and left padding equals torch's SDPA given the same projections,
    the boolean mask and `enable_gqa` (every query of a padded row sees at least itself, as ours do)."""
    torch.manual_seed(seed)
    attention = Attention(WIDTH, HEADS, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(2, length, WIDTH)
    real = torch.ones(2, length, dtype=torch.bool)
    real[1, : min(padded, length - 1)] = False
    visible = real[:, None, None, :].expand(2, 1, length, length)  # (B, 1, T, S)
    if causal:
        visible = visible & torch.ones(length, length, dtype=torch.bool).tril()
    visible = visible | torch.eye(length, dtype=torch.bool)  # a padded query sees itself (its row is never read)
    head_dim = WIDTH // HEADS
    q = attention.q_proj(x).view(2, length, HEADS, head_dim).transpose(1, 2)  # (B, H, T, D)
    k = attention.k_proj(x).view(2, length, n_kv_heads, head_dim).transpose(1, 2)  # (B, Hkv, T, D)
    v = attention.v_proj(x).view(2, length, n_kv_heads, head_dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)  # (B, H, T, D)
    expected = attention.o_proj(out.transpose(1, 2).reshape(2, length, WIDTH))
    mask = AttentionMask(length, causal=causal, attention_mask=real)
    with torch.no_grad():
        for need_weights in (False, True):  # the fused path and the reference path
            got, _ = attention(x, mask=mask, need_weights=need_weights)
            torch.testing.assert_close(got[real], expected[real].detach(), **TOLERANCE)
