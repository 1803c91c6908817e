"""The inference plan: how a loaded model runs, chosen from the model, the device, the dtype, the CPU's reported
capabilities, the machine's measured profile and the user's options, with the reason for each choice.

    plan_inference(model, family, quantize=..., compile=...)  ->  InferencePlan   (decides; changes nothing)
    plan.explain()                                            ->  the choices and why (`--explain` of generate,
                                                                  translate, classify, tag, fill-mask, eval, serve)
    plan.apply(model)                                         ->  the model, prepared as the plan says

The choices, in the order they are applied:

    dropout         each nn.Dropout replaced by nn.Identity (eval mode passes inputs through, and the identity does it
                    without dropout's dispatch); the layers call their dropout as training has it, in every mode
    q/k/v           fused into one projection in models that decode (one product per layer where there were three)
    linear layers   int8 or int4 on request (`quantize.py`), through the kernel the machine's profile measured
                    fastest: the native one with fp32 inputs (`native_gemv.py`) or PyTorch's with bf16 inputs (int4
                    where PyTorch's CPU int4 kernel is vectorized, else int8, said so); else, for eager CPU decoding,
                    the layout the profile measured fastest (`decode_layout.py`): single rows through the native
                    kernel (bf16 rows through AVX512-BF16's dot product where the CPU reports it; several through
                    nn.Linear's product, or oneDNN's packed bf16 weight where it packs),
                    transposed fp32, or, where oneDNN can pack bf16 (AVX-512 BW/VL/DQ or AVX-NE-CONVERT), packed
                    bf16 or packed plus nn.Linear's for single rows; where it cannot, bf16 single rows through ATen's
                    kernel in fp32 arithmetic; else nn.Linear's own. The native kernels run where the CPU reports
                    AVX2 and FMA and a C compiler builds them, eagerly; a captured step calls the int8 and 4-bit
                    ones as operators where PyTorch's kernels cannot serve it, with the same row limit
    attention       as each layer takes it for the model's variant (`Attention.kernel_path`): the reference path
                    where the weights are read (Shaw's value term) or SDPA cannot score (additive scores, soft-caps),
                    SDPA with a dense (T, S) bias for ALiBi and windows, SDPA bare for plain causal attention; SDPA, or
                    plain float32 products for short reduced-precision attention on the CPU where the profile
                    measured them faster (`layers/kernels.py`), a single unmasked decoding query of an eager step
                    going first to the native one-query kernel (`native_gemv.attend_one`) where the kernels run
    compilation     none; a decoder's whole decoding step with fixed shapes, through torch.compile
                    (`static_decode.py`) or captured ahead of time (`captured_step.py`: nn.Linear's layout and SDPA,
                    which serve every cache length; not for int4 weights); or each block

A path is taken only where the CPU reports what it needs; where it does not, the plan falls back and says so.
Tests build plans for CPUs with and without each capability by passing `cpu=`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnkit.blocks import TransformerBlock, attention_kernels, compile_blocks, torch_compile_mode
from attnkit.errors import InputError
from attnkit.generate import native_gemv
from attnkit.generate.captured_step import default_package_dir
from attnkit.generate.decode_layout import (
    NATIVE_BF16_ROWS,
    NATIVE_ROWS,
    fuse_qkv_projections,
    gemv_linear_weights,
    gemv_pack_linear_weights,
    native_linear_weights,
    native_pack_linear_weights,
    pack_linear_weights,
    transpose_linear_weights,
)
from attnkit.generate.quantize import (
    INT4_GROUP,
    INT8_KERNEL_INPUTS,
    NATIVE_FORMS,
    NATIVE_QUANTIZED_ROWS,
    QUANTIZE_FORMS,
    dynamic_quantization_available,
    padded_width,
    quantize_weights,
    reduce_range,
)
from attnkit.generate.static_decode import StaticDecoding
from attnkit.generate.swap import remove_dropout_layers
from attnkit.generate.tune import SEVERAL, TIE, machine_profile
from attnkit.layers.kernels import MathKernel, use_math_kernel
from attnkit.machine import CpuCapabilities, Profile, dtype_name, load_profile
from attnkit.models import family_of
from attnkit.plans import Choice, attention_choice, explain_choices


@dataclass(frozen=True)
class InferencePlan:
    """What `apply` does to a model (see the module docstring), and the reasons, as `explain` prints them."""

    device: str
    dtype: torch.dtype
    cpu: CpuCapabilities | None  # None off the CPU
    fuse_qkv: bool
    linear: str  # "plain", "transposed", "packed", "gemv+packed", "gemv", "native", "native+packed", "int8",
    # "int8-native", "int8-dynamic", "int4" or "int4-native"
    math_kernel: MathKernel | None
    compile: bool | str
    static_decoding: bool
    choices: tuple[Choice, ...]

    def apply(self, model: nn.Module) -> nn.Module:
        """Prepare `model` (in place) as planned; returns it, in eval mode."""
        remove_dropout_layers(model)
        if self.fuse_qkv:
            fuse_qkv_projections(model)
        if self.linear in QUANTIZE_FORMS:
            quantize_weights(model, self.linear)
        elif self.linear.endswith("-native"):
            quantize_weights(model, self.linear.removesuffix("-native"), native=True)
        elif self.linear == "native":
            native_linear_weights(model)
        elif self.linear == "native+packed":
            native_pack_linear_weights(model)
        elif self.linear == "transposed":
            transpose_linear_weights(model)
        elif self.linear == "packed":
            pack_linear_weights(model)
        elif self.linear == "gemv+packed":
            gemv_pack_linear_weights(model)
        elif self.linear == "gemv":
            gemv_linear_weights(model)
        use_math_kernel(model, self.math_kernel)
        mode = torch_compile_mode(self.compile)
        if mode is not None and not self.static_decoding:
            compile_blocks(model, dynamic=True, mode=mode)
        return model.eval()

    def explain(self) -> str:
        """The plan as text: the machine it was made for, then one line per choice with its reason."""
        where = self.cpu.summary() if self.cpu is not None else self.device
        return explain_choices(f"inference plan for {dtype_name(self.dtype)} on {where}", self.choices)


def plan_inference(
    model: nn.Module,
    family: str,
    *,
    quantize: str | None = None,
    compile: bool | str = False,
    cpu: CpuCapabilities | None = None,
    profile: Profile | None = None,
    decoding: bool | None = None,
) -> InferencePlan:
    """Decide how `model` (as loaded: its device and dtype) will run; see the module docstring.

    cpu: the CPU to plan for (default: this one, as PyTorch reports it); profile: measured kernel choices (default:
    the one kept for this CPU, measured in a few seconds on first use: `tune.machine_profile`); decoding: whether
    the model will decode token by token (default: whether its family decodes); `attnkit eval` scores whole passes.
    """
    if quantize is not None and quantize not in QUANTIZE_FORMS:
        raise InputError(f"quantize={quantize!r} is not supported; use one of {', '.join(QUANTIZE_FORMS)}, or None")
    mode = torch_compile_mode(compile)  # an unknown mode fails before anything is decided
    weight = next(model.parameters())
    device, dtype = weight.device, weight.dtype
    on_cpu = device.type == "cpu"
    check_quantization(quantize, device, compile)
    cpu = (cpu or CpuCapabilities.detect()) if on_cpu else None
    if profile is None:  # this CPU's, measured on first use where none is kept (`tune.machine_profile`)
        profile, profile_note = machine_profile(cpu) if cpu is not None else load_profile()
    else:
        profile_note = f"profile from {profile.source}"
    family_decodes = family_of(family).state is not None
    decodes = family_decodes if decoding is None else decoding and family_decodes
    fixed_step = decodes and StaticDecoding.supports(model)  # a decoding step of fixed shapes: compiled or captured
    static = mode is not None and fixed_step

    choices = [Choice("dropout", "replaced by nn.Identity", "eval mode passes inputs through, and the identity does "
                                                           "it without dropout's dispatch in every step")]
    projects = any(isinstance(module, TransformerBlock) for module in model.modules())
    if not projects:
        choices.append(Choice("q/k/v", "none", "a model without Transformer blocks (recurrent, convolutional, "
                              "feed-forward) has no query, key and value projections to fuse"))
    elif decodes:
        choices.append(Choice("q/k/v", "fused", "decoding runs one projection per layer instead of three"))
    else:
        choices.append(Choice("q/k/v", "separate", "only whole passes run here (scoring), no token-by-token decoding"
                              if family_decodes else "this model does not decode token by token"))
    linear, why = _linear_layout(decodes, on_cpu, dtype, quantize, compile, static, cpu, profile, profile_note)
    why += _padding(model, linear)
    choices.append(Choice("linear layers", linear, why))
    captured = static and compile == "aot" and linear != "int4"  # int4 steps go through torch.compile (below)
    math_kernel, why = _attention_kernel(device, dtype, profile, profile_note, cpu, compile)
    if math_kernel is not None and captured:  # its choice by key count would fix the cache length
        math_kernel, why = None, "the captured step serves every cache length, and SDPA does too"
    if not projects:
        math_kernel, why = None, ("no Transformer blocks: recurrent cells (with their own attention scores where the "
                                  "model has them), convolutions or feed-forward layers")
        choices.append(Choice("attention", "the model's own", why))
    else:
        fused = "SDPA" if math_kernel is None else _describe(math_kernel)
        choices.append(attention_choice(attention_kernels(model, cached=decodes), fused, why))
    choices.append(_compilation(compile, mode, captured, linear, fixed_step))
    if on_cpu and dtype == torch.bfloat16 and cpu is not None and not cpu.native_bf16:
        choices.append(Choice("bf16", "converted to fp32 inside each product", _bf16_cost(cpu, profile)))
    return InferencePlan(
        device=str(device), dtype=dtype, cpu=cpu, fuse_qkv=decodes and projects, linear=linear, math_kernel=math_kernel,
        compile=compile, static_decoding=static, choices=tuple(choices),
    )


def prepare_for_inference(
    model: nn.Module, family: str, *, quantize: str | None = None, compile: bool | str = False
) -> nn.Module:
    """What `load` does to a model after reading it: this machine's plan, applied (in place; returns the model)."""
    return plan_inference(model, family, quantize=quantize, compile=compile).apply(model)


