"""The feed-forward language models (`models/feedforward`): Bengio et al.'s (2003) fixed window and the deep averaging
LM (Iyyer et al. 2015's pooling over each prefix). Shapes, causality, the lectures' properties (the window reads its
last K tokens in order and nothing older; the average is blind to the prefix's order), equality with a plain
per-position computation, generation through the state equal to passes from scratch, training that lowers the loss,
the config's checks, and the family as a user runs it (`attnkit train`, --resume, `generate`)."""

import functools

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

from attnkit.config import FeedForwardLMConfig, ModelConfig
from attnkit.models import build_model
from attnkit.models.feedforward import FeedForwardLM, PrefixState

VOCAB, K = 11, 4
CONTEXTS = ["window", "average"]


def _model(context: str, *, seed: int = 0, n_layers: int = 2, tie_embeddings: bool = True) -> FeedForwardLM:
    torch.manual_seed(seed)
    model = FeedForwardLM(vocab_size=VOCAB, embedding_dim=6, hidden=6 if tie_embeddings else 10, n_layers=n_layers,
                          context=context, context_size=K, tie_embeddings=tie_embeddings).eval()
    for p in model.parameters():  # larger than at initialisation: every input moves the logits visibly
        nn.init.normal_(p, 0.0, 0.5)
    return model


@functools.cache
def _shared(context: str) -> FeedForwardLM:
    return _model(context)


@pytest.mark.parametrize("context", CONTEXTS)
def test_shapes_and_loss(context):
    model = _model(context)
    ids = torch.randint(0, VOCAB, (3, 9))
    out = model(ids, labels=ids)
    assert out.logits.shape == (3, 9, VOCAB)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, VOCAB), ids.reshape(-1)))
    assert model.lm_head.weight is model.embedding.weight  # tied by default


def _one_position(model: FeedForwardLM, ids: list[int], t: int) -> torch.Tensor:
    """The logits at position t computed alone, in float64, from the definitions: the window's K embeddings (zeros
    before the text) concatenated oldest first, or the mean of embeddings 0..t; then the MLP and the output layer."""
    table = model.embedding.weight.double()
    if model.context == "window":
        slots = [table[ids[s]] if s >= 0 else torch.zeros(table.shape[1], dtype=torch.float64)
                 for s in range(t - K + 1, t + 1)]
        x = torch.cat(slots)
    else:
        x = table[ids[: t + 1]].mean(0)
    for layer in model.mlp:
        x = torch.tanh(layer.weight.double() @ x + layer.bias.double()) if isinstance(layer, nn.Linear) else x
    return model.lm_head.weight.double() @ x


@pytest.mark.parametrize("context", CONTEXTS)
def test_every_position_at_once_equals_each_position_alone(context):
    model = _model(context, tie_embeddings=True)
    ids = torch.randint(0, VOCAB, (1, 10))
    with torch.no_grad():
        batched = model(ids).logits[0].double()
    alone = torch.stack([_one_position(model, ids[0].tolist(), t) for t in range(10)])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(CONTEXTS), st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=20), st.data())
def test_logits_up_to_t_ignore_every_token_after_t(context, ids, data):
    """Causality: changing tokens after position t leaves the logits at positions <= t unchanged."""
    model = _shared(context)
    t = data.draw(st.integers(0, len(ids) - 2))
    after = len(ids) - t - 1
    changed = ids[: t + 1] + data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=after, max_size=after))
    with torch.no_grad():
        a, b = (model(torch.tensor([x])).logits[0] for x in (ids, changed))
    torch.testing.assert_close(a[: t + 1], b[: t + 1], rtol=0, atol=0)


def _with_changed(ids: list[int], positions) -> torch.Tensor:
    changed = list(ids)
    for p in positions:
        changed[p] = (changed[p] + 1) % VOCAB
    return torch.tensor([changed])


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), min_size=K + 1, max_size=16))
def test_the_window_ignores_every_token_older_than_its_K_and_reads_the_oldest_of_them(ids):
    """n-gram-like: only the last K tokens (the n - 1 words) reach the prediction; the K-th one back does."""
    model = _shared("window")
    last = len(ids) - 1
    with torch.no_grad():
        base = model(torch.tensor([ids])).logits[0, -1]
        older = model(_with_changed(ids, range(0, last - K + 1))).logits[0, -1]  # every token before the window
        oldest = model(_with_changed(ids, [last - K + 1])).logits[0, -1]  # the window's first slot
    torch.testing.assert_close(older, base, rtol=0, atol=0)
    assert not torch.allclose(oldest, base)


