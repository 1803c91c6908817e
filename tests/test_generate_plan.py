"""The inference plan: each choice follows the CPU's capabilities and the profile it is given, so these tests run the
same on any machine (the CPUs are described, not detected); and a planned model gives the numbers of the model as
built."""

import json
import logging
import statistics
from pathlib import Path

import pytest
import torch
from attention_paths import VARIANTS, explained_kernels, spy_on_attention
from described_cpus import AVX2, AVX512, AVX512_BF16, BASELINE, NE_CONVERT
from generate_models import tiny_model

from attnkit import ModelConfig, build_model, cli
from attnkit.checkpoint import save_model
from attnkit.errors import InputError
from attnkit.generate import decode_layout, native_gemv, tune
from attnkit.generate.decode_layout import GemvPackedLinear, TransposedLinear
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.plan import CAPTURED_SERVING, plan_inference
from attnkit.generate.tune import choose_layout, longest_win
from attnkit.generate.tune import tune as tune_machine
from attnkit.layers.attention import Attention
from attnkit.machine import (
    DEFAULT_PROFILE,
    AttentionKernelLimits,
    CpuCapabilities,
    Profile,
    default_profile_path,
    load_profile,
)
from attnkit.tokenize import CharTokenizer

GEMV_PACKED = Profile(attention={}, decode_linear={"bf16": "gemv+packed"}, source="test")
TRANSPOSED = Profile(attention={}, decode_linear={"fp32": "transposed"}, source="test")
PYTORCH_KERNELS = Profile(attention={}, decode_linear={"int8": "pytorch", "int4": "pytorch"}, source="test")


def _decoder(dtype=torch.float32):
    config = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, position="rope",
                         max_seq_len=64)
    torch.manual_seed(0)
    return build_model(config).to(dtype).eval()


def _encoder():
    config = ModelConfig(family="encoder", vocab_size=50, d_model=32, n_layers=1, n_heads=4, d_ff=64, n_classes=3,
                         max_seq_len=64)
    return build_model(config).eval()


@pytest.mark.parametrize(("cpu", "said"), [
    (AVX2, "oneDNN packs bf16: no; bf16 arithmetic: no; int4 kernel vectorized: yes; int8 VNNI: no; "
           "compiled int8 loops vectorized: no"),
    (AVX512_BF16, "oneDNN packs bf16: yes; bf16 arithmetic: yes; int4 kernel vectorized: yes; int8 VNNI: yes; "
                  "compiled int8 loops vectorized: yes")])
def test_explain_says_what_the_cpu_supports_as_the_plan_reads_it(cpu, said):
    """The plan's first line is the one record of the machine it planned from: the flags, and each path they allow."""
    header = plan_inference(_decoder(), "decoder", cpu=cpu, profile=DEFAULT_PROFILE).explain().splitlines()[0]
    assert header.endswith(said), header


def test_capabilities_say_what_each_path_needs():
    assert not AVX2.onednn_bf16 and not AVX2.native_bf16 and not AVX2.vnni
    assert AVX512.onednn_bf16 and not AVX512.native_bf16
    assert AVX512_BF16.onednn_bf16 and AVX512_BF16.native_bf16 and AVX512_BF16.vnni
    assert NE_CONVERT.onednn_bf16 and NE_CONVERT.vnni and not NE_CONVERT.native_bf16
    # inductor widens int8 to float in vectors only with AVX-512 (a captured one-row int8 step ran at 0.07x llama.cpp's
    # q8_0 under AVX2, where its loop is scalar)
    assert AVX512.int8_loops_vectorized and not AVX2.int8_loops_vectorized and not NE_CONVERT.int8_loops_vectorized
    assert not BASELINE.int8_loops_vectorized and not BASELINE.int4_kernel
    detected = CpuCapabilities.detect()
    assert detected.isa == torch.backends.cpu.get_cpu_capability()
    assert CpuCapabilities.from_dict(json.loads(json.dumps(detected.to_dict()))) == detected


@pytest.mark.parametrize(("cpu", "packs"), [(AVX2, False), (AVX512, True), (AVX512_BF16, True), (NE_CONVERT, True)])
def test_bf16_decoding_packs_weights_only_where_onednn_can(cpu, packs):
    plan = plan_inference(_decoder(torch.bfloat16), "decoder", cpu=cpu, profile=GEMV_PACKED)
    assert plan.linear == ("gemv+packed" if packs else "plain")
    explained = plan.explain()
    assert cpu.isa in explained.splitlines()[0]
    if not packs:
        assert "AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT" in explained
    assert ("converted to fp32 inside each product" in explained) == (not cpu.native_bf16)