def check_quantization(quantize: str | None, device: torch.device, compile: bool | str) -> None:
    """Refuse a quantized form where its kernel cannot run: int4 off the CPU; int8-dynamic off the CPU, compiled, or
    without FBGEMM."""
    if quantize == "int4" and device.type != "cpu":
        raise InputError(f"quantize='int4' (--int4) runs on the CPU only (PyTorch's CPU int4 kernel), not {device}: "
                         "load onto the CPU (--device cpu), or use quantize='int8' (--int8) there")
    if quantize != "int8-dynamic":
        return
    if device.type != "cpu":
        raise InputError(f"quantize='int8-dynamic' (--int8-dynamic) runs on the CPU only, not {device}: load onto "
                         "the CPU (--device cpu), or use quantize='int8' (--int8) there")
    if compile:
        raise InputError("quantize='int8-dynamic' (--int8-dynamic) runs eagerly (its kernel is not compiled): drop "
                         "compile (--compile), or use quantize='int8' (--int8) with it")
    reason = dynamic_quantization_available()
    if reason is not None:
        raise InputError(reason)


def _linear_layout(
    decodes: bool, on_cpu: bool, dtype: torch.dtype, quantize: str | None, compile: bool | str, static: bool,
    cpu: CpuCapabilities | None, profile: Profile, profile_note: str,
) -> tuple[str, str]:
    """The linear layers' form and why."""
    if quantize in NATIVE_FORMS:
        return _quantized_kernel(quantize, on_cpu, compile, static, cpu, profile, profile_note)
    if quantize == "int8-dynamic":
        activations = "7-bit activations: no AVX-512 VNNI" if reduce_range() else "8-bit activations (AVX-512 VNNI)"
        return "int8-dynamic", f"int8 weights and int8 inputs per row through FBGEMM, as asked; {activations}"
    if not decodes:
        return "plain", "nothing decodes one row at a time here: nn.Linear's own layout"
    if not on_cpu:
        return "plain", "off the CPU the device's matrix kernels take nn.Linear's layout"
    name = dtype_name(dtype)
    if static and compile == "aot":
        return "plain", ("the captured one-row step reads nn.Linear's rows as reductions, the several-row step "
                         "multiplies by them as they are")
    wanted = profile.decode_linear.get(name, "plain")
    measured = _timings(profile, f"linear {name}")
    if wanted in ("native", "native+packed"):
        if compile:
            return "plain", (f"the compiled step reads the weights in its own loops (one decoding row measured "
                             f"fastest through the native kernel{measured})")
        reason = native_gemv.unavailable(cpu)
        if reason is not None:
            return "plain", f"the native kernels measured fastest, but cannot run here: {reason}"
        if wanted == "native+packed" and cpu is not None and not cpu.onednn_bf16:
            wanted = "native"
        if wanted == "native+packed":
            rows, several = NATIVE_ROWS, "more through oneDNN's packed weight (each weight held twice)"
        elif dtype == torch.bfloat16:
            rows, several = NATIVE_BF16_ROWS, "more through the weight widened to fp32 for the call"
        else:
            rows, several = NATIVE_ROWS, "more through nn.Linear's product"
        return wanted, (f"{_chosen(profile, name)}{measured}: up to {rows} rows through the native "
                        f"matrix-vector kernel ({_native_arithmetic(dtype, cpu)}), {several} ({profile_note})")
    if wanted == "transposed" and static and compile == "max-autotune":
        return "plain", "max-autotune packs frozen weights for its own kernels, faster than a transposed copy"
    if wanted in ("packed", "gemv+packed"):
        if compile:
            packs = cpu is None or cpu.onednn_bf16
            return "plain", ("the compiled step packs frozen weights itself" if packs else
                             "compiled as they are (inductor packs bf16 weights only where oneDNN can)")
        if cpu is not None and not cpu.onednn_bf16:
            return "plain", (f"oneDNN packs {name} weights only with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; this CPU "
                             f"reports {cpu.isa}, so nn.Linear runs oneDNN's reference path")
    if wanted == "gemv+packed":
        return wanted, (f"{_chosen(profile, name)}{measured}: one row through ATen's matrix-vector "
                        f"kernel, several through oneDNN's packed weight (each weight held twice; {profile_note})")
    if wanted == "gemv" and compile:
        return "plain", "the compiled step reads the weights in its own loops"
    if wanted == "gemv" and dtype == torch.bfloat16:
        return wanted, (f"{_chosen(profile, name)}{measured}: the bf16 weight read through ATen's "
                        f"matrix-vector kernel and computed in fp32, several rows through nn.Linear ({profile_note})")
    if wanted in ("transposed", "packed"):
        return wanted, f"{_chosen(profile, name)}{measured} ({profile_note})"
    return "plain", f"nn.Linear's layout for {name}{measured} ({profile_note})"