def test_the_window_is_position_sensitive():
    """Swapping two tokens inside the window changes the prediction: each slot has its own weights."""
    model = _shared("window")
    with torch.no_grad():
        a = model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1]
        b = model(torch.tensor([[2, 1, 3, 4]])).logits[0, -1]
    assert not torch.allclose(a, b)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=20), st.randoms(use_true_random=False))
def test_the_average_is_invariant_to_permuting_the_prefix(ids, random):
    """A DAN's pooling is order-blind: the prediction after a prefix is the same for any order of it (and, unlike
    the window, every token of it counts, however far back)."""
    model = _shared("average")
    shuffled = list(ids)
    random.shuffle(shuffled)
    with torch.no_grad():
        a = model(torch.tensor([ids])).logits[0, -1]
        b = model(torch.tensor([shuffled])).logits[0, -1]
        first = model(_with_changed(ids, [0])).logits[0, -1]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(first, a)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2 ** -7)])
def test_the_average_of_a_long_prefix_keeps_its_precision(dtype, tolerance):
    # T = 4096 in one pass, and as generation reads it (a prompt of 1024, then one token a step through the state),
    # against the mean in float64: a bf16 count stepped by 1 stops at 256, a bf16 sum stops taking small tokens
    model = _model("average").to(dtype)
    x = torch.randn(2, 4096, 6, generator=torch.Generator().manual_seed(0)).to(dtype)  # (B, T, E)
    exact = x.double().cumsum(1) / torch.arange(1, 4097, dtype=torch.float64)[:, None]  # (B, T, E)
    whole = model.average(x, None, PrefixState())
    state = PrefixState()
    stepped = torch.cat([model.average(x[:, :1024], None, state)]
                        + [model.average(x[:, t:t + 1], None, state) for t in range(1024, 4096)], dim=1)
    for read in (whole, stepped):
        assert read.dtype == dtype
        torch.testing.assert_close(read.double(), exact, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("context", CONTEXTS)
def test_left_padding_and_the_generation_state_equal_each_row_alone(context):
    assert_steps_through_the_state_equal_each_row_alone(_model(context), VOCAB, lengths=(12, 7), prefill=6)


@pytest.mark.parametrize("context", CONTEXTS)
def test_greedy_generation_equals_recomputation_past_the_context(context):
    assert_greedy_generation_equals_recomputation(_model(context), new_tokens=15)


@pytest.mark.parametrize("context", CONTEXTS)
def test_state_reorder_follows_rows(context):
    assert_reorder_follows_rows(_model(context), VOCAB)


@pytest.mark.parametrize("context, pattern", [("window", "period"), ("average", "constant")])
def test_a_short_training_run_lowers_the_loss(context, pattern):
    """The window learns a sequence of period 3 (the next token is the one 3 back, inside K = 4); the average learns
    rows that repeat one token (what a prefix's mean tells exactly)."""
    torch.manual_seed(0)
    model = FeedForwardLM(vocab_size=VOCAB, embedding_dim=16, hidden=32, n_layers=1, context=context, context_size=K)
    period = 3 if pattern == "period" else 1
    assert_a_short_run_halves_the_loss(model, lambda: torch.randint(0, VOCAB, (16, period)).repeat(1, 18 // period))


def test_bad_inputs_are_clear_errors():
    assert_bad_inputs_are_clear_errors(_model("window"), VOCAB)


@pytest.mark.parametrize("context", CONTEXTS)
def test_a_step_of_another_batch_than_the_states_is_refused_naming_both(context):
    """A window's step of 2 rows after 3 was torch.cat's size error; an average's step of 1 row was broadcast over
    the 3 rows' sums and returned 3 rows of logits."""
    assert_a_step_of_another_batch_is_refused(_model(context), VOCAB)


@pytest.mark.parametrize(("fields", "words"), [
    (dict(context_size=300, max_seq_len=256), ["context_size=300", "max_seq_len=256", "Raise max_seq_len"]),
    (dict(context_size=0), ["context_size=0"]),
    (dict(hidden_size=0), ["hidden_size=0"]),
    (dict(context="attention"), ["context", "window", "average"]),
    (dict(activation="gelu"), ["activation", "tanh"]),
    (dict(n_heads=4), ["n_heads=4", "feedforward-lm"]),
])
def test_config_refuses_what_cannot_work_naming_the_fix(fields, words):
    assert_config_refuses("feedforward-lm", fields, words)


@pytest.mark.parametrize("context_size", [1, 3, 6])
def test_the_windows_receptive_field_is_its_context_size_and_the_averages_is_undeclared(context_size):
    """`config.receptive_field` (what the training log reports) is exactly what the built window reads; the average
    reads every token so far and declares None."""
    config = ModelConfig(family="feedforward-lm", vocab_size=VOCAB, context_size=context_size, embedding_dim=6,
                         hidden_size=6, n_layers=2, max_seq_len=32)
    assert config.receptive_field == context_size
    assert config.replace(context="average").receptive_field is None
    torch.manual_seed(1)
    model = build_model(config).eval()
    for p in model.parameters():
        nn.init.normal_(p, 0.0, 0.5)
    assert_the_last_prediction_reads_exactly(model, config.receptive_field, VOCAB)


def test_config_round_trips_builds_and_marks_the_averages_window_inert():
    config = ModelConfig(family="feedforward-lm", vocab_size=40, context="average", context_size=5, embedding_dim=8,
                         hidden_size=12, n_layers=2, tie_embeddings=False)
    assert type(config) is FeedForwardLMConfig
    assert ModelConfig.from_json(config.to_json()) == config
    assert config.inert_fields() == {"context_size"}
    assert ModelConfig(family="feedforward-lm").inert_fields() == set()
    model = build_model(config)
    assert model.context == "average" and model.lm_head.weight.shape == (40, 12)
    assert sum(p.numel() for p in model.parameters()) == 40 * 8 + (8 * 12 + 12) + (12 * 12 + 12) + 12 * 40


@pytest.mark.parametrize("preset", ["bengio-lm-tiny", "dan-lm-tiny"])
def test_train_resume_load_and_generate_from_the_command_line(preset, tmp_path, capsys):
    config = train_resume_and_generate(preset, tmp_path, capsys)
    assert type(config) is FeedForwardLMConfig and config.context == ("window" if "bengio" in preset else "average")


@pytest.mark.parametrize("context", CONTEXTS)
def test_attnkit_serve_completes_as_the_library_generates(context, tmp_path):
    # two prompts of different lengths in one request: rows batched over the state, each as it generates alone
    pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'attnkit[serve]')")
    import httpx
    from serve_helpers import TEXT_CHARS, running_server

    import attnkit
    from attnkit.checkpoint import record_checksums, save_model
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer(TEXT_CHARS)
    config = ModelConfig(family="feedforward-lm", vocab_size=tokenizer.vocab_size, context=context, context_size=K,
                         embedding_dim=16, hidden_size=16, n_layers=1, max_seq_len=64)
    torch.manual_seed(0)
    save_model(build_model(config).eval(), config, tmp_path / context)
    tokenizer.save(tmp_path / context / "tokenizer")
    record_checksums(tmp_path / context)
    prompts = ["the cat", "a dog sat on"]
    pipeline = attnkit.load(tmp_path / context, device="cpu")
    expected = [pipeline.generate(prompt, max_new_tokens=12, temperature=0)[0] for prompt in prompts]
    with running_server(tmp_path / context, max_queue=8, max_batch=4) as (url, _):
        answer = httpx.post(f"{url}/v1/completions", timeout=60, json={
            "model": context, "prompt": prompts, "max_tokens": 12, "temperature": 0}).json()
    assert [choice["text"] for choice in answer["choices"]] == expected
