"""The convolutional language model (GCNN, Dauphin et al. 2017; `models/convolutional`): shapes, causality, a
receptive field exactly as long as the config says, equality with a stack built by hand from torch.nn.Conv1d,
generation through its state equal to passes from scratch, training that lowers the loss, the config's checks, and
the family as a user runs it (`attnkit train`, --resume, `generate`, --explain, `eval`)."""

import functools
import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from stateful_lms import (
    assert_a_short_run_halves_the_loss,
    assert_a_step_of_another_batch_is_refused,
    assert_bad_inputs_are_clear_errors,
    assert_config_refuses,
    assert_greedy_generation_equals_recomputation,
    assert_reorder_follows_rows,
    assert_steps_through_the_state_equal_each_row_alone,
    assert_the_last_prediction_reads_exactly,
    train_resume_and_generate,
)
from torch import nn

import attnkit
from attnkit import cli
from attnkit.config import ConvLMConfig, ModelConfig
from attnkit.models import build_model
from attnkit.models.convolutional import ConvLM

VOCAB = 11


def _model(*, d_model=8, kernel_size=3, dilations=(1, 2, 4), seed=0, tie_embeddings=True) -> ConvLM:
    torch.manual_seed(seed)
    model = ConvLM(vocab_size=VOCAB, d_model=d_model, kernel_size=kernel_size, dilations=list(dilations),
                   tie_embeddings=tie_embeddings).eval()
    for p in model.parameters():  # larger than at initialisation: every tap moves the logits visibly
        nn.init.normal_(p, 0.0, 0.5)
    return model


@functools.cache
def _shared_model() -> ConvLM:
    return _model()


def test_shapes_and_loss():
    model = _model()
    ids = torch.randint(0, VOCAB, (3, 9))
    out = model(ids, labels=ids)
    assert out.logits.shape == (3, 9, VOCAB)
    assert out.loss.shape == () and torch.isfinite(out.loss)
    expected = F.cross_entropy(out.logits.reshape(-1, VOCAB), ids.reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert model.lm_head.weight is model.embedding.weight  # tied by default


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=24), st.data())
def test_logits_up_to_t_ignore_every_token_after_t(ids, data):
    """Causality: changing tokens after position t leaves the logits at positions <= t unchanged."""
    model = _shared_model()
    t = data.draw(st.integers(0, len(ids) - 2))
    changed = ids[: t + 1] + data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=len(ids) - t - 1,
                                                max_size=len(ids) - t - 1))
    with torch.no_grad():
        a, b = (model(torch.tensor([x])).logits[0] for x in (ids, changed))
    torch.testing.assert_close(a[: t + 1], b[: t + 1], rtol=0, atol=0)


@pytest.mark.parametrize(("kernel_size", "dilation_base", "n_layers", "dilation_cycle"),
                         [(2, 1, 3, None), (3, 2, 3, None), (4, 2, 4, 2), (3, 3, 2, None)])
def test_the_receptive_field_is_exactly_what_the_config_says(kernel_size, dilation_base, n_layers, dilation_cycle):
    """The token R - 1 positions back (just inside) changes the last logits; the one R back (just outside), and every
    one before it, changes nothing."""
    config = ModelConfig(family="conv-lm", vocab_size=VOCAB, d_model=8, n_layers=n_layers, kernel_size=kernel_size,
                         dilation_base=dilation_base, dilation_cycle=dilation_cycle, max_seq_len=64)
    reach = config.receptive_field
    expected = 1 + (kernel_size - 1) * sum(dilation_base ** (layer % (dilation_cycle or n_layers))
                                           for layer in range(n_layers))
    assert reach == expected
    torch.manual_seed(1)
    model = build_model(config).eval()
    assert model.receptive_field == reach
    for p in model.parameters():
        nn.init.normal_(p, 0.0, 0.5)
    assert_the_last_prediction_reads_exactly(model, reach, VOCAB)