def _chosen(profile: Profile, name: str) -> str:
    """How the profile chose its layout for decoding in `name` ("fp32", "bf16"), as the start of the plan's reason:
    the fastest for one decoding row, or, where another was faster for one row by less than `tune.TIE` (a tie), the
    fastest for `SEVERAL` rows among those tied (`tune.choose_layout`'s rule)."""
    layout, one = profile.decode_linear.get(name), profile.timings.get(f"linear {name}", {})
    if layout not in one or one[layout] <= min(one.values()):
        return f"measured fastest for decoding in {name}"
    return (f"chosen for decoding in {name} by the tie rule: one row within {TIE:g}x of the fastest's "
            f"({min(one, key=one.get)}), and the fastest of those for {SEVERAL} rows")


def _native_arithmetic(dtype: torch.dtype, cpu: CpuCapabilities | None) -> str:
    """How the native kernel computes a `dtype` product on `cpu`, as a clause of the plan's reason."""
    if dtype != torch.bfloat16:
        return "the weight read as stored, fp32 arithmetic"
    if native_gemv.bf16_dot(cpu):
        return ("bf16 weights and rows multiplied as stored by AVX512-BF16's dot-product instruction, vdpbf16ps, "
                "summed in fp32")
    return "the bf16 weight widened to fp32 as read, fp32 arithmetic: this CPU reports no AVX512-BF16"


