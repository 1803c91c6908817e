"""The lecture's claims on variants drawn from every choice at once: family x position scheme x score x norm and
its placement x activation x head grouping x sliding window x soft-capping x the checkpoint options. Each drawn
config survives a JSON round trip, and its model is causal where it should be, ignores padding, decodes through
the KV cache to the numbers of the full forward pass, is permutation-equivariant without positions, and with a
window as long as the sequence equals the same model without one."""

import tempfile

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import ModelConfig, build_model, count_parameters
from attnkit.checkpoint import load_model, save_model

VOCAB, LENGTH = 40, 9
TRANSFORMERS = ("decoder", "encoder", "encoder-decoder")
TOLERANCE = dict(atol=1e-4, rtol=1e-4)


@st.composite
def configs(draw, *, equivariant: bool = False, families: tuple[str, ...] = TRANSFORMERS) -> ModelConfig:
    """A config drawn from every choice, of one of `families`; `equivariant`: an encoder without positions or window
    with a head per position, the variants that permutation equivariance holds for (about 1 draw in 72 otherwise)."""
    family = "encoder" if equivariant else draw(st.sampled_from(families))
    position = "none" if equivariant else draw(
        st.sampled_from(["sinusoidal", "learned", "relative", "rope", "alibi", "none"]))
    fields = dict(
        family=family, vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=48, n_layers=2, max_seq_len=16, position=position,
        score=draw(st.sampled_from(["scaled_dot", "dot", "bilinear", "additive"])),
        norm=draw(st.sampled_from(["layer", "rms"])), norm_position=draw(st.sampled_from(["pre", "post"])),
        activation=draw(st.sampled_from(["relu", "gelu", "gelu_tanh", "silu", "swiglu"])),
        n_kv_heads=draw(st.sampled_from([4, 2, 1])), head_dim=draw(st.sampled_from([None, 6])),
        bias=draw(st.booleans()), tie_embeddings=draw(st.booleans()), scale_embeddings=draw(st.booleans()),
        embedding_norm=draw(st.booleans()), attn_softcap=draw(st.sampled_from([None, 5.0])),
        relative_max_distance=3,
    )
    if not equivariant and draw(st.booleans()):
        fields["attention_window"] = draw(st.integers(1, 4))
    if family == "encoder":
        heads = ["mlm", "tag"] if equivariant else ["mlm", "tag", "classify", "none"]
        fields.update(encoder_head=draw(st.sampled_from(heads)), pooling="mean")
    if family == "encoder-decoder" and draw(st.booleans()):
        fields.update(tgt_vocab_size=30, n_decoder_layers=1)
    return ModelConfig(**fields)


def _model(config: ModelConfig, **changes):
    torch.manual_seed(0)
    return build_model(config.replace(**changes) if changes else config).eval()


def _padded(ids: torch.Tensor, real_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A padding mask (B, T) with the first row padded after `real_len`, and the ids with other tokens there."""
    mask = torch.ones_like(ids)
    mask[0, real_len:] = 0
    other = ids.clone()
    other[0, real_len:] = (other[0, real_len:] + 3) % VOCAB
    return mask, other


def _check_decoder(model, ids: torch.Tensor) -> None:
    full = model(ids).logits
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    torch.testing.assert_close(model(changed).logits[:, :6], full[:, :6], **TOLERANCE)  # nothing flows back in time
    cache = model.allocate_cache(2, LENGTH)
    steps = [model(ids[:, :4], cache=cache).logits] + [model(ids[:, t : t + 1], cache=cache).logits
                                                       for t in range(4, LENGTH)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOLERANCE)
    mask, other = _padded(ids, 6)
    padded = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(model(other, attention_mask=mask).logits[0, :6], padded[0, :6], **TOLERANCE)
    torch.testing.assert_close(padded[0, :6], model(ids[:1, :6]).logits[0], **TOLERANCE)


def _check_encoder(model, config: ModelConfig, ids: torch.Tensor) -> None:
    mask, other = _padded(ids, 6)
    padded = model(ids, attention_mask=mask).logits
    per_position = config.encoder_head in ("mlm", "tag")
    real = padded[0, :6] if per_position else padded[0]
    torch.testing.assert_close((model(other, attention_mask=mask).logits[0, :6] if per_position else
                                model(other, attention_mask=mask).logits[0]), real, **TOLERANCE)
    alone = model(ids[:1, :6]).logits[0]
    torch.testing.assert_close(real, alone, **TOLERANCE)
    if config.position == "none" and config.attention_window is None and per_position:
        _check_permutation(model, ids)


def _check_permutation(model, ids: torch.Tensor) -> None:
    """Without positions self-attention is permutation-equivariant: permuting the tokens permutes the outputs."""
    permutation = torch.randperm(LENGTH, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(ids[:, permutation]).logits, model(ids).logits[:, permutation], **TOLERANCE)


def _check_encoder_decoder(model, config: ModelConfig, ids: torch.Tensor) -> None:
    vocab = config.target_vocab_size
    tgt = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(2))
    src_mask = torch.ones(2, LENGTH, dtype=torch.bool)
    src_mask[1, 6:] = False
    full = model(ids, tgt, src_mask=src_mask).logits
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % vocab
    torch.testing.assert_close(model(ids, changed, src_mask=src_mask).logits[:, :4], full[:, :4], **TOLERANCE)
    other = ids.clone()
    other[1, 6:] = (other[1, 6:] + 3) % VOCAB
    torch.testing.assert_close(model(other, tgt, src_mask=src_mask).logits, full, **TOLERANCE)
    memory = model.encode(ids, src_mask=src_mask)
    cache = model.allocate_cache(2, 7)
    steps = [model.decode(tgt[:, t : t + 1], memory, src_mask=src_mask, cache=cache).logits for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOLERANCE)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), seed=st.integers(0, 1000))
def test_every_variant_keeps_the_lectures_properties(config, seed):
    assert ModelConfig.from_json(config.to_json()) == config
    model = _model(config)
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        if config.family == "decoder":
            _check_decoder(model, ids)
        elif config.family == "encoder":
            _check_encoder(model, config, ids)
        else:
            _check_encoder_decoder(model, config, ids)
        if config.attention_window is not None:
            inputs = (ids, ids % config.target_vocab_size) if config.family == "encoder-decoder" else (ids,)
            long_window = _model(config, attention_window=LENGTH)(*inputs).logits
            torch.testing.assert_close(long_window, _model(config, attention_window=None)(*inputs).logits, **TOLERANCE)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(equivariant=True), seed=st.integers(0, 1000))
def test_an_encoder_without_positions_is_permutation_equivariant(config, seed):
    """Drawn on purpose every run (the draws above reach such an encoder about once in 72): every other choice
    varies, the tokens' order alone is what positions would add."""
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        _check_permutation(_model(config), ids)


@st.composite
def recurrent_configs(draw) -> ModelConfig:
    """A recurrent LM or encoder-decoder drawn from every choice: cell, depth, widths, tying, and for the
    encoder-decoder the attention (none: the bottleneck), a bidirectional encoder and its width."""
    family = draw(st.sampled_from(["recurrent-lm", "recurrent-seq2seq"]))
    hidden = draw(st.sampled_from([8, 12]))
    fields = dict(family=family, vocab_size=VOCAB, n_layers=draw(st.integers(1, 2)), hidden_size=hidden,
                  cell=draw(st.sampled_from(["rnn", "gru", "lstm"])), embedding_dim=draw(st.sampled_from([None, 6])),
                  tie_embeddings=draw(st.booleans()), dropout=0.1, max_seq_len=16)
    if family == "recurrent-seq2seq":
        attention = draw(st.sampled_from(["none", "bahdanau", "luong-dot", "luong-general"]))
        bidirectional = draw(st.booleans())
        encoder = hidden // 2 if attention == "luong-dot" and bidirectional else (
            None if attention == "luong-dot" else draw(st.sampled_from([None, 6])))  # luong-dot: equal widths
        fields.update(attention=attention, bidirectional=bidirectional, encoder_hidden_size=encoder,
                      tgt_vocab_size=draw(st.sampled_from([None, 30])))
    return ModelConfig(**fields)