@pytest.mark.parametrize(("cpu", "compile", "layout"), [(AVX2, False, "plain"), (AVX512, False, "gemv+packed"),
                                                       (NE_CONVERT, False, "gemv+packed"), (AVX512, True, "plain")])
def test_single_rows_take_atens_kernel_where_the_profile_measured_it_fastest(cpu, compile, layout):
    plan = plan_inference(_decoder(torch.bfloat16), "decoder", compile=compile, cpu=cpu, profile=GEMV_PACKED)
    assert plan.linear == layout
    assert ("each weight held twice" in plan.explain()) == (layout == "gemv+packed")


@pytest.mark.parametrize(("compile", "layout"), [(False, "gemv"), (True, "plain")])
def test_bf16_single_rows_take_atens_fp32_kernel_where_onednn_cannot_pack_and_it_measured_fastest(compile,
                                                                                                     layout):
    measured = Profile(attention={}, decode_linear={"bf16": "gemv"}, timings={"linear bf16": {"plain": 0.9,
                                                                                                "gemv": 0.3}})
    plan = plan_inference(_decoder(torch.bfloat16), "decoder", compile=compile, cpu=AVX2, profile=measured)
    assert plan.linear == layout
    if layout == "gemv":
        assert "gemv 0.300 ms, plain 0.900 ms" in plan.explain() and "computed in fp32" in plan.explain()
        model = plan.apply(_decoder(torch.bfloat16))
        assert any(type(m).__name__ == "GemvLinear" for m in model.modules())


def test_bf16_plan_runs_on_this_cpu_and_gives_the_models_numbers():
    model = _decoder(torch.bfloat16)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    plan = plan_inference(model, "decoder", profile=GEMV_PACKED)  # this machine's CPU, whatever it has
    plan.apply(model)
    assert any(isinstance(m, GemvPackedLinear) for m in model.modules()) == CpuCapabilities.detect().onednn_bf16
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, atol=2e-2, rtol=2e-2)


def test_fp32_layout_and_attention_kernel_follow_the_profile():
    measured = Profile(attention={"bf16": AttentionKernelLimits(decode_keys=256, pass_keys=0)},
                       decode_linear={"fp32": "plain", "bf16": "plain"}, cpu=AVX2, source="test")
    assert plan_inference(_decoder(), "decoder", cpu=AVX2, profile=measured).linear == "plain"
    assert plan_inference(_decoder(), "decoder", cpu=AVX2, profile=TRANSPOSED).linear == "transposed"
    bf16 = plan_inference(_decoder(torch.bfloat16), "decoder", cpu=AVX2, profile=measured)
    assert bf16.math_kernel is not None and bf16.math_kernel.limits.decode_keys == 256
    assert plan_inference(_decoder(), "decoder", cpu=AVX2, profile=measured).math_kernel is None  # fp32: SDPA
    no_math = Profile(attention={}, decode_linear={}, source="test")
    assert plan_inference(_decoder(torch.bfloat16), "decoder", cpu=AVX2, profile=no_math).math_kernel is None


def test_applied_plan_sets_every_attention_layers_kernel_and_layout():
    model = _decoder()
    plan = plan_inference(model, "decoder", cpu=AVX2, profile=TRANSPOSED)
    plan.apply(model)
    assert any(isinstance(m, TransposedLinear) for m in model.modules())
    assert all(m.math_kernel is plan.math_kernel for m in model.modules() if isinstance(m, Attention))
    assert all(m.qkv_proj is not None for m in model.modules() if isinstance(m, Attention))


def test_models_that_do_not_decode_keep_their_layers():
    plan = plan_inference(_encoder(), "encoder", cpu=AVX512, profile=DEFAULT_PROFILE)
    assert plan.linear == "plain" and not plan.fuse_qkv
    assert "does not decode" in plan.explain()


