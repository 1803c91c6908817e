"""A decoding step captured ahead of time (AOTInductor): the logits of eager decoding for one row (products as
reductions) and several (matrix products) at any cache length, packages kept on disk and loaded at a second start,
shared by the checkpoints of one architecture, and one-line refusals."""

import shutil

import pytest
import torch
from generate_models import tiny_model
from test_generate_static_decode import PROMPTS, forced_logits

from attnkit.errors import InputError
from attnkit.generate import EagerDecoding, StaticDecoding, generate_tokens, native_gemv
from attnkit.generate import captured_step as captured
from attnkit.generate.captured_step import CapturedDecoding, package_digest, row_int8_products, row_products
from attnkit.generate.pipeline import decoding_for
from attnkit.generate.plan import plan_inference, prepare_for_inference

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="capturing a step needs a C++ compiler (g++)")


@pytest.fixture(scope="module")
def gqa_model():
    """Grouped-query heads; learned positions and LayerNorm, computed in the model's float64 throughout (rotary
    angles and RMSNorm run in float32 by design, which a fused kernel rounds differently; test_generate_pipeline's
    CLI test holds a RoPE model to the same tokens)."""
    model, config = tiny_model(position="learned", seed=1, n_kv_heads=2)
    return model, config


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("compiled")


@pytest.fixture(scope="module")
def captured_gqa(gqa_model, package_dir):
    return CapturedDecoding(gqa_model[0], package_dir=package_dir)


@needs_compiler
@pytest.mark.parametrize("prompts", [PROMPTS[1:2], pytest.param(PROMPTS, marks=pytest.mark.slow)],
                         ids=["one-row", "rows"])  # rows: a second capture (15 s), in the slow suite