def _quantized_kernel(quantize: str, on_cpu: bool, compile: bool | str, static: bool, cpu: CpuCapabilities | None,
                      profile: Profile, profile_note: str) -> tuple[str, str]:
    """The kernel of int8 or int4 weights ("int8", "int8-native", "int4", "int4-native") and why.

    Eager, the one the profile measured faster. A captured step (compile="aot") calls the native kernel as an operator
    where PyTorch's cannot serve it: 4-bit weights (inductor derives new tensors from PyTorch's int4 weights, which a
    library reading the model's own cannot be given) and int8 where inductor's int8 loops are scalar (AVX2). Any other
    compiled step compiles PyTorch's products into its own loops."""
    grid = ("int8 weights with a scale per row" if quantize == "int8" else
            f"4-bit weights in groups of {INT4_GROUP} inputs with a scale and zero each")
    measured = _timings(profile, f"linear {quantize}")
    vectorized = (cpu or CpuCapabilities.detect()).int8_loops_vectorized  # inductor's int8 loops
    captured_needs = compile == "aot" and (quantize == "int4" or not vectorized)
    if captured_needs:
        why = ("PyTorch's int4 product cannot be captured" if quantize == "int4" else
               "inductor's loop over int8 weights is scalar without AVX-512")
        wanted = f"the captured step calls it as an operator ({why})"
    else:
        wanted = f"fastest for one decoding row{measured}; {profile_note}"
    compiled = compile and not captured_needs  # PyTorch's product, in a compiled or captured step
    how = ((f"the captured step reads them for one row in inductor's own loop, vectorized on this CPU "
            f"({(cpu or CpuCapabilities.detect()).isa}), and calls PyTorch's kernel for several")
           if compile == "aot" and static else "a compiled step compiles PyTorch's product into its own loops")
    if on_cpu and (captured_needs or profile.decode_linear.get(quantize) == "native"):
        reason = how if compiled else native_gemv.unavailable(cpu)
        if reason is None:
            return f"{quantize}-native", (
                f"{grid}, as asked, through the native kernel with fp32 inputs: up to {NATIVE_QUANTIZED_ROWS} rows "
                f"widened as read, more dequantized for the call ({wanted})")
        native = f"; the native kernel is not used: {reason}"
    else:
        native = (measured and f" (measured fastest for one decoding row{measured}; {profile_note})") + \
            (f"; {how}" if compiled else "")
    if quantize == "int4" and cpu is not None and not cpu.int4_kernel:
        return "int8", (f"int4 asked for, but PyTorch's CPU int4 kernel is vectorized only for AVX2 and AVX-512 "
                        f"and this CPU reports {cpu.isa}: int8 weights instead (weight-only, bf16 products){native}")
    kernel = "PyTorch's CPU int4 kernel" if quantize == "int4" else "PyTorch's int8-weight kernel"
    return quantize, f"{grid}, as asked (weight-only: bf16 products through {kernel}){native}"


