"""The three families: causality, padding, permutation equivariance, KV cache, edge errors (PyTorch parity:
test_torch_parity.py)."""

import math

import pytest
import torch

from attnkit import InputError, ModelConfig, build_model

POSITIONS = ["sinusoidal", "learned", "relative", "rope", "alibi", "none"]


def _config(family="decoder", position="rope", **kw):
    base = dict(family=family, vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32,
                position=position)
    return ModelConfig(**{**base, **kw})


def _model(**kw):
    torch.manual_seed(0)
    return build_model(_config(**kw)).eval()


@pytest.mark.parametrize("position", POSITIONS)
def test_decoder_is_causal(position):
    model = _model(position=position, n_kv_heads=2)
    ids = torch.randint(0, 50, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 50
    logits, logits_changed = model(ids).logits, model(changed).logits
    torch.testing.assert_close(logits[:, :6], logits_changed[:, :6])
    assert not torch.allclose(logits[:, 6:], logits_changed[:, 6:])


@pytest.mark.parametrize("position", POSITIONS)
def test_encoder_decoder_target_side_is_causal(position):
    model = _model(family="encoder-decoder", position=position, norm_position="post")
    src, tgt = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 9))
    changed = tgt.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 50
    torch.testing.assert_close(model(src, tgt).logits[:, :5], model(src, changed).logits[:, :5])


@pytest.mark.parametrize("family", ["encoder", "decoder", "encoder-decoder"])
def test_padding_changes_no_real_output(family):
    model = _model(family=family, position="learned")
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0  # right padding
    other = ids.clone()
    other[0, 5:] = (other[0, 5:] + 7) % 50
    if family == "encoder-decoder":
        tgt = torch.randint(0, 50, (2, 4))
        first = model(ids, tgt, src_mask=mask).logits
        second = model(other, tgt, src_mask=mask).logits
        torch.testing.assert_close(first, second)
        return
    if family == "encoder":
        model = build_model(_config(family="encoder", position="learned", pooling="mean")).eval()
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, model(other, attention_mask=mask).logits)
        return
    first = model(ids, attention_mask=mask).logits
    second = model(other, attention_mask=mask).logits
    torch.testing.assert_close(first[0, :5], second[0, :5])


@pytest.mark.parametrize("head", ["classify", "none"])
@pytest.mark.parametrize(("position", "padded_side"), [("rope", "left"), ("learned", "right")])
def test_cls_pooling_reads_each_rows_first_real_token_however_the_row_is_padded(head, position, padded_side):
    """A left-padded row's [CLS] is its first real token, not position 0 (a pad): what the row is padded with
    changes neither the class logits nor the bare encoder's pooled vector, and the row reads as it does alone. Left
    padding is read so with RoPE (only offsets matter); learned absolute positions are read so on the right, as
    attnkit pads encoder batches (left-padded rows would need position_ids, `encoder.pool`)."""
    model = _model(family="encoder", position=position, encoder_head=head, pooling="cls", pooler=True)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    pads = slice(0, 3) if padded_side == "left" else slice(5, 8)
    mask[1, pads] = 0
    other = ids.clone()
    other[1, pads] = (other[1, pads] + 7) % 50
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        torch.testing.assert_close(model(other, attention_mask=mask).logits, padded)
        torch.testing.assert_close(padded[1], model(ids[1:, mask[1].bool()]).logits[0])
        torch.testing.assert_close(padded[0], model(ids[:1]).logits[0])


def test_multi_query_attention_keeps_one_key_and_value_head_for_every_query_head():
    """MQA (Shazeer 2019): one key/value head serves all H query heads. The projections make one head, the KV cache
    holds one head per layer (1/H of multi-head attention's), and query heads given the same weights attend alike."""
    mqa, mha = _model(n_kv_heads=1), _model()
    attention = mqa.stack.blocks[0].self_attn
    assert attention.k_proj.out_features == attention.v_proj.out_features == attention.head_dim
    cached = [(mqa.allocate_cache(2, 8), 1), (mha.allocate_cache(2, 8), 4)]
    for cache, heads in cached:
        assert [layer.keys.shape for layer in cache.layers] == [(2, heads, 8, attention.head_dim)] * 2
    with torch.no_grad():
        rows = attention.q_proj.weight.view(4, attention.head_dim, -1)  # (H, D, C)
        rows[1:] = rows[0]
        attention.q_proj.bias.view(4, -1)[1:] = attention.q_proj.bias.view(4, -1)[0]
        weights = mqa(torch.randint(0, 50, (2, 6)), need_weights=True).attentions[0]["self"]  # (B, H, T, S)
    for head in range(1, 4):
        torch.testing.assert_close(weights[:, head], weights[:, 0])


