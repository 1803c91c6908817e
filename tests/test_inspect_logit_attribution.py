"""Direct logit attribution's known answer: with the final norm's scale frozen, every writer's share (the embeddings,
each head, each attention bias, each FFN, the biases) sums to the model's own logit difference, on every family
whose logit is linear in its stream; a layer's neurons sum to its FFN's share; the models where no such sum exists
are refused with the reason."""

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.errors import InputError
from attnkit.inspect import trace, zero_ablate
from attnkit.inspect.logit_attribution import logit_attribution
from attnkit.models import build_model
from attnkit.models.recurrent import recurrent_seq2seq

VOCAB = 30
FAMILIES = {
    "decoder": dict(family="decoder"),
    "llama-style decoder": dict(family="decoder", norm="rms", activation="swiglu", position="rope", n_kv_heads=1),
    "decoder tagger": dict(family="decoder", decoder_head="tag", n_classes=5),
    "masked LM": dict(family="encoder", encoder_head="mlm"),
    "classifier (cls)": dict(family="encoder", encoder_head="classify", n_classes=3),
    "classifier (mean)": dict(family="encoder", encoder_head="classify", n_classes=3, pooling="mean"),
    "encoder tagger": dict(family="encoder", encoder_head="tag", n_classes=5),
    "encoder-decoder": dict(family="encoder-decoder"),
}


def _model(**fields):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=24, max_seq_len=16, n_layers=2, **fields)
    model = build_model(config).eval()
    with torch.no_grad():  # biases and gains away from their initial 0 and 1, so that each term is tested
        for name, parameter in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_the_shares_sum_to_the_logit_difference(kind):
    fields = FAMILIES[kind]
    model = _model(**fields)
    stack = model.decoder if fields["family"] == "encoder-decoder" else model.stack
    if stack.blocks[0].mlp.down_proj.bias is not None:
        torch.nn.init.zeros_(stack.blocks[0].mlp.down_proj.bias)  # layer 0: the neurons are the whole FFN
    ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    args = (ids, ids[:, :5]) if fields["family"] == "encoder-decoder" else (ids,)
    classes = fields.get("n_classes", VOCAB)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 5:] = False  # a padded row: mean pooling reads the real tokens alone
    kwargs = {"attention_mask": mask} if fields.get("pooling") == "mean" else {}
    found = logit_attribution(model, *args, answer=torch.tensor([1, 2, 0]), wrong=classes - 1, position=3,
                              neurons=True, **kwargs)
    with torch.no_grad():
        logits = model(*args, **kwargs).logits.double()
    at = logits if logits.dim() == 2 else logits[:, 3]  # (B, V)
    expected = at[torch.arange(3), torch.tensor([1, 2, 0])] - at[:, classes - 1]
    torch.testing.assert_close(found.total.double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(found.values.double().sum(0), expected, rtol=0, atol=1e-4)
    assert found.values[found.names.index("embed")].abs().sum() > 0
    prefix = "decoder." if fields["family"] == "encoder-decoder" else ""
    torch.testing.assert_close(found.neurons[f"{prefix}blocks.0.mlp"].sum(1), found[f"{prefix}blocks.0.mlp"],
                               rtol=0, atol=1e-5)
    assert found.neurons[f"{prefix}blocks.1.mlp"].shape == (3, 24)
    sites, table = found.heads()
    assert table.shape == (len(sites), 2)
    if fields["family"] == "encoder-decoder":
        assert "decoder.blocks.1.cross_attn" in sites


def test_the_answer_alone_and_its_share_per_head():
    model = _model(family="decoder")
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    found = logit_attribution(model, ids, answer=4)
    with torch.no_grad():
        expected = model(ids).logits[:, -1, 4]
    torch.testing.assert_close(found.values.sum(0), expected, rtol=0, atol=1e-4)
    # recomputed by hand: the sublayer's output with head 0 zeroed, less o_proj's bias, through the final norm with
    # the scale of the real stream, dotted with the answer's row of the output layer
    read = trace(model, ids, names=["blocks.1.resid_post", "blocks.1.attn.out"],
                 edits={"blocks.1.attn.z": zero_ablate(head=0)})
    attention = model.stack.blocks[1].self_attn
    alone = read["blocks.1.attn.out"][:, -1] - attention.o_proj.bias  # (B, C)
    stream = read["blocks.1.resid_post"][:, -1]
    norm = model.stack.final_norm
    scale = (stream.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    by_hand = ((alone - alone.mean(-1, keepdim=True)) / scale * norm.weight) @ model.lm_head.weight[4]
    torch.testing.assert_close(found["blocks.1.attn head 1"], by_hand.detach(), rtol=0, atol=1e-5)
    assert found.top(3)[0][0] in found.names


@pytest.mark.parametrize("kind", ["decoder", "llama-style decoder", "encoder-decoder"])
def test_the_positions_share_apart_splits_the_embeddings_share(kind):
    model = _model(**FAMILIES[kind])
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    args = (ids, ids[:, :4]) if kind == "encoder-decoder" else (ids,)
    whole = logit_attribution(model, *args, answer=4, wrong=5)
    apart = logit_attribution(model, *args, answer=4, wrong=5, positions=True)
    if kind == "llama-style decoder":  # RoPE rotates queries and keys: the stream holds no positions to split off
        assert apart.names == whole.names
        return
    assert apart.names == ["embed", "pos_embed", *whole.names[1:]]
    assert float(apart["pos_embed"].abs().min()) > 0
    torch.testing.assert_close(apart["embed"] + apart["pos_embed"], whole["embed"], rtol=0, atol=1e-6)
    torch.testing.assert_close(apart.values[2:], whole.values[1:], rtol=0, atol=0)


@pytest.mark.parametrize(("model", "reason"), [
    (lambda: _model(family="decoder", norm_position="post"), "post-norm"),
    (lambda: _model(family="encoder", encoder_head="mlm", mlm_transform=True), "mlm_transform"),
    (lambda: _model(family="encoder", encoder_head="classify", pooler=True), "pooler"),
    (lambda: _model(family="encoder", encoder_head="none"), "no linear output layer"),
    (lambda: recurrent_seq2seq(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, embedding_dim=8, hidden=8,
                               encoder_hidden=8, n_layers=1, cell="gru", attention="bahdanau"), "tanh"),
])
def test_models_whose_logit_is_no_sum_of_writes_are_refused_with_the_reason(model, reason):
    model = model()
    ids = torch.randint(0, VOCAB, (1, 5))
    args = (ids, ids) if hasattr(model, "encode") else (ids,)
    with pytest.raises(InputError, match=reason):
        logit_attribution(model, *args, answer=1, wrong=0)