def test_captured_step_gives_the_logits_of_eager_decoding(gqa_model, captured_gqa, prompts):
    """One prompt (the one-row form), then four left-padded ones (the several-row form, traced with 2); a cache
    length other than the traced 37."""
    model, _ = gqa_model
    forced = [5, 0, 12, 7, 7, 1]
    eager = forced_logits(EagerDecoding(model), prompts, forced)
    got = forced_logits(captured_gqa, prompts, forced)
    for step, (a, b) in enumerate(zip(eager, got, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10, msg=f"step {step}")


@needs_compiler
def test_two_captures_serve_every_batch_size_and_length_through_a_sliding_window(gqa_model, captured_gqa, monkeypatch):
    """One row, then four; 30 new tokens outgrow the context of 24, so the window slides into a shorter cache. The
    tokens are the eager model's, and every token after a (re)fill of the cache came from a step of the captured
    package for that batch size: none from an eager step."""
    model, config = gqa_model
    prefills, prefill = [], captured_gqa.prefill
    monkeypatch.setattr(captured_gqa, "prefill", lambda *args: prefills.append(1) or prefill(*args))
    for prompts, form in ((PROMPTS[:1], "one-row"), (PROMPTS, "rows")):
        eager = generate_tokens(model, prompts, max_new_tokens=30, context_len=config.max_seq_len)
        steps, prefills[:] = dict(captured_gqa.steps_run), []
        assert generate_tokens(model, prompts, max_new_tokens=30, context_len=config.max_seq_len,
                               decoding=captured_gqa) == eager
        ran = {name: count - steps[name] for name, count in captured_gqa.steps_run.items()}
        assert ran[form] == 30 - len(prefills) and ran[form] > 20 and sum(ran.values()) == ran[form], ran
    assert set(captured_gqa.capture_s) == {"one-row", "rows"}
    assert all(path.is_file() for path in captured_gqa.package_paths.values())


@needs_compiler
def test_a_second_start_loads_the_kept_package(gqa_model, captured_gqa, package_dir, monkeypatch):
    def no_capture(*args, **kwargs):
        raise AssertionError("captured again although the package was kept")

    monkeypatch.setattr(captured, "capture_step", no_capture)
    again = CapturedDecoding(gqa_model[0], package_dir=package_dir)
    assert again.package_paths == captured_gqa.package_paths
    for prompts in (PROMPTS[:1], PROMPTS):
        assert generate_tokens(gqa_model[0], prompts, max_new_tokens=5, context_len=24, decoding=again) == \
            generate_tokens(gqa_model[0], prompts, max_new_tokens=5, context_len=24)
    assert again.capture_s == {} and set(again.load_s) == {"one-row", "rows"}


def test_row_products_compute_linear_and_int8_products():
    torch.manual_seed(0)
    x, weight, bias = torch.randn(1, 1, 48), torch.randn(20, 48), torch.randn(20)
    torch.testing.assert_close(row_products(x, weight, bias), torch.nn.functional.linear(x, weight, bias))
    rows = torch.randn(1, 64).to(torch.bfloat16)
    int8 = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
    scales = (torch.rand(32) / 100).to(torch.bfloat16)
    torch.testing.assert_close(row_int8_products(rows, int8, scales).float(),
                               torch._weight_int8pack_mm(rows, int8, scales).float(), rtol=2e-2, atol=2e-2)


@needs_compiler
def test_another_checkpoint_of_the_architecture_shares_the_package_with_its_own_weights(gqa_model, captured_gqa,
                                                                                       package_dir, monkeypatch):
    """The library reads the weights from the model it is loaded for, not from the capture: a model with other
    weights loads the same package, captures nothing, and decodes with its own weights."""
    monkeypatch.setattr(captured, "capture_step", lambda *args: pytest.fail("captured again"))
    other, config = tiny_model(position="learned", seed=7, n_kv_heads=2)
    decoding = CapturedDecoding(other, package_dir=package_dir)
    assert decoding.package_paths == captured_gqa.package_paths
    for prompts in (PROMPTS[:1], PROMPTS):
        assert generate_tokens(other, prompts, max_new_tokens=8, context_len=config.max_seq_len,
                               decoding=decoding) == generate_tokens(other, prompts, max_new_tokens=8,
                                                                     context_len=config.max_seq_len)
    assert generate_tokens(other, PROMPTS, max_new_tokens=8, context_len=config.max_seq_len) != \
        generate_tokens(gqa_model[0], PROMPTS, max_new_tokens=8, context_len=config.max_seq_len)


def test_the_package_name_follows_structure_settings_dtype_and_threads_not_weights():
    model, _ = tiny_model(position="rope")
    assert package_digest(model) == package_digest(tiny_model(position="rope", seed=3)[0])
    assert package_digest(model) != package_digest(tiny_model(position="learned")[0])
    assert package_digest(model) != package_digest(tiny_model(position="rope", norm_eps=1e-6)[0])
    assert package_digest(model) != package_digest(tiny_model(position="rope")[0].float())
    threads, before = torch.get_num_threads(), package_digest(model)
    try:  # inductor writes parallel loops only for more than one thread
        torch.set_num_threads(threads + 1)
        assert package_digest(model) != before
    finally:
        torch.set_num_threads(threads)


def test_the_package_name_follows_the_source_a_step_can_run_not_the_layers_above(tmp_path, monkeypatch):
    """An edit to the server or to training keeps the kept packages; one to the layers, the models or generate's
    decoding captures again, and so does one to a module class of the model's own, wherever its file lives."""
    model, _ = tiny_model(position="rope")
    sources = {path.relative_to(captured.PACKAGE).as_posix() for path in captured.step_sources(model)
               if path.is_relative_to(captured.PACKAGE)}
    assert {"layers/attention.py", "models/decoder.py", "generate/static_decode.py", "config.py"} <= sources
    assert not {"serve/app.py", "train/trainer.py", "cli.py", "inspect/tracing.py"} & sources
    own = tmp_path / "own_head.py"
    own.write_text("from torch import nn\nclass OwnHead(nn.Identity):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from own_head import OwnHead

    before = package_digest(model)
    model.own = OwnHead()
    assert own in captured.step_sources(model)
    with_own = package_digest(model)
    own.write_text(own.read_text() + "# edited\n")
    assert package_digest(model) != with_own != before


def test_without_a_compiler_capture_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    model, _ = tiny_model(position="rope")
    with pytest.raises(InputError, match="no-such-compiler is not on PATH") as refusal:
        CapturedDecoding(model, package_dir=tmp_path)
    assert "\n" not in str(refusal.value)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_a_failed_capture_is_one_line_and_leaves_no_package(tmp_path, monkeypatch):
    def broken_export(*args, **kwargs):
        raise RuntimeError("an operator torch.export cannot trace\nand its long explanation")

    monkeypatch.setattr(torch.export, "export", broken_export)
    model, _ = tiny_model(position="rope")
    with pytest.raises(InputError, match=r"could not capture DecoderLM's decoding step \(an operator torch.export "
                                         r"cannot trace\); use compile=True"):
        CapturedDecoding(model, package_dir=tmp_path)
    assert not list(tmp_path.glob("*.pt2"))


def test_aot_plans_a_captured_step_for_decoders_and_compiled_blocks_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv(captured.PACKAGE_DIR_ENV, str(tmp_path))
    decoder, _ = tiny_model(position="rope")
    compilation = {c.what: c for c in plan_inference(decoder, "decoder", compile="aot").choices}["compilation"]
    assert "captured ahead of time" in compilation.choice and str(tmp_path) in compilation.why
    encoder, _ = tiny_model(family="encoder")
    compilation = {c.what: c for c in plan_inference(encoder, "encoder", compile="aot").choices}["compilation"]
    assert compilation.choice == "each block, default"
    windowed, _ = tiny_model(position="rope", attention_window=4)
    assert type(decoding_for(windowed, "aot")) is EagerDecoding  # no fixed-shape step with a rolling cache


@needs_compiler
@pytest.mark.slow  # a capture of its own (16 s)
def test_int8_weights_decode_through_the_captured_loop(tmp_path):
    """The one-row form turns int8 products (`_weight_int8pack_mm`) into a reduction over the int8 bytes: the same
    logits as the eager int8 model, within bf16's rounding (products in bf16 there, accumulated in float32 here;
    logits of 2-5, differences up to 0.06 measured; a wrong scale or row would differ by whole units)."""
    model, _ = tiny_model(position="learned", seed=2)
    prepare_for_inference(model.float(), "decoder", quantize="int8", compile="aot")
    forced = [5, 0, 12, 7]
    eager = forced_logits(EagerDecoding(model), PROMPTS[1:2], forced)
    got = forced_logits(CapturedDecoding(model, package_dir=tmp_path), PROMPTS[1:2], forced)
    for step, (a, b) in enumerate(zip(eager, got, strict=True)):
        torch.testing.assert_close(b.float(), a.float(), rtol=0, atol=0.15, msg=f"step {step}")


def test_steps_with_pytorchs_int4_weights_are_compiled_by_torch_compile_instead(tmp_path, monkeypatch):
    """Where the native kernels cannot run, --int4 takes PyTorch's kernel, whose step cannot be captured."""
    monkeypatch.setattr(native_gemv, "unavailable", lambda cpu=None: "no C compiler (for this test)")
    model, _ = tiny_model(position="learned", d_model=64, d_ff=128)
    plan = plan_inference(model.to(torch.bfloat16), "decoder", quantize="int4", compile="aot")
    if plan.linear != "int4":
        pytest.skip(f"the plan chose {plan.linear} weights on this CPU (PyTorch's int4 kernel is not vectorized here)")
    compiled = plan_inference(model, "decoder", quantize="int4", compile=True)
    assert plan.math_kernel == compiled.math_kernel  # the attention torch.compile's step gets, not the captured one's
    plan.apply(model)
    compilation = {c.what: c for c in plan.choices}["compilation"]
    assert compilation.choice == "decoding step, default (torch.compile)" and "int4" in compilation.why
    assert type(decoding_for(model, "aot")) is StaticDecoding
    with pytest.raises(InputError, match="int4 weights cannot be captured"):
        CapturedDecoding(model, package_dir=tmp_path)


@needs_compiler
@pytest.mark.slow  # captures of its own (20 s each)
def test_native_int4_weights_are_captured_through_their_operator(tmp_path):
    """--int4 --compile aot: the captured step calls the native 4-bit product as an operator
    (attnkit::native_int4_product, run by the package's proxy executor) and gives the eager native model's logits, for
    one row and for four (the several-row step, whose batch size is symbolic: the operator applies the row limit when
    it runs, where a limit read while tracing could not be exported)."""
    if native_gemv.unavailable() is not None:
        pytest.skip(f"the native kernels cannot run here: {native_gemv.unavailable()}")
    model, _ = tiny_model(position="learned", d_model=64, d_ff=128, seed=3)
    plan = plan_inference(model.float(), "decoder", quantize="int4", compile="aot")
    assert plan.linear == "int4-native" and "cannot be captured" in plan.explain()
    plan.apply(model)
    forced = [5, 0, 12, 7]
    decoding = CapturedDecoding(model, package_dir=tmp_path)
    for prompts, form in ((PROMPTS[1:2], "one-row"), (PROMPTS, "rows")):
        eager = forced_logits(EagerDecoding(model), prompts, forced)
        got = forced_logits(decoding, prompts, forced)
        for step, (a, b) in enumerate(zip(eager, got, strict=True)):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-4, msg=f"{form} step {step}")
        assert decoding.steps_run[form] == len(forced)