def test_encoder_without_positions_is_permutation_equivariant_and_with_positions_is_not():
    ids = torch.randint(0, 50, (1, 9))
    perm = torch.randperm(9)
    plain = _model(family="encoder", position="none", encoder_head="mlm")
    torch.testing.assert_close(plain(ids[:, perm]).logits, plain(ids).logits[:, perm], atol=1e-5, rtol=1e-5)
    for position in ["sinusoidal", "learned", "rope"]:
        positioned = _model(family="encoder", position=position, encoder_head="mlm")
        assert not torch.allclose(positioned(ids[:, perm]).logits, positioned(ids).logits[:, perm], atol=1e-4)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_decoder_kv_cache_equals_full_forward(position, n_kv_heads):
    model = _model(position=position, n_kv_heads=n_kv_heads, dropout=0.0)
    ids = torch.randint(0, 50, (2, 12))
    full = model(ids).logits
    cache = model.allocate_cache(2, 16)
    pieces = [model(ids[:, :5], cache=cache).logits]  # prefill 5 tokens, then one at a time, then a chunk of 3
    for t in range(5, 9):
        pieces.append(model(ids[:, t : t + 1], cache=cache).logits)
    pieces.append(model(ids[:, 9:], cache=cache).logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 12


@pytest.mark.parametrize("position", POSITIONS)
def test_encoder_decoder_kv_cache_equals_full_forward(position):
    model = _model(family="encoder-decoder", position=position, n_decoder_layers=3)
    src, tgt = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 6))
    src_mask = torch.ones(2, 7, dtype=torch.bool)
    src_mask[1, 5:] = False
    full = model(src, tgt, src_mask=src_mask).logits
    memory = model.encode(src, src_mask=src_mask)
    cache = model.allocate_cache(2, 8)
    steps = [model.decode(tgt[:, t : t + 1], memory, src_mask=src_mask, cache=cache).logits for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert all(layer.cross is not None for layer in cache.layers)


def test_attention_weights_are_returned_per_layer():
    model = _model(family="encoder-decoder", position="sinusoidal")
    out = model(torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 4)), need_weights=True)
    assert len(out.attentions) == 2 and out.attentions[0]["self"].shape == (2, 4, 4, 4)
    assert out.attentions[0]["cross"].shape == (2, 4, 4, 5)
    assert out.encoder_attentions[0]["self"].shape == (2, 4, 5, 5)
    torch.testing.assert_close(out.attentions[1]["cross"].sum(-1), torch.ones(2, 4, 4))


def test_loss_ignores_padding_and_supports_label_smoothing():
    model = _model(label_smoothing=0.0)
    ids = torch.randint(0, 50, (2, 6))
    targets = ids.roll(-1, dims=1)
    targets[:, -1] = -100
    loss = model(ids, labels=targets).loss
    logits = model(ids).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), targets[:, :-1].reshape(-1))
    torch.testing.assert_close(loss, expected)
    smoothed = _model(label_smoothing=0.1)(ids, labels=targets).loss
    log_probs = logits[:, :-1].reshape(-1, 50).log_softmax(-1)
    nll = -log_probs.gather(1, targets[:, :-1].reshape(-1, 1)).mean()
    torch.testing.assert_close(smoothed, 0.9 * nll + 0.1 * -log_probs.mean())  # (1-e) NLL + e * uniform CE


@pytest.mark.parametrize("head, n_out", [("classify", 3), ("mlm", 50)])
def test_encoder_heads_smooth_their_labels(head, n_out):
    ids = torch.randint(0, 50, (2, 6))
    labels = torch.tensor([0, 2]) if head == "classify" else torch.where(torch.rand(2, 6) < 0.5, ids, -100)
    labels[..., 0] = 1  # at least one target
    plain = _model(family="encoder", encoder_head=head, n_classes=3)
    smoothed = _model(family="encoder", encoder_head=head, n_classes=3, label_smoothing=0.2)
    log_probs = plain(ids).logits.reshape(-1, n_out).log_softmax(-1)[labels.reshape(-1) != -100]  # (N, n_out)
    nll = -log_probs.gather(1, labels.reshape(-1)[labels.reshape(-1) != -100, None]).mean()
    torch.testing.assert_close(plain(ids, labels=labels).loss, nll)
    torch.testing.assert_close(smoothed(ids, labels=labels).loss, 0.8 * nll + 0.2 * -log_probs.mean())