def _by_hand(model: ConvLM, ids: torch.Tensor, kernel_size: int, dilations: list[int]) -> torch.Tensor:
    """The same stack from torch.nn.Conv1d with symmetric padding, the right-hand outputs cut off (a causal
    convolution built the other common way), the GLU as a * sigmoid(b), in float64."""
    x = model.embedding.weight.double()[ids].transpose(1, 2)  # (B, C, T)
    for block, dilation in zip(model.blocks, dilations, strict=True):
        pad = (kernel_size - 1) * dilation
        conv = nn.Conv1d(x.shape[1], 2 * x.shape[1], kernel_size, dilation=dilation, padding=pad).double()
        with torch.no_grad():
            conv.weight.copy_(block.conv.conv.weight)
            conv.bias.copy_(block.conv.conv.bias)
            out = conv(x)[:, :, : x.shape[2]]  # (B, 2C, T + 2 pad) -> (B, 2C, T): drop what reads the future
        a, b = out.chunk(2, dim=1)
        x = x + a * torch.sigmoid(b)
    return x.transpose(1, 2) @ model.lm_head.weight.double().T  # (B, T, V)


@pytest.mark.parametrize(("kernel_size", "dilations"), [(2, [1, 1]), (3, [1, 2, 4])])
def test_equals_a_stack_built_by_hand_from_conv1d(kernel_size, dilations):
    model = _model(d_model=4, kernel_size=kernel_size, dilations=dilations, tie_embeddings=False)
    ids = torch.randint(0, VOCAB, (2, 13))
    with torch.no_grad():
        ours = model(ids).logits.double()
    torch.testing.assert_close(ours, _by_hand(model, ids, kernel_size, dilations), rtol=1e-5, atol=1e-5)


def test_left_padding_and_the_generation_state_equal_each_row_alone():
    """Stepping a token at a time through `ConvState` (each block's last (k - 1) d inputs) over a text longer than R,
    with the shorter row left-padded, gives each row the logits of a pass over it alone."""
    model = _model()
    state = assert_steps_through_the_state_equal_each_row_alone(model, VOCAB)
    assert [state.inputs[i].shape for i in range(3)] == [(2, 8, 2 * d) for d in (1, 2, 4)]


def test_a_cached_step_convolves_only_the_new_token_with_each_blocks_past_inputs():
    """Fast WaveNet generation: a step's convolution in each block reads (k - 1) d cached inputs and the new one,
    not the whole receptive field again, and its logits equal those of a pass over the whole text (float64)."""
    model = _model(kernel_size=3, dilations=(1, 2, 4, 8)).double()  # R = 31
    ids = torch.randint(0, VOCAB, (2, 50))
    widths = []
    hooks = [block.conv.conv.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[2]))
             for block in model.blocks]
    state = model.allocate_cache(2)
    with torch.no_grad():
        whole = model(ids).logits
        widths.clear()
        steps = [model(ids[:, :5], cache=state).logits]
        assert widths == [2 * d + 5 for d in (1, 2, 4, 8)]  # the prefill: zeros before the text, then 5 tokens
        for t in range(5, ids.shape[1]):
            widths.clear()
            steps.append(model(ids[:, t:t + 1], cache=state).logits)
            assert widths == [2 * d + 1 for d in (1, 2, 4, 8)]
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-12, atol=1e-12)
    assert state.length == 50


def test_greedy_generation_equals_recomputation_past_the_context():
    """The state keeps each block's last (k - 1) d inputs, whatever the length, so the window never slides."""
    assert_greedy_generation_equals_recomputation(_model())


def test_state_reorder_follows_rows():
    assert_reorder_follows_rows(_model(), VOCAB)


def test_a_short_training_run_lowers_the_loss():
    """A sequence whose next token is the one 3 back (within the receptive field) is learned in 60 steps."""
    torch.manual_seed(0)
    model = ConvLM(vocab_size=VOCAB, d_model=16, kernel_size=2, dilations=[1, 2])  # R = 4
    assert_a_short_run_halves_the_loss(model, lambda: torch.randint(0, VOCAB, (16, 3)).repeat(1, 6))  # period 3


