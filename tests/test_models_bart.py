"""An encoder-decoder configured as BART (Lewis et al. 2020: post-norm, learned positions, a norm after the
embeddings, GELU, one shared vocabulary and a bias on the output) equals transformers' BartForConditionalGeneration
holding the same weights: the logits of a padded batch, and decoding step by step through both KV caches."""

import pytest
import torch

from attnkit import ModelConfig, build_model

transformers = pytest.importorskip("transformers", reason="the BART comparison needs transformers (dev extra)")

VOCAB, WIDTH, CONTEXT = 40, 32, 16
TOLERANCE = dict(atol=1e-5, rtol=1e-5)
# BART's names for our modules, per block; the rest of each name is the same
BLOCK_NAMES = {"self_attn.o_proj": "self_attn.out_proj", "attn_norm": "self_attn_layer_norm",
               "cross_attn.o_proj": "encoder_attn.out_proj", "cross_attn.q_proj": "encoder_attn.q_proj",
               "cross_attn.k_proj": "encoder_attn.k_proj", "cross_attn.v_proj": "encoder_attn.v_proj",
               "cross_attn_norm": "encoder_attn_layer_norm", "mlp.up_proj": "fc1", "mlp.down_proj": "fc2",
               "mlp_norm": "final_layer_norm"}


def _their_name(ours: str) -> str:
    stack, rest = ours.split(".", 1)
    if rest.startswith("blocks."):
        _, index, module = rest.split(".", 2)
        name, kind = module.rsplit(".", 1)
        return f"model.{stack}.layers.{index}.{BLOCK_NAMES.get(name, name)}.{kind}"
    return {"embeddings.token.weight": "model.shared.weight",
            "embeddings.positions.weight": f"model.{stack}.embed_positions.weight",
            "embeddings.norm.weight": f"model.{stack}.layernorm_embedding.weight",
            "embeddings.norm.bias": f"model.{stack}.layernorm_embedding.bias"}[rest]


@pytest.fixture(scope="module")
def pair():
    """(BART, attnkit model) with the same random weights (std 0.2, norm gains around 1)."""
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=WIDTH, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=CONTEXT,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    torch.manual_seed(0)
    reference = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            parameter.normal_(1.0 if name.endswith(("norm.weight", "layernorm_embedding.weight")) else 0.0, 0.2)
        reference.final_logits_bias.normal_(0.0, 0.2)
    model = build_model(ModelConfig(
        family="encoder-decoder", vocab_size=VOCAB, d_model=WIDTH, n_heads=4, d_ff=48, n_layers=2, max_seq_len=CONTEXT,
        position="learned", norm_position="post", activation="gelu", embedding_norm=True, lm_head_bias=True)).eval()
    theirs = reference.state_dict()
    mapped = {"lm_head.weight": theirs["lm_head.weight"], "lm_head.bias": theirs["final_logits_bias"][0]}
    for name in model.state_dict():
        if not name.startswith("lm_head."):
            mapped[name] = theirs[_their_name(name)]
            if name.endswith("positions.weight"):
                mapped[name] = mapped[name][2:]  # BART's table starts at row 2 (its offset for position 0)
    model.load_state_dict(mapped, strict=True)
    return reference, model


def _batch():
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(3, VOCAB, (2, 9), generator=generator)
    tgt = torch.randint(3, VOCAB, (2, 6), generator=generator)
    src_mask = torch.ones(2, 9, dtype=torch.long)
    src_mask[1, 5:] = 0
    return src, tgt, src_mask


def test_logits_equal_bart(pair):
    reference, model = pair
    src, tgt, src_mask = _batch()
    with torch.no_grad():
        theirs = reference(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        ours = model(src, tgt, src_mask=src_mask.bool()).logits
    torch.testing.assert_close(ours, theirs, **TOLERANCE)


@pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")  # transformers 5 renames it `cache`
def test_cached_decoding_steps_equal_bart_cached_steps(pair):
    reference, model = pair
    src, tgt, src_mask = _batch()
    cache = model.allocate_cache(2, 6)
    with torch.no_grad():
        encoded = reference.get_encoder()(input_ids=src, attention_mask=src_mask)
        memory = model.encode(src, src_mask=src_mask.bool())
        past = None
        for t in range(6):
            theirs = reference(encoder_outputs=encoded, attention_mask=src_mask, decoder_input_ids=tgt[:, t : t + 1],
                               past_key_values=past, use_cache=True)
            past = theirs.past_key_values
            ours = model.decode(tgt[:, t : t + 1], memory, src_mask=src_mask.bool(), cache=cache).logits
            torch.testing.assert_close(ours, theirs.logits, **TOLERANCE)