def test_compiled_and_quantized_plans_say_so():
    compiled = plan_inference(_decoder(torch.bfloat16), "decoder", compile=True, cpu=AVX512, profile=DEFAULT_PROFILE)
    assert compiled.linear == "plain" and compiled.static_decoding and "decoding step" in compiled.explain()
    autotuned = plan_inference(_decoder(), "decoder", compile="max-autotune", cpu=AVX512, profile=DEFAULT_PROFILE)
    assert autotuned.linear == "plain"
    quantized = plan_inference(_decoder(), "decoder", quantize="int8", cpu=AVX2, profile=DEFAULT_PROFILE)
    assert quantized.linear == "int8-native"
    compiled = plan_inference(_decoder(), "decoder", quantize="int8", compile=True, cpu=AVX2, profile=DEFAULT_PROFILE)
    assert compiled.linear == "int8" and "compiles PyTorch's product into its own loops" in compiled.explain()
    with pytest.raises(InputError, match="not supported"):
        plan_inference(_decoder(), "decoder", quantize="int3")
    with pytest.raises(InputError, match="runs eagerly"):
        plan_inference(_decoder(), "decoder", quantize="int8-dynamic", compile=True)


@pytest.mark.parametrize(("cpu", "form"), [(AVX2, "int4"), (AVX512_BF16, "int4"), (BASELINE, "int8")])
def test_int4_is_planned_only_where_the_int4_kernel_is_vectorized(cpu, form):
    plan = plan_inference(_decoder(), "decoder", quantize="int4", cpu=cpu, profile=PYTORCH_KERNELS)
    assert plan.linear == form
    explained = plan.explain()
    assert ("vectorized only for AVX2 and AVX-512" in explained) == (form == "int8")


@pytest.mark.parametrize(("form", "profile", "linear", "padded"), [
    ("int4", PYTORCH_KERNELS, "int4", "40 -> 64, 172 -> 192"),
    ("int8", PYTORCH_KERNELS, "int8", "40 -> 48, 172 -> 176"),
    ("int4", DEFAULT_PROFILE, "int4-native", "40 -> 64, 172 -> 192"), ("int8", DEFAULT_PROFILE, "int8-native", None)])
def test_quantized_plans_name_the_in_widths_their_kernels_get_padded(form, profile, linear, padded):
    """d_model 40 and d_ff 172 are not multiples of int4's groups of 32 or of the 16 inputs PyTorch's int8 kernel reads
    at a time: both stay in the form asked for, with zero inputs up to the next multiple, and say so; the native int8
    kernel takes every width as it is."""
    config = ModelConfig(vocab_size=50, d_model=40, n_layers=1, n_heads=4, d_ff=172, max_seq_len=64)
    plan = plan_inference(build_model(config).eval(), "decoder", quantize=form, cpu=AVX2, profile=profile)
    assert plan.linear == linear
    assert (f"in-widths padded with zero inputs ({padded})" in plan.explain()) if padded else \
        "padded" not in plan.explain()
    config = ModelConfig(vocab_size=50, d_model=64, n_layers=1, n_heads=4, d_ff=128, max_seq_len=64)
    plan = plan_inference(build_model(config).eval(), "decoder", quantize=form, cpu=AVX2, profile=profile)
    assert "padded" not in plan.explain()


def test_int4_is_refused_off_the_cpu():
    with pytest.raises(InputError, match="CPU only"):
        plan_inference(_decoder().to("meta"), "decoder", quantize="int4")


def test_bf16_cost_is_stated_from_the_profile_where_it_was_measured():
    measured = Profile(attention={}, decode_linear={}, dtype_speed={"bf16": 2.4}, source="test")
    text = plan_inference(_decoder(torch.bfloat16), "decoder", cpu=AVX2, profile=measured).explain()
    assert "2.40x fp32's time" in text and "--dtype fp32" in text
    native = plan_inference(_decoder(torch.bfloat16), "decoder", cpu=AVX512_BF16, profile=measured).explain()
    assert "converted to fp32" not in native


def test_profiles_round_trip_and_apply_only_to_the_cpu_they_were_measured_on(tmp_path):
    cpu = CpuCapabilities.detect()
    profile = Profile(attention={"bf16": AttentionKernelLimits(64, 32)}, decode_linear={"fp32": "plain"},
                      dtype_speed={"bf16": 1.5}, cpu=cpu, torch_version=torch.__version__)
    path = tmp_path / "profile.json"
    path.write_text(profile.to_json())
    loaded, why = load_profile(path, cpu=cpu)
    assert loaded.attention == profile.attention and loaded.decode_linear == profile.decode_linear
    assert "measured on this machine" in why
    other, why = load_profile(path, cpu=AVX512_BF16 if cpu != AVX512_BF16 else AVX2)
    assert other is DEFAULT_PROFILE and "another CPU" in why
    missing, why = load_profile(tmp_path / "none.json")
    assert missing is DEFAULT_PROFILE and "attnkit tune" in why
    path.write_text("{not json")
    with pytest.raises(InputError, match="attnkit tune"):
        load_profile(path)