def _timings(profile: Profile, what: str) -> str:
    """The profile's measurements of `what` as a clause (": plain 0.120 ms, transposed 0.100 ms"), with those of eight
    rows where they were measured ("; 8 rows: ..."), or ""."""
    def listed(times: dict[str, float]) -> str:
        return ", ".join(f"{name} {ms:.3f} ms" for name, ms in sorted(times.items(), key=lambda kv: kv[1]))

    times, several = profile.timings.get(what), profile.timings.get(f"{what}, {SEVERAL} rows")
    return (f": {listed(times)}" + (f"; {SEVERAL} rows: {listed(several)}" if several else "")) if times else ""


PADDED_INPUTS = {  # quantized form -> (the in-width multiple its kernel takes, why)
    "int8": (INT8_KERNEL_INPUTS, f"PyTorch's int8 kernel reads {INT8_KERNEL_INPUTS} (AVX-512) or 8 (AVX2) inputs at a "
             "time with aligned loads and no remainder, and crashes or reads past the row at other widths"),
    "int4": (INT4_GROUP, f"int4 groups of {INT4_GROUP} inputs tile each row"),
}
PADDED_INPUTS["int4-native"] = PADDED_INPUTS["int4"]  # the same groups


def _padding(model: nn.Module, linear: str) -> str:
    """The in-widths a quantized form's kernel is given padded (`quantize.padded_width`), as a clause of the plan's
    reason; empty where every width is one the kernel takes as it is, or the form pads nothing."""
    if linear not in PADDED_INPUTS:
        return ""
    multiple, why = PADDED_INPUTS[linear]
    widths = sorted({m.in_features for m in model.modules() if isinstance(m, nn.Linear) and m.in_features % multiple})
    if not widths:
        return ""
    padded = ", ".join(f"{width} -> {padded_width(width, multiple)}" for width in widths)
    return f"; in-widths padded with zero inputs ({padded}): {why}"


# One decoding query (6 heads of 64, one thread, CPU time, `python -m benchmarks decode_attention`,
# benchmarks/results/decode-attention-cpu.md): the native one-query kernel against the math kernel's float32 products
ONE_QUERY_SPEEDUP = {"bf16": (2.2, 3.4), "fp32": (1.4, 2.7)}  # dtype -> the range over 16 to 512 cached keys