def test_bad_inputs_are_clear_errors():
    assert_bad_inputs_are_clear_errors(_model(), VOCAB)


def test_a_step_of_another_batch_than_the_states_is_refused_naming_both():
    """A state holds its rows' past inputs: a step of 2 rows after a prefill of 3 was torch.cat's size error."""
    assert_a_step_of_another_batch_is_refused(_model(), VOCAB)


@pytest.mark.parametrize(("fields", "words"), [
    (dict(kernel_size=1), ["kernel_size=1", "kernel_size >= 2"]),
    (dict(dilation_cycle=2), ["dilation_cycle=2", "dilation_base"]),
    (dict(dilation_base=2, n_layers=3, dilation_cycle=4), ["dilation_cycle=4", "n_layers=3"]),
    (dict(n_layers=6, kernel_size=5, max_seq_len=16), ["receptive field is 25 tokens", "max_seq_len=16",
                                                        "Raise max_seq_len"]),
    (dict(n_layers=80, dilation_base=2, max_seq_len=64), ["more than max_seq_len", "fewer layers"]),
    (dict(d_model=0), ["d_model=0"]),
    (dict(n_heads=4), ["n_heads=4", "conv-lm"]),
])
def test_config_refuses_what_cannot_work_naming_the_fix(fields, words):
    assert_config_refuses("conv-lm", fields, words)


def test_config_round_trips_and_is_the_family_class():
    config = ModelConfig(family="conv-lm", vocab_size=40, d_model=16, n_layers=4, kernel_size=3, dilation_base=2,
                         dilation_cycle=2, max_seq_len=32)
    assert type(config) is ConvLMConfig
    assert ModelConfig.from_json(config.to_json()) == config
    assert config.receptive_field == 1 + 2 * (1 + 2 + 1 + 2)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder-decoder", "recurrent-lm", "recurrent-seq2seq"])
def test_receptive_field_is_declared_by_every_family_and_bounded_by_the_convolution(family):
    """`ModelConfig.receptive_field` is part of every config (the training log reads it), None where the family
    declares no bound; the convolution's is its taps' reach (the feed-forward window's: test_feedforward_lm.py)."""
    assert ModelConfig(family=family).receptive_field is None
    assert ModelConfig(family="conv-lm", n_layers=3, kernel_size=3, dilation_base=2).receptive_field == 15


def test_train_resume_load_generate_and_explain_from_the_command_line(tmp_path, capsys, caplog):
    caplog.set_level("INFO", logger="attnkit")
    config = train_resume_and_generate("gcnn-lm-tiny", tmp_path, capsys, explain=True)
    assert type(config) is ConvLMConfig and config.receptive_field == 31
    assert "conv-lm" in caplog.text and "receptive field 31 tokens" in caplog.text  # the training log says it
    # attnkit eval scores the run as the model does, window by window (32 tokens each, none overlapping)
    run, text = tmp_path / "whole", tmp_path / "text.txt"
    assert cli.main(["eval", str(run), "--data", str(text), "--window", "32", "--stride", "32"]) == 0
    (row,) = json.loads((run / "eval" / "eval.json").read_text())["rows"]
    pipeline = attnkit.load(run, device="cpu")
    ids = torch.tensor(pipeline.tokenizer.encode(text.read_text()))
    with torch.no_grad():
        nll = sum(F.cross_entropy(pipeline.model(w[None, :-1]).logits[0], w[1:], reduction="sum")
                  for w in (ids[start : start + 33] for start in range(0, len(ids) - 1, 32)))
    assert row["tokens"] == len(ids) - 1
    assert row["loss"] == pytest.approx(nll.item() / (len(ids) - 1), rel=1e-5)