def test_tune_writes_a_profile_the_plan_then_reads(tmp_path, monkeypatch, capsys):
    path = tmp_path / "profile.json"
    assert cli.main(["tune", "--quick", "--out", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "attention decode" in printed and f"wrote {path}" in printed
    profile, why = load_profile(path)
    assert "measured on this machine" in why and set(profile.decode_linear) == {"fp32", "bf16", "int8", "int4"}
    packs = CpuCapabilities.detect().onednn_bf16
    assert profile.decode_linear["bf16"] in (("plain", "packed", "gemv+packed", "native+packed") if packs else
                                             ("plain", "gemv", "native"))
    assert set(profile.timings["linear int8"]) == {"pytorch", "native"}  # both kernels measured (this CPU has AVX2)
    monkeypatch.setenv("ATTNKIT_PROFILE", str(path))
    plan = plan_inference(_decoder(torch.bfloat16), "decoder")
    assert str(path) in plan.explain()
    assert plan.math_kernel is None or plan.math_kernel.limits == profile.attention["bf16"]


def test_tune_packs_each_bf16_weight_once_and_times_each_product_at_the_rows_a_layout_sends_it(monkeypatch):
    """The bf16 layouts share their products: `packed`, `gemv+packed` and `native+packed` send eight rows to one
    packed weight, and one row to the packed weight, ATen's kernel and the native one. Each weight is packed once, each
    product timed once at each row count some layout sends it, and every layout gets both times from them."""
    cpu = CpuCapabilities.detect()
    if not cpu.onednn_bf16 or native_gemv.unavailable(cpu) is not None:
        pytest.skip(f"oneDNN packs no bf16 weights here, or the native kernels cannot run ({cpu.summary()})")
    packed, pack = [], decode_layout.PackedLinear.__init__
    monkeypatch.setattr(decode_layout.PackedLinear, "__init__",
                        lambda self, linear: packed.append(linear) or pack(self, linear))
    timed, time_products = {}, tune._time_layouts
    monkeypatch.setattr(tune, "_time_layouts", lambda products, *args, rows=1: timed.setdefault(rows, []).append(
        set(products)) or time_products(products, *args, rows=rows))
    one, eight, table = tune.measure_linear(torch.bfloat16, cpu, tune.QUICK)
    linears, _ = tune.decoding_layers(tune.QUICK, torch.bfloat16)
    assert len(packed) == len(linears)  # once per weight
    assert timed == {1: [{"plain", "packed", "gemv", "native"}], 8: [{"plain", "packed"}]}
    layouts = {"plain", "packed", "gemv+packed", "native+packed"}
    assert set(one) == set(eight) == layouts and len(table) == len(layouts)
    assert eight["gemv+packed"] == eight["native+packed"] == eight["packed"] != eight["plain"]


def test_tune_reads_back_the_profile_it_writes_and_keeps_the_old_one_where_it_does_not_read(tmp_path, monkeypatch,
                                                                                          capsys):
    """A profile that would not read back (here a layout the plan does not know) is refused, naming the field, before
    it replaces the one kept; what `tune` reports is what the plan will read."""
    path = tmp_path / "profile.json"
    kept = Profile(attention={"bf16": AttentionKernelLimits(64, 32)}, decode_linear={"fp32": "plain", "bf16": "plain"},
                   dtype_speed={"bf16": 1.0}, cpu=CpuCapabilities.detect(), torch_version=torch.__version__)
    path.write_text(kept.to_json())
    unreadable = Profile(attention={"bf16": AttentionKernelLimits(64, 32)},
                         decode_linear={"fp32": "sideways", "bf16": "plain"}, dtype_speed={"bf16": 1.0},
                         cpu=kept.cpu, torch_version=torch.__version__)
    monkeypatch.setattr(tune, "tune", lambda **kw: (unreadable, []))
    assert cli.main(["tune", "--quick", "--out", str(path)]) == 2
    assert "decode_linear" in capsys.readouterr().err and path.read_text() == kept.to_json()
    monkeypatch.setattr(tune, "tune", lambda **kw: (kept, []))
    assert cli.main(["tune", "--quick", "--out", str(path)]) == 0
    assert load_profile(path)[0].decode_linear == kept.decode_linear


def test_the_first_plan_on_a_cpu_measures_it_once_and_keeps_what_it_measured(tmp_path, monkeypatch, caplog):
    """No profile kept for this CPU: the first plan measures (here within tune's QUICK budget, the same path as
    FIRST_USE's few seconds), logs it, keeps the profile under the cache, and shows the figures; the second plan
    reads it without measuring. A damaged kept profile is measured again."""
    monkeypatch.delenv("ATTNKIT_PROFILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tune, "FIRST_USE", tune.QUICK)
    measured = []
    monkeypatch.setattr(tune, "tune", lambda **kw: measured.append(kw) or tune_machine(**kw))
    cpu = CpuCapabilities.detect()
    path = default_profile_path(cpu)
    assert path.parent == tmp_path / "attnkit" / "profiles" and not path.exists()
    with caplog.at_level(logging.INFO, logger="attnkit.generate.tune"):
        first = plan_inference(_decoder(), "decoder").explain()
    assert len(measured) == 1 and path.is_file() and "measuring this CPU" in caplog.text
    assert "measured on this machine on first use" in first and " ms" in first  # the figures it chose by
    assert load_profile(path, cpu)[0].timings["linear fp32"]
    second = plan_inference(_decoder(), "decoder").explain()
    assert len(measured) == 1 and f"measured on this machine ({path})" in second
    path.write_text('{"version": 1, "attention": "a lot"}')
    plan_inference(_decoder(), "decoder")
    assert len(measured) == 2 and load_profile(path, cpu)[0].decode_linear
    other = AVX2 if cpu != AVX2 else AVX512  # a plan for a described CPU: this machine's figures would not be its
    assert "documented defaults" in plan_inference(_decoder(), "decoder", cpu=other).explain()
    assert len(measured) == 2 and not default_profile_path(other).exists()


def test_each_cpu_level_and_pytorch_keeps_a_profile_of_its_own(monkeypatch):
    monkeypatch.delenv("ATTNKIT_PROFILE", raising=False)
    paths = {default_profile_path(cpu) for cpu in (AVX2, AVX512, AVX512_BF16, NE_CONVERT)}
    assert len(paths) == 4 and all(path.parent.name == "profiles" for path in paths)
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert default_profile_path(AVX2) not in paths


def test_longest_win_stops_at_the_first_loss():
    assert longest_win((64, 128, 256), [True, True, False]) == 128
    assert longest_win((64, 128, 256), [False, True, True]) == 0
    assert longest_win((64, 128), [True, True]) == 128


def test_generate_explain_prints_the_plan_with_the_cpus_capabilities(tmp_path, capsys):
    tokenizer = CharTokenizer("abcdefgh ")
    model, config = tiny_model("decoder", vocab_size=tokenizer.vocab_size, position="rope", seed=1)
    save_model(model, config, tmp_path / "run")
    tokenizer.save(tmp_path / "run" / "tokenizer")
    code = cli.main(["generate", "--run", str(tmp_path / "run"), "--prompt", "ab", "--max-new-tokens", "3",
                     "--dtype", "bf16", "--device", "cpu", "--explain", "--seed", "0"])
    assert code == 0
    err = capsys.readouterr().err
    assert "inference plan for bf16" in err and torch.backends.cpu.get_cpu_capability() in err
    assert "linear layers" in err and "attention" in err


def test_tune_refuses_a_place_it_cannot_write_before_measuring(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert cli.main(["tune", "--quick", "--out", str(tmp_path / "file" / "profile.json")]) == 2
    out, err = capsys.readouterr()
    assert "measuring" not in out and "file" in err


def test_a_layout_that_ties_at_one_row_is_chosen_by_eight_rows():
    """One-row times within 10% of the fastest are a tie (two timings of one kernel differ that much on a busy
    machine), broken by eight rows; a clear one-row winner is kept whatever eight rows cost."""
    one, eight = {"plain": 1.00, "gemv": 1.01, "native": 1.08}, {"plain": 9.0, "gemv": 8.0, "native": 4.0}
    assert choose_layout(one, eight) == "native"
    assert choose_layout({**one, "native": 1.2}, eight) == "gemv"
    assert choose_layout({"plain": 0.5, "native": 1.0}, eight) == "plain"


def test_layouts_whose_eight_rows_share_one_product_are_told_apart_by_one_row():
    """packed, gemv+packed and native+packed send eight rows to one packed weight, so their eight-row times are one
    number: the one-row time decides among them, whatever order they were measured in (a profile on an AVX512-BF16
    EPYC kept packed, the first measured, over native+packed, 2% faster at one row here and 1.3x faster end to end
    on the 6x384 decoder)."""
    one = {"plain": 14.85, "packed": 12.97, "gemv+packed": 14.61, "native+packed": 12.69}
    eight = {"plain": 21.74} | dict.fromkeys(("packed", "gemv+packed", "native+packed"), 11.05)
    assert choose_layout(one, eight) == "native+packed"
    assert choose_layout(dict(reversed(one.items())), eight) == "native+packed"
    assert choose_layout({**one, "packed": 12.5}, eight) == "packed"


@pytest.mark.parametrize(("one", "chosen", "said"), [
    ({"plain": 1.00, "transposed": 1.05, "native": 1.08}, "native", "chosen for decoding in fp32 by the tie rule: "
     "one row within 1.1x of the "
     "fastest's (plain), and the fastest of those for 8 rows"),
    ({"plain": 1.00, "transposed": 1.05, "native": 0.90}, "native", "measured fastest for decoding in fp32"),
    ({"plain": 1.00, "transposed": 0.50, "native": 1.08}, "transposed", "measured fastest for decoding in fp32"),
])
def test_the_plan_says_when_the_tie_rule_chose_the_layout_and_not_one_row_alone(one, chosen, said):
    """`--explain` calls a layout measured fastest only where it was the fastest for one row; where the tie rule
    (`choose_layout`: one-row times within 10%, broken by eight rows) chose it, it says so and names the faster one."""
    eight = {"plain": 9.0, "transposed": 8.0, "native": 4.0}
    profile = Profile(attention={}, decode_linear={"fp32": choose_layout(one, eight)}, source="test",
                      timings={"linear fp32": one, "linear fp32, 8 rows": eight})
    assert profile.decode_linear["fp32"] == chosen
    if chosen == "native" and native_gemv.unavailable() is not None:
        pytest.skip(f"the native kernels cannot run here: {native_gemv.unavailable()}")
    why = {c.what: c for c in plan_inference(_decoder(), "decoder", profile=profile).choices}["linear layers"].why
    assert why.startswith(said) and ("measured fastest" in why) == ("tie rule" not in said), why


def test_the_tie_rule_is_said_where_the_cpu_narrows_the_layout_it_chose():
    """A bf16 profile that kept native+packed by the tie rule, read for a CPU where oneDNN cannot pack (native alone):
    the reason still says the tie rule chose, not that native was measured fastest."""
    one = {"plain": 1.0, "packed": 1.2, "gemv+packed": 1.1, "native+packed": 1.05}
    eight = {"plain": 9.0, "packed": 4.0, "gemv+packed": 4.0, "native+packed": 4.0}
    profile = Profile(attention={}, decode_linear={"bf16": choose_layout(one, eight)}, source="test",
                      timings={"linear bf16": one, "linear bf16, 8 rows": eight})
    plan = plan_inference(_decoder(torch.bfloat16), "decoder", cpu=AVX2, profile=profile)
    why = {c.what: c for c in plan.choices}["linear layers"].why
    assert plan.linear == "native" and why.startswith("chosen for decoding in bf16 by the tie rule"), why


@pytest.mark.parametrize("profile", [PYTORCH_KERNELS, DEFAULT_PROFILE])  # int8's kernel measured: PyTorch's, native
def test_a_captured_int8_step_says_how_it_reads_the_weights_where_inductors_int8_loops_are_vectorized(profile):
    """With AVX-512 the captured one-row step reads int8 weights in inductor's own loop (`capture_step` decomposes
    PyTorch's product there) and the several-row step calls PyTorch's kernel; the plan says both, whichever kernel the
    profile measured faster for eager decoding."""
    plan = plan_inference(_decoder(), "decoder", quantize="int8", compile="aot", cpu=AVX512, profile=profile)
    why = {c.what: c for c in plan.choices}["linear layers"].why
    assert plan.linear == "int8" and "one row in inductor's own loop, vectorized on this CPU" in why, why
    assert "PyTorch's kernel for several" in why, why


@pytest.mark.parametrize(("cpu", "quantize", "linear"), [
    (AVX512, "int4", "int4-native"), (AVX2, "int4", "int4-native"),  # PyTorch's int4 product cannot be captured
    (AVX2, "int8", "int8-native"), (AVX512, "int8", "int8")])  # inductor's int8 loop is scalar without AVX-512
def test_a_captured_step_calls_the_native_kernel_where_pytorchs_cannot_serve_it(cpu, quantize, linear):
    plan = plan_inference(_decoder(), "decoder", quantize=quantize, compile="aot", cpu=cpu, profile=PYTORCH_KERNELS)
    assert plan.linear == linear
    assert ("the captured step calls it as an operator" in plan.explain()) == linear.endswith("native")
    compilation = {c.what: c for c in plan.choices}["compilation"].choice
    assert compilation == "decoding step captured ahead of time (AOTInductor)"


@pytest.mark.parametrize(("model", "family", "captures"), [
    (_decoder, "decoder", True), (lambda: _windowed(), "decoder", False), (_encoder, "encoder", False)])
def test_an_eager_plan_names_the_captured_step_where_the_models_step_can_be_captured(model, family, captures):
    """Eager decoding is the default (capturing a step runs the C++ compiler for tens of seconds on a first start),
    and `--explain` says so: it names `--compile aot` where this model's decoding step can be captured (a decoder
    without sliding windows), and nothing it could not take elsewhere."""
    why = {c.what: c for c in plan_inference(model(), family).choices}["compilation"]
    assert why.choice == "eager" and why.why.startswith("not asked for")
    assert ("--compile aot captures this model's decoding step" in why.why) == captures, why.why


def test_the_eager_plans_serving_figures_are_those_its_results_file_records():
    """The eager choice's reason quotes the captured step's measured serving gain and start time
    (`plan.CAPTURED_SERVING`): they are the median of the rounds' ratios and the ranges the results file holds."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "serve-captured-cpu.json"
    rows = json.loads(results.read_text())["rows"]

    def tokens(form: str, clients: int, round_: int) -> float:
        return next(r["tokens_per_s"] for r in rows if (r["form"], r["clients"], r["round"]) == (form, clients, round_))

    rounds = sorted({r["round"] for r in rows})
    speedups = tuple(round(statistics.median(tokens("compile aot", c, i) / tokens("fp32", c, i) for i in rounds), 2)
                     for c in CAPTURED_SERVING["clients"])
    starts = {form: sorted({round(r["start_s"]) for r in rows if r["form"] == form})
              for form in ("compile aot", "fp32")}
    assert speedups == CAPTURED_SERVING["speedup"]
    assert (starts["compile aot"][0], starts["compile aot"][-1]) == CAPTURED_SERVING["start_s"]
    assert (starts["fp32"][0], starts["fp32"][-1]) == CAPTURED_SERVING["eager_start_s"]
    why = {c.what: c for c in plan_inference(_decoder(), "decoder").choices}["compilation"].why
    assert f"{speedups[0]}x at 1 client and {speedups[1]}x at 4 clients" in why, why


def _windowed():
    config = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64,
                         **VARIANTS["window"])
    return build_model(config).eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_explained_attention_kernel_is_the_one_a_prompt_takes(variant, monkeypatch):
    """Shaw's value term reads the weights (the reference path), ALiBi and a window reach SDPA as a dense bias, an
    additive score and a soft-cap are no fused kernel's: the plan says what the layers do with a prompt longer than
    any window, as generation runs it (through the KV cache)."""
    config = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64,
                         **VARIANTS[variant])
    torch.manual_seed(0)
    model = build_model(config).eval()
    plan = plan_inference(model, "decoder", cpu=AVX2, profile=Profile(attention={}, decode_linear={}, source="test"))
    model = plan.apply(model)
    taken = spy_on_attention(monkeypatch)
    generate_tokens(model, [list(range(1, 9))], max_new_tokens=1, context_len=64)
    prompt = {kernel for kernel, queries in taken if queries > 1}
    assert prompt and explained_kernels(plan.explain()) == prompt