def test_tied_embeddings_share_one_table():
    model = _model(tie_embeddings=True)
    assert model.lm_head.weight is model.stack.embeddings.token.weight
    untied = _model(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.stack.embeddings.token.weight
    seq2seq = _model(family="encoder-decoder", tie_embeddings=True)
    assert seq2seq.decoder.embeddings.token.weight is seq2seq.encoder.embeddings.token.weight


@pytest.mark.parametrize("score", ["dot", "bilinear", "additive"])
def test_every_score_runs_in_every_family(score):
    for family in ["encoder", "decoder", "encoder-decoder"]:
        model = _model(family=family, score=score, position="sinusoidal")
        ids = torch.randint(0, 50, (2, 5))
        out = model(ids, ids) if family == "encoder-decoder" else model(ids)
        assert torch.isfinite(out.logits).all()


def test_bad_input_at_the_edge_gets_clear_errors():
    model = _model(position="learned")
    with pytest.raises(InputError, match="integer token ids"):
        model(torch.rand(1, 4))
    with pytest.raises(InputError, match="token id 50, outside the vocabulary"):
        model(torch.tensor([[1, 2, 50]]))
    with pytest.raises(InputError, match="token id -1"):
        model(torch.tensor([[1, -1]]))
    with pytest.raises(InputError, match="max_seq_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(InputError, match="batch dimension"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(InputError, match="attention_mask has shape"):
        model(torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 5))
    rope = _model(position="rope")
    assert rope(torch.zeros(1, 40, dtype=torch.long)).logits.shape == (1, 40, 50)  # no table to run past
    seq2seq = _model(family="encoder-decoder")
    with pytest.raises(InputError, match="the target batch has 3 sequences but the source batch 2"):
        seq2seq(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long))
    cache = model.allocate_cache(1, 4)
    with pytest.raises(InputError, match="KV cache holds 4"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)