def _trained_outputs(model, config: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """One training step's loss for the head `config` builds (the bare encoder: its states' sum), backpropagated;
    returns what the model outputs."""
    labels = {"classify": torch.tensor([0, 1])}.get(getattr(config, "encoder_head", None), ids % 2)
    if config.family in ("encoder-decoder", "recurrent-seq2seq"):
        out = model(ids, ids[:, :7] % config.target_vocab_size, labels=ids[:, 1:8] % config.target_vocab_size)
    elif getattr(config, "encoder_head", None) == "none":
        out = model(ids)
    else:
        out = model(ids, labels=labels if config.family == "encoder" and config.encoder_head != "mlm" else ids)
    (out.loss if out.loss is not None else out.hidden_states.sum()).backward()
    return out.logits


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.one_of(configs(), recurrent_configs()), seed=st.integers(0, 1000))
def test_every_variant_trains_a_step_saves_and_loads_back_to_the_same_model_and_count(config, seed):
    """Any family and choice: a training step (dropout on) gives a finite gradient for every parameter, the
    checkpoint (safetensors + JSON) loads back to the same config and logits, and the parameter count the config
    reports (built on the meta device, as `attnkit presets` counts) is the model's."""
    torch.manual_seed(seed)
    model = build_model(config).train()
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(seed))
    _trained_outputs(model, config, ids)
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    model.eval().zero_grad()
    with tempfile.TemporaryDirectory() as directory:
        save_model(model, config, directory)
        loaded, loaded_config = load_model(directory)
    assert loaded_config == config
    torch.testing.assert_close(_trained_outputs(loaded, config, ids), _trained_outputs(model, config, ids),
                               rtol=0, atol=0)
    unique = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert count_parameters(config) == count_parameters(loaded) == unique


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(families=("decoder",)), padding=st.integers(0, 3),
       chunks=st.lists(st.integers(1, 3), min_size=1, max_size=6), seed=st.integers(0, 1000))
def test_left_padded_rows_decode_through_the_cache_in_any_chunks_as_the_whole_pass(config, padding, chunks, seed):
    """What a server does with a batch: rows left-padded to one length, a prefill, then steps or chunks of several
    tokens through the KV cache (rolling for a window; Shaw, ALiBi and RoPE reading the cache's positions). Each row's
    real positions get the logits of one whole pass over the padded batch."""
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :padding] = 0
    model = _model(config)
    sizes = [padding + 1, *chunks, LENGTH]  # the prefill holds a real token of every row; the last chunk the rest
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        cache, start, steps = model.allocate_cache(2, LENGTH), 0, []
        for size in sizes:
            end = min(start + size, LENGTH)
            if end > start:
                steps.append(model(ids[:, start:end], attention_mask=mask[:, :end], cache=cache).logits)
            start = end
    stepped = torch.cat(steps, dim=1)
    torch.testing.assert_close(stepped[mask.bool()], full[mask.bool()], **TOLERANCE)