def _attention_kernel(
    device: torch.device, dtype: torch.dtype, profile: Profile, profile_note: str, cpu: CpuCapabilities | None,
    compile: bool | str,
) -> tuple[MathKernel | None, str]:
    """The math kernel for this device and dtype, or None (SDPA), and why; with the native one-query kernel first
    for a single decoding query where the kernels run (eager: a compiled step cannot call into C)."""
    kernel = MathKernel.from_profile(device.type, dtype, profile)
    if kernel is None:
        return None, "fused, keeps no (T, S) weights" + (f"; {profile_note}" if device.type == "cpu" else "")
    why = f"faster than SDPA there for {dtype_name(dtype)}; {profile_note}"
    if dtype in native_gemv.ONE_QUERY_DTYPES and cpu is not None and not compile and not native_gemv.unavailable(cpu):
        low, high = ONE_QUERY_SPEEDUP[dtype_name(dtype)]
        kernel = replace(kernel, one_query=native_gemv.attend_one_query)
        why += (f"; a single decoding query through the native one-query kernel ({low}-{high}x faster than the float32 "
                "products, measured)")
    return kernel, why


def _describe(kernel: MathKernel) -> str:
    first = "the native kernel for one decoding query, then " if kernel.one_query is not None else ""
    return (f"{first}float32 products up to {kernel.limits.decode_keys} keys (decoding) and {kernel.limits.pass_keys} "
            "(passes), SDPA beyond")


# `attnkit serve` with the captured step against eager on the 6x384 decoder, fp32, one thread, 2 rounds: the batched
# server's tokens/s and its first start (`python -m benchmarks.bench_serve --forms fp32 "compile aot" --form-clients 1 4
# --requests 3 --new-tokens 32 --rounds 2 --name serve-captured-cpu`, benchmarks/results/serve-captured-cpu.json, which
# a test holds these to)
CAPTURED_SERVING = {"clients": (1, 4), "speedup": (1.25, 1.8), "start_s": (228, 302), "eager_start_s": (18, 21)}


def _compilation(compile: bool | str, mode: str | None, captured: bool, linear: str, fixed_step: bool) -> Choice:
    """The plan's compilation choice: eager unless `mode` asks for torch.compile; `fixed_step` where the model's
    decoding step has fixed shapes (compiled whole, or captured ahead of time where `captured`). Eager stays the
    default for a server too: the captured step's gain (`CAPTURED_SERVING`) is paid for by a first start of minutes."""
    if mode is None and fixed_step:  # eager by default: a one-off prompt, or a server's first start, waits for capture
        served = CAPTURED_SERVING
        gains = " and ".join(f"{x}x at {c} client{'s' if c > 1 else ''}"
                             for c, x in zip(served["clients"], served["speedup"], strict=True))
        return Choice("compilation", "eager", "not asked for (--compile aot captures this model's decoding step ahead "
                      f"of time, no Python per layer: a server's tokens/s measured {gains} against eager, after a "
                      f"first start of {served['start_s'][0]}-{served['start_s'][1]} s against "
                      f"{served['eager_start_s'][0]}-{served['eager_start_s'][1]} on a loaded 2-core CPU, which runs "
                      f"the C++ compiler and keeps the step in {default_package_dir()} for the next start)")
    if mode is None:
        return Choice("compilation", "eager", "not asked for (--compile)")
    if fixed_step and compile == "aot" and not captured:
        return Choice("compilation", "decoding step, default (torch.compile)", "int4 steps are not captured ahead of "
                      "time: compiling PyTorch's int4 product derives new weight tensors, which a library reading the "
                      "model's own cannot be given")
    if captured:
        return Choice("compilation", "decoding step captured ahead of time (AOTInductor)",
                      "one C++ library for one row and one for several, any cache length, reading the model's weights; "
                      f"no Python per layer; kept in {default_package_dir()} for the next start")
    if compile == "aot":
        return Choice("compilation", "each block, default", "aot captures decoder-only steps without sliding "
                      "windows; this model's blocks are compiled for any length instead")
    if fixed_step:
        frozen = "weights not frozen (a transposed copy exists)" if linear == "transposed" else "weights frozen"
        return Choice("compilation", f"decoding step, {mode}", f"one graph per batch size and cache length; {frozen}")
    return Choice("compilation", f"each block, {mode}", "any length (no fixed-shape decoding step for this model)")


def _bf16_cost(cpu: CpuCapabilities, profile: Profile) -> str:
    """What bf16 costs on a CPU without native bf16, from the profile where it measured it."""
    no = f"this CPU reports no AVX512-BF16 or AMX ({cpu.isa})"
    speed = profile.dtype_speed.get("bf16")
    if speed is None:
        return f"{no}: fp32 is usually faster here (`attnkit tune` measures it)"
    faster = "fp32 is faster here (--dtype fp32)" if speed > 1 else "still faster than fp32 for these weights"
    return f"{no}: decoding products measured at {speed:.2f}x fp32's time; {faster}"
