"""Static decoding (fixed shapes, compiled step): the same tokens and logits as eager decoding, no recompilation
within a length bucket, clear refusals."""

import pytest
import torch
from generate_models import tiny_model

from attnkit.blocks import torch_compile_mode
from attnkit.errors import InputError
from attnkit.generate import EagerDecoding, StaticDecoding, generate_tokens, left_pad
from attnkit.generate.decode_layout import transpose_linear_weights
from attnkit.layers.kv_cache import StaticKVCache

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [3, 3, 0, 12, 5]]


@torch.no_grad()
def forced_logits(decoding, prompts, forced: list[int]) -> list[torch.Tensor]:
    """Logits (B, V) after the prefill and after feeding each of `forced` to every row."""
    window = left_pad(prompts, pad_id=0)
    cache = decoding.allocate(len(prompts), window.ids.shape[1] + len(forced), context_len=24)
    logits = [decoding.prefill(window, cache)]
    for token in forced:
        window = window.append(torch.full((len(prompts),), token))
        logits.append(decoding.step(window, cache))
    return logits


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rope", "relative", "alibi", "none"])
def test_static_step_gives_the_logits_of_eager_decoding(position):
    model, _ = tiny_model(position=position)
    forced = [5, 0, 12, 7, 7, 1]
    eager = forced_logits(EagerDecoding(model), PROMPTS, forced)
    static = forced_logits(StaticDecoding(model, compile=False), PROMPTS, forced)
    for step, (a, b) in enumerate(zip(eager, static, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10, msg=f"step {step}")


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2, "activation": "swiglu", "norm": "rms", "bias": False}])
def test_static_greedy_equals_eager_through_a_sliding_window(overrides):
    """30 new tokens after prompts of up to 7 outgrow the context of 24: the window slides into a new cache."""
    model, config = tiny_model(position="rope", seed=1, **overrides)
    eager = generate_tokens(model, PROMPTS, max_new_tokens=30, context_len=config.max_seq_len)
    static = generate_tokens(model, PROMPTS, max_new_tokens=30, context_len=config.max_seq_len,
                             decoding=StaticDecoding(model, compile=False))
    assert static == eager


def test_static_cache_writes_at_its_slot_and_refuses_to_overflow():
    cache = StaticKVCache.allocate(n_layers=1, batch_size=2, n_kv_heads=1, head_dim=2, max_len=3)
    layer = cache.layers[0]
    layer.append(torch.ones(2, 1, 2, 2), torch.ones(2, 1, 2, 2))  # a prefill of 2 positions
    cache.mark_prefilled(torch.tensor([[False, True], [True, True]]))
    cache.advance()
    keys, _ = layer.append(torch.full((2, 1, 1, 2), 7.0), torch.zeros(2, 1, 1, 2))
    assert keys.shape == (2, 1, 3, 2) and keys[:, 0, :, 0].tolist() == [[1, 1, 7], [1, 1, 7]]
    assert cache.filled.tolist() == [[False, True, True], [True, True, True]]
    with pytest.raises(InputError, match="holds 3 positions"):
        cache.advance()


def test_cache_lengths_are_rounded_up_to_a_power_of_two_within_the_context():
    model, _ = tiny_model()
    decoding = StaticDecoding(model, compile=False)
    assert decoding.allocate(1, 70, context_len=1024).max_len == 128
    assert decoding.allocate(1, 5, context_len=1024).max_len == 64
    assert decoding.allocate(1, 70, context_len=100).max_len == 100


def test_static_decoding_refuses_other_models():
    encoder, _ = tiny_model(family="encoder")
    with pytest.raises(InputError, match="decoder-only"):
        StaticDecoding(encoder, compile=False)
    model, config = tiny_model()
    other, _ = tiny_model(seed=5)
    with pytest.raises(InputError, match="another model"):
        generate_tokens(model, [[1]], max_new_tokens=2, context_len=config.max_seq_len,
                        decoding=StaticDecoding(other, compile=False))


def test_compiled_step_equals_eager_and_compiles_once_per_batch_size_and_bucket():
    """A second prompt length in the same bucket reuses the graph; new batch sizes compile beyond torch's limit."""
    model, config = tiny_model(position="rope", seed=2, n_kv_heads=2)
    model.float()
    decoding = StaticDecoding(model)
    for prompts, settings in (([[1, 2, 3]], {}), ([[4, 5, 6, 7, 8]], {"error_on_recompile": True}),
                              (PROMPTS[:2], {"recompile_limit": 1}), (PROMPTS[:3], {"recompile_limit": 1})):
        eager = generate_tokens(model, prompts, max_new_tokens=8, context_len=config.max_seq_len)
        with torch._dynamo.config.patch(**settings):
            compiled = generate_tokens(model, prompts, max_new_tokens=8, context_len=config.max_seq_len,
                                       decoding=decoding)
        assert compiled == eager


@pytest.mark.slow  # compiles several graphs; the default suite keeps the compiled step's equality test
def test_known_shapes_skip_guards_yet_each_call_runs_its_own_graph():
    """Two models with the same shapes share the step's compiled code; interleaved with two batch sizes, each call
    that skips all but the distinguishing guards still runs its model's graph for its shape."""
    models = [tiny_model(position="learned", seed=seed)[0].float() for seed in (3, 4)]
    context = models[0].stack.embeddings.max_positions
    decodings = [StaticDecoding(model) for model in models]
    for index, prompts in ((0, PROMPTS[:1]), (1, PROMPTS[:1]), (0, PROMPTS[:2]), (0, PROMPTS[:1]), (1, PROMPTS[:1]),
                           (0, PROMPTS[:2]), (1, PROMPTS[:2])):
        eager = generate_tokens(models[index], prompts, max_new_tokens=6, context_len=context)
        compiled = generate_tokens(models[index], prompts, max_new_tokens=6, context_len=context,
                                   decoding=decodings[index])
        assert compiled == eager, (index, len(prompts))