def test_more_bad_input_at_the_edge_gets_clear_errors():
    """What reached torch as a traceback (an empty batch, positions or labels of the wrong shape, a cache allocated
    for another batch size, an encoder output of another width) or ran silently wrong (an additive float mask read
    as 0/1, where its -10000 at padding became "real"), refused naming the input and the fix."""
    model, rope = _model(position="learned"), _model(position="rope")
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(InputError, match="batch size 0"):
        model(torch.zeros(0, 4, dtype=torch.long))
    with pytest.raises(InputError, match=r"attention_mask holds values other than 0 and 1.*-10000"):
        model(ids, attention_mask=torch.tensor([[0.0, 0.0, -10000.0, -10000.0]] * 2))
    assert model(ids, attention_mask=torch.tensor([[1.0, 1.0, 0.0, 0.0]] * 2)).logits.shape == (2, 4, 50)
    with pytest.raises(InputError, match=r"position_ids has shape \(1, 3\)"):
        rope(ids, position_ids=torch.arange(3)[None])
    with pytest.raises(InputError, match="position -1"):
        rope(ids, position_ids=torch.tensor([[0, 1, 2, -1]] * 2))
    with pytest.raises(InputError, match="allocated for 3 sequences"):
        rope(ids, cache=rope.allocate_cache(3, 8))
    for other in (_model(position="rope", n_kv_heads=1), _model(position="rope", n_layers=3)):  # written silently
        with pytest.raises(InputError, match="allocated for another model"):  # into by broadcasting, or one short
            rope(ids, cache=other.allocate_cache(2, 8))
    with pytest.raises(InputError, match=r"labels has shape \(2, 3\)"):
        model(ids, labels=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(InputError, match="labels holds 50"):
        model(ids, labels=torch.full((2, 4), 50))
    assert model(ids, labels=torch.full((2, 4), -100).index_fill(1, torch.tensor([0]), 3)).loss.isfinite()
    seq2seq = _model(family="encoder-decoder")
    with pytest.raises(InputError, match=r"memory has shape \(2, 5, 8\)"):
        seq2seq.decode(ids, torch.randn(2, 5, 8))
    with pytest.raises(InputError, match="labels holds 60"):
        seq2seq(ids, ids, labels=torch.full((2, 4), 60))
    cache = seq2seq.allocate_cache(2, 8)
    seq2seq.decode(ids[:, :1], seq2seq.encode(ids), cache=cache)
    with pytest.raises(InputError, match="a source of 4 tokens, this memory has 6"):  # its keys were reused silently
        seq2seq.decode(ids[:, 1:2], seq2seq.encode(torch.zeros(2, 6, dtype=torch.long)), cache=cache)
    with pytest.raises(InputError, match="keys of another memory than this one"):  # a source of the same length
        seq2seq.decode(ids[:, 1:2], seq2seq.encode(torch.zeros(2, 4, dtype=torch.long)), cache=cache)


def test_a_decoding_step_reads_its_positions_from_the_device_once_at_most(monkeypatch):
    """Each value read to check an input waits for the device on a GPU. A step given its positions read their
    lowest and highest apart, for two checks; a step whose positions the stack built read the highest, known without
    reading. Counted: the reads of tensor values to the host, in one step given positions, not given them, and
    not given them where no table bounds positions (sinusoidal)."""
    reads = [0]

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            reads[0] += 1
            return original(self, *args, **kwargs)
        return read

    for name in ("item", "tolist", "__int__", "__bool__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))

    def step_reads(position, given):
        model, ids = _model(position=position), torch.randint(0, 50, (2, 5))
        cache = model.allocate_cache(2, 8)
        model(ids[:, :4], cache=cache)
        reads[0] = 0
        model(ids[:, 4:], cache=cache, position_ids=torch.full((2, 1), 4) if given else None)
        return reads[0]

    unbounded = step_reads("sinusoidal", given=False)
    assert step_reads("learned", given=False) == unbounded
    assert step_reads("learned", given=True) == unbounded + 1
    with pytest.raises(InputError, match="position -1"):
        _model(position="learned")(torch.zeros(1, 2, dtype=torch.long), position_ids=torch.tensor([[0, -1]]))
    with pytest.raises(InputError, match="position 40 is beyond max_seq_len=32"):
        _model(position="learned")(torch.zeros(1, 2, dtype=torch.long), position_ids=torch.tensor([[0, 40]]))


def test_weights_start_as_gpt2_initialises_them():
    """N(0, 0.02) weights and embeddings, zero biases, unit norm gains, and the projections that write into the
    residual stream (o_proj, down_proj) at 0.02 / sqrt(2 N) (Radford et al. 2019, section 2.3)."""
    model = build_model(_config(n_layers=4, d_model=64, d_ff=256, vocab_size=512, position="learned"))
    residual_std = 0.02 / math.sqrt(2 * 4)
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            assert parameter.abs().max() == 0, name
        elif parameter.dim() == 1:  # norm gains
            assert bool((parameter == 1).all()), name
        else:
            expected = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            assert abs(parameter.std().item() / expected - 1) < 0.1, (name, parameter.std().item(), expected)
            assert abs(parameter.mean().item()) < 0.2 * expected, name


@pytest.mark.parametrize("family", ["encoder-decoder", "recurrent-seq2seq"])
def test_a_target_batch_of_another_size_than_its_source_is_refused_in_one_sentence(family):
    """A Transformer encoder-decoder's forward refused two sources and three targets in words of its own, beside the
    words its decode and the recurrent seq2seq used: all three now say it one way."""
    sizes = {} if family == "recurrent-seq2seq" else dict(d_model=16, n_heads=2, d_ff=32, n_layers=1)
    fields = dict(cell="gru", hidden_size=8, attention="luong-dot") if family == "recurrent-seq2seq" else {}
    model = build_model(ModelConfig(family=family, vocab_size=12, max_seq_len=16, **sizes, **fields)).eval()
    src, tgt = torch.ones(2, 4, dtype=torch.long), torch.ones(3, 5, dtype=torch.long)
    message = "the target batch has 3 sequences but the source batch 2; pass one target per source"
    with pytest.raises(InputError, match=message):
        model(src, tgt)
    with pytest.raises(InputError, match=message):
        model.decode(tgt, model.encode(src))