@pytest.mark.slow  # compiles more graphs (7 s)
def test_a_known_shape_under_new_global_modes_runs_every_guard():
    """Autocast (or grad mode, or train mode) is not part of the shape: a call under it, after plain calls of the same
    shape, must check every guard and compile for it rather than run, or refuse to recompile, unguarded."""
    model, config = tiny_model(position="learned", seed=5)
    model.float()
    decoding = StaticDecoding(model)
    for _ in range(2):
        generate_tokens(model, PROMPTS[:1], max_new_tokens=4, context_len=config.max_seq_len, decoding=decoding)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = generate_tokens(model, PROMPTS[:1], max_new_tokens=4, context_len=config.max_seq_len)
        compiled = generate_tokens(model, PROMPTS[:1], max_new_tokens=4, context_len=config.max_seq_len,
                                   decoding=decoding)
    assert len(compiled[0]) == 4 and compiled[0][0] == eager[0][0]


@pytest.mark.slow  # compiles several graphs; the default suite keeps the compiled step's equality test
def test_known_calls_compile_again_after_torch_drops_its_graphs():
    model, config = tiny_model(position="rope", seed=6)
    model.float()
    decoding = StaticDecoding(model)
    eager = generate_tokens(model, PROMPTS[:2], max_new_tokens=5, context_len=config.max_seq_len)
    for _ in range(2):
        compiled = generate_tokens(model, PROMPTS[:2], max_new_tokens=5, context_len=config.max_seq_len,
                                   decoding=decoding)
        assert compiled == eager
        torch._dynamo.reset()


def test_an_error_of_the_step_itself_is_not_taken_for_dropped_graphs():
    model, config = tiny_model(seed=7)
    model.float()
    decoding = StaticDecoding(model, compile=False)
    decoding._compiled = True  # the compiled path's bookkeeping around the eager step: no compile time in the test
    generate_tokens(model, PROMPTS[:1], max_new_tokens=3, context_len=config.max_seq_len, decoding=decoding)
    step, calls = decoding._step, []

    def failing_once(token, cache):  # were the error taken for dropped graphs, the retry would hide it
        calls.append(token)
        if len(calls) == 1:
            raise RuntimeError("a shape error inside the step")
        return step(token, cache)

    decoding._step = failing_once
    with pytest.raises(RuntimeError, match="a shape error inside the step"):
        generate_tokens(model, PROMPTS[:1], max_new_tokens=3, context_len=config.max_seq_len, decoding=decoding)


def test_weights_are_frozen_except_those_transposed_for_fp32_decoding():
    model, _ = tiny_model()
    assert StaticDecoding(model.bfloat16(), compile=False).freezes_weights
    transposed = transpose_linear_weights(tiny_model()[0].float())
    assert not StaticDecoding(transposed, compile=False).freezes_weights


def test_compile_modes_are_checked_by_name():
    assert torch_compile_mode(True) == "default" and torch_compile_mode(False) is None
    assert torch_compile_mode("max-autotune") == "max-autotune-no-cudagraphs"
    with pytest.raises(InputError, match="not a compile mode"):
        StaticDecoding(tiny_model()[0], compile="fastest")


@pytest.mark.slow
def test_max_autotune_step_equals_eager():
    """Kernel timing while compiling takes about a minute even for this model, hence slow."""
    model, config = tiny_model(position="rope", seed=2, n_kv_heads=2)
    model.float()
    eager = generate_tokens(model, PROMPTS[:2], max_new_tokens=8, context_len=config.max_seq_len)
    tuned = generate_tokens(model, PROMPTS[:2], max_new_tokens=8, context_len=config.max_seq_len,
                            decoding=StaticDecoding(model, compile="max-autotune"))
    assert tuned == eager


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama2-tiny"])
def test_static_step_traces_without_graph_breaks(name):
    """The decoding step of the decoder families with default settings is one graph (what a CUDA graph captures)."""
    from attnkit import build_model, presets
    from attnkit.generate.static_decode import static_step

    model = build_model(presets.get(name, vocab_size=64, n_layers=1, max_seq_len=64)).eval()
    cache = model.allocate_cache(2, 64, static=True)
    cache.advance()
    torch._dynamo.reset()
    with torch.no_grad():
        explanation = torch._dynamo.explain(static_step)(model, torch.tensor([[3], [5]]), cache)
    assert explanation.graph_break_count == 0, [str(b.reason)[:200] for b in explanation.break_reasons]


def test_a_step_torch_cannot_compile_decodes_eagerly_with_the_same_tokens(caplog):
    """--compile never ends decoding in an error of torch.compile's: the step falls back to the eager reference."""
    model, config = tiny_model(position="rope", seed=2)
    model.float()
    decoding = StaticDecoding(model)

    def failing(token, cache):
        raise torch._dynamo.exc.TorchDynamoException("backend failed on this step")

    decoding._step = failing
    eager = generate_tokens(model, [[1, 2, 3]], max_new_tokens=6, context_len=config.max_seq_len)
    with caplog.at_level("WARNING"):
        compiled = generate_tokens(model, [[1, 2, 3]], max_new_tokens=6, context_len=config.max_seq_len,
                                   decoding=decoding)
    assert compiled == eager
    assert "runs eagerly: torch.compile failed" in caplog.text and "backend failed" in caplog.text
