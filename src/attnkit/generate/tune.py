"""`attnkit tune`: measure this machine's kernel choices and write the profile the inference plan reads.

Four comparisons, each between kernels that compute the same numbers (tests hold them equal):

    attention       SDPA against plain float32 products (`grouped_attention`) for bf16 attention: one decoding
                    query over S cached keys, and a causal pass (forward and backward) over T = S keys. The profile
                    keeps the longest S up to which the plain products win at every measured length.
    linear layers   one decoding row, and eight (each product once, at the rows a layout sends it: `layout_products`),
                    through GPT-2-sized matrices: nn.Linear against a transposed fp32
                    weight, and against a packed bf16 weight and packed plus ATen's matrix-vector kernel for single
                    rows where oneDNN packs, and ATen's kernel alone (bf16 read, fp32 arithmetic) where it does not
                    (`decode_layout.py`), and the hand-written products where they run (`native_gemv.py`).
                    The fastest for one row is kept, or, among those within 10% of it, the fastest for eight.
    quantized       one fp32 decoding row through the same shapes with int8 and with 4-bit weights: PyTorch's
                    kernels against the native ones (`native_gemv.py`)
    bf16 cost       the fastest bf16 layout's time over the fastest fp32 layout's, which the plan reports on CPUs
                    without native bf16.

Times are medians of `torch.utils.benchmark.Timer.blocked_autorange`, in this process's thread count, and are kept
in the profile beside the choices (the plan's `--explain` shows them).

The plan measures before it guesses: where no profile is kept for this CPU, vector level and PyTorch
(`machine.default_profile_path`), the first plan made on the CPU measures a shorter set (`FIRST_USE`: a few seconds,
logged as it goes) and keeps it there (`machine_profile`); `attnkit tune` measures the full set (`FULL`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import benchmark

from attnkit.errors import InputError
from attnkit.generate import native_gemv
from attnkit.generate.decode_layout import (
    NATIVE_ROWS,
    GemvLinear,
    NativeLinear,
    PackedLinear,
    TransposedLinear,
)
from attnkit.generate.quantize import NATIVE_FORMS, QUANTIZE_FORMS
from attnkit.layers.kernels import grouped_attention
from attnkit.layers.masks import AttentionMask
from attnkit.machine import (
    PROFILE_FIX,
    AttentionKernelLimits,
    CpuCapabilities,
    Profile,
    default_profile_path,
    dtype_name,
    kept_by_attnkit,
    load_profile,
)
from attnkit.outputs import atomic_output, atomic_write
from attnkit.readback import FileFields

log = logging.getLogger(__name__)
HEADS, HEAD_DIM = 6, 64
QUANTIZED = ("int8", "int4")  # the weight-only forms whose kernel is measured
TIE = 1.1  # one-row times within this factor of the fastest count as a tie, which eight rows break


@dataclass(frozen=True)
class Budget:
    """How much to measure: seconds per timing, the key lengths for attention, the (in, out) linear shapes, and the
    fp32 megabytes of weights the shapes are repeated up to: a decoding step reads more weight than any cache holds,
    so a layout is timed reading its weights from memory, as decoding reads them, not from a cache they fit in."""

    min_run_time: float
    decode_keys: tuple[int, ...]
    pass_keys: tuple[int, ...]
    shapes: tuple[tuple[int, int], ...]
    weights_mb: int = 0


FULL = Budget(0.2, (64, 128, 256, 512, 1024), (32, 64, 128, 256, 512),
              ((768, 2304), (768, 3072), (3072, 768)), weights_mb=128)  # (in, out): a GPT-2-sized block's products
FIRST_USE = Budget(0.03, (64, 256, 512), (32, 128), ((768, 3072), (3072, 768)), weights_mb=64)  # seconds, once
QUICK = Budget(0.02, (64, 128), (32, 64), ((64, 192),))  # a rough profile, for trying the command


@dataclass(frozen=True, kw_only=True)
class TuneSettings:
    """What `attnkit tune` measures and where it writes the profile."""

    out: str | None = None  # the profile's path; none: $ATTNKIT_PROFILE, else this CPU's in ~/.cache/attnkit/profiles
    quick: bool = False  # fewer, shorter measurements (a rougher profile in a few seconds)


def _seconds(fn: Callable[[], object], min_run_time: float) -> float:
    """Median seconds per call of `fn`."""
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def longest_win(lengths: tuple[int, ...], math_wins: list[bool]) -> int:
    """The longest length up to which the math kernel won at every measured length (0: it lost at the first)."""
    longest = 0
    for length, wins in zip(lengths, math_wins, strict=True):
        if not wins:
            break
        longest = length
    return longest


def measure_attention(dtype: torch.dtype, min_run_time: float, lengths: tuple[tuple[int, ...], tuple[int, ...]]
                      ) -> tuple[AttentionKernelLimits, list[str]]:
    """SDPA against `grouped_attention` in `dtype` on the CPU; the limits and a table row per length."""
    decode_lengths, pass_lengths = lengths
    log.info("  attention: SDPA against float32 products (%s)", str(dtype).removeprefix("torch."))
    rows, decode_wins, pass_wins = [], [], []
    for keys in decode_lengths:
        q = torch.randn(1, HEADS, 1, HEAD_DIM, dtype=dtype)
        k, v = (torch.randn(1, HEADS, keys, HEAD_DIM, dtype=dtype) for _ in range(2))
        with torch.no_grad():
            sdpa = _seconds(lambda: F.scaled_dot_product_attention(q, k, v), min_run_time)  # noqa: B023
            math = _seconds(lambda: grouped_attention(q, k, v, None), min_run_time)  # noqa: B023
        decode_wins.append(math < sdpa)
        rows.append(f"attention decode  S={keys:<5} SDPA {sdpa * 1e3:8.3f} ms  products {math * 1e3:8.3f} ms")
    for keys in pass_lengths:
        q, k, v = (torch.randn(2, HEADS, keys, HEAD_DIM, dtype=dtype, requires_grad=True) for _ in range(3))
        bias = AttentionMask(keys, causal=True).bias(keys)  # (T, T): 0 on and below the diagonal, -inf above

        def sdpa_pass(q=q, k=k, v=v):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        def math_pass(q=q, k=k, v=v, bias=bias):
            grouped_attention(q, k, v, bias).sum().backward()

        sdpa, math = _seconds(sdpa_pass, min_run_time), _seconds(math_pass, min_run_time)
        pass_wins.append(math < sdpa)
        rows.append(f"attention pass    T={keys:<5} SDPA {sdpa * 1e3:8.3f} ms  products {math * 1e3:8.3f} ms")
    limits = AttentionKernelLimits(longest_win(decode_lengths, decode_wins), longest_win(pass_lengths, pass_wins))
    return limits, rows


def decoding_layers(budget: Budget, dtype: torch.dtype) -> tuple[list[nn.Linear], int]:
    """The budget's shapes as linear layers in `dtype`, repeated up to its `weights_mb` (fp32 bytes); and how many
    copies of the set that is."""
    torch.manual_seed(0)
    per_set = 4 * sum(k * n for k, n in budget.shapes)  # fp32 bytes
    copies = max(1, -(-budget.weights_mb * 2**20 // per_set))
    return [nn.Linear(k, n).to(dtype) for _ in range(copies) for k, n in budget.shapes], copies


def _time_layouts(products: dict[str, list[nn.Module]], dtype: torch.dtype, budget: Budget, copies: int,
                  rows: int = 1) -> dict[str, float]:
    """Seconds per set of the budget's shapes for `rows` decoding rows through each product's layers."""
    rows_in = {k: torch.randn(rows, k, dtype=dtype) for k, _ in budget.shapes}
    with torch.no_grad():
        return {name: _seconds(lambda layers=layers: [m(rows_in[m.in_features]) for m in layers],
                               budget.min_run_time) / copies for name, layers in products.items()}


SEVERAL = 8  # the rows a batch or a prompt sends through a layout, timed beside one


def layout_products(dtype: torch.dtype, cpu: CpuCapabilities, native: bool) -> dict[str, tuple[str, str]]:
    """Each layout that applies to `dtype` on `cpu` -> the products that serve one decoding row and `SEVERAL` in it.
    A layout passes rows beyond its own kernel's on to another's product (`decode_layout.py`): ATen's matrix-vector
    kernel ("gemv") takes one row, then nn.Linear ("plain") or the packed weight; the native kernel takes up to
    `NATIVE_ROWS` rows (fp32, or bf16 beside a packed weight) or `NATIVE_BF16_ROWS` (bf16 alone, where "native" is
    the layout's own layer, timed as it is). So each product is timed once, at the row counts some layout sends it,
    and each packed weight is packed once."""
    if dtype == torch.float32:
        layouts = {"plain": ("plain", "plain"), "transposed": ("transposed", "transposed")}
        several = "native" if SEVERAL <= NATIVE_ROWS else "plain"
        return layouts | ({"native": ("native", several)} if native else {})
    if cpu.onednn_bf16:
        layouts = {"plain": ("plain", "plain"), "packed": ("packed", "packed"), "gemv+packed": ("gemv", "packed")}
        several = "native" if SEVERAL <= NATIVE_ROWS else "packed"
        return layouts | ({"native+packed": ("native", several)} if native else {})
    layouts = {"plain": ("plain", "plain"), "gemv": ("gemv", "plain")}  # no oneDNN packing: bf16 read, fp32 sums
    return layouts | ({"native": ("native", "native")} if native else {})  # the layer takes its own path


def measure_linear(dtype: torch.dtype, cpu: CpuCapabilities, budget: Budget
                   ) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """One decoding row, and `SEVERAL` (a batch, a prompt's rows), through the budget's shapes, repeated up to its
    `weights_mb`, in each layout that applies (`layout_products`): each layout's seconds for one row and for several,
    and table rows."""
    log.info("  linear layers: one and %d decoding rows in each %s layout", SEVERAL, str(dtype).removeprefix("torch."))
    linears, copies = decoding_layers(budget, dtype)
    layouts = layout_products(dtype, cpu, native_gemv.unavailable(cpu) is None)
    make = {"plain": lambda layer: layer, "transposed": TransposedLinear, "packed": PackedLinear, "gemv": GemvLinear,
            "native": NativeLinear}  # each builds one product's layer
    used = {product for pair in layouts.values() for product in pair}
    products = {name: [make[name](layer) for layer in linears] for name in make if name in used}
    times = [_time_layouts({name: products[name] for name in {pair[i] for pair in layouts.values()}}, dtype, budget,
                           copies, rows=rows) for i, rows in enumerate((1, SEVERAL))]
    one, several = ({layout: measured[pair[i]] for layout, pair in layouts.items()} for i, measured in enumerate(times))
    name = str(dtype).removeprefix("torch.")
    rows = [f"linear {name:8} {layout:13} {one[layout] * 1e3:8.3f} ms  {SEVERAL} rows {several[layout] * 1e3:8.3f} ms"
            + ("" if pair == (layout, layout) else f"  (1 row through {pair[0]}, {SEVERAL} through {pair[1]})")
            for layout, pair in layouts.items()]
    return one, several, rows


def choose_layout(one: dict[str, float], eight: dict[str, float]) -> str:
    """The layout to decode with: the fastest for one row, or, among those within `TIE` of it (as close as two
    timings of one kernel come on a busy machine), the fastest for eight rows: a layout that ties at one row can be
    several times slower for a prompt or a batch (bf16 through oneDNN's reference path under AVX2). Layouts whose eight
    rows go through one product (`packed`, `gemv+packed`, `native+packed`: the packed weight) share its time; one row
    tells them apart, not the order they were measured in."""
    fastest = min(one, key=one.get)
    tied = [layout for layout, seconds in one.items() if seconds <= TIE * one[fastest]]
    return min(tied, key=lambda layout: (eight[layout], one[layout]))


def measure_quantized(form: str, cpu: CpuCapabilities, budget: Budget) -> tuple[dict[str, float], list[str]]:
    """One fp32 decoding row through the budget's shapes with `form`'s weights ("int8", "int4"): PyTorch's kernel
    (`QUANTIZE_FORMS`, where it is vectorized) against the native one (`NATIVE_FORMS`, where it runs); each kernel's
    seconds, and table rows."""
    log.info("  linear layers: one decoding row with %s weights", form)
    linears, copies = decoding_layers(budget, torch.float32)
    kernels: dict[str, list[nn.Module]] = {}
    if form == "int8" or cpu.int4_kernel:
        kernels["pytorch"] = [QUANTIZE_FORMS[form](layer) for layer in linears]
    if native_gemv.unavailable(cpu) is None:
        kernels["native"] = [NATIVE_FORMS[form](layer) for layer in linears]
    times = _time_layouts(kernels, torch.float32, budget, copies)
    rows = [f"linear {form:8} {name:13} {t * 1e3:8.3f} ms" for name, t in times.items()]
    return times, rows


def tune(*, budget: Budget = FULL, cpu: CpuCapabilities | None = None) -> tuple[Profile, list[str]]:
    """Measure this machine (see the module docstring) within `budget`; the profile and the measurements as rows."""
    cpu = cpu or CpuCapabilities.detect()
    limits, rows = measure_attention(torch.bfloat16, budget.min_run_time, (budget.decode_keys, budget.pass_keys))
    times, several = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        times[dtype_name(dtype)], several[dtype_name(dtype)], linear_rows = measure_linear(dtype, cpu, budget)
        rows += linear_rows
    for form in QUANTIZED:
        times[form], form_rows = measure_quantized(form, cpu, budget)
        rows += form_rows
    fastest = {name: choose_layout(layouts, several.get(name, layouts)) for name, layouts in times.items() if layouts}
    profile = Profile(
        attention={"bf16": limits},
        decode_linear=fastest,
        dtype_speed={"bf16": round(times["bf16"][fastest["bf16"]] / times["fp32"][fastest["fp32"]], 3)},
        timings={f"linear {name}{what}": {layout: round(seconds * 1e3, 4) for layout, seconds in layouts.items()}
                 for what, measured in (("", times), (f", {SEVERAL} rows", several))
                 for name, layouts in measured.items() if layouts},
        cpu=cpu,
        torch_version=torch.__version__,
        source="attnkit tune",
    )
    return profile, rows


def _without_native_kernels(profile: Profile) -> bool:
    """Whether `profile` was measured while the native kernels could not run (no compiler then, say) and they can now:
    its choices were made without them."""
    measured = profile.timings.get("linear fp32")
    return bool(measured) and "native" not in measured and native_gemv.unavailable(profile.cpu) is None


def machine_profile(cpu: CpuCapabilities) -> tuple[Profile, str]:
    """The profile the inference plan reads for `cpu` (this machine's), and why: the one kept for it, checked field by
    field (`machine.load_profile`), or, where none is kept, one measured now within `FIRST_USE` (a few seconds,
    logged), kept for the next start. A kept one that is damaged or whose read the OS refuses, or was measured while
    the native kernels could not run and they can now (a compiler installed since), is measured again where attnkit
    keeps it (`machine.kept_by_attnkit`, the rule the training plan keeps too); one elsewhere ($ATTNKIT_PROFILE) is
    the user's, refused naming the fix where damaged. A place where none
    can be kept costs a warning and a measurement each start. A plan for another CPU than this one measures nothing."""
    path = default_profile_path(cpu)
    here = cpu == CpuCapabilities.detect()
    if path.exists() or not here:
        ours = kept_by_attnkit(path)
        try:
            kept = load_profile(path, cpu)
        except (InputError, OSError) as err:  # damaged, an older version's, or a read the OS refuses
            if not here or not ours:
                raise
            log.warning("%s: measuring again", err)
        else:
            if not (here and ours and _without_native_kernels(kept[0])):
                return kept
            log.info("%s was measured while the native kernels could not run; they run now: measuring again", path)
    log.info("measuring this CPU for the inference plan, once (a few seconds; kept in %s)", path)
    started = time.perf_counter()
    profile, _ = tune(budget=FIRST_USE, cpu=cpu)
    took = time.perf_counter() - started
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, profile.to_json())
    except OSError as err:
        log.warning("could not keep the measurements in %s (%s): the next start measures again", path, err)
        return profile, f"measured on this machine just now, in {took:.1f} s (not kept: {err})"
    log.info("measured in %.1f s", took)
    return load_profile(path, cpu)[0], f"measured on this machine on first use in {took:.1f} s, kept in {path}"


def run_tune(settings: TuneSettings) -> int:
    """`attnkit tune`: measure, print the measurements, write the profile."""
    cpu = CpuCapabilities.detect()
    path = Path(settings.out) if settings.out else default_profile_path(cpu)
    if not settings.out:
        path.parent.mkdir(parents=True, exist_ok=True)
    # a profile is this machine's measurements: a new one replaces the old, whole, or leaves it as it was; a place
    # that cannot be written fails before the measuring
    with atomic_output(path, directory=False, overwrite=True, flag="--out") as partial:
        print(f"measuring {cpu.summary()}, {torch.get_num_threads()} threads", flush=True)
        profile, rows = tune(budget=QUICK if settings.quick else FULL, cpu=cpu)
        for row in rows:
            print(" ", row)
        partial.write_text(profile.to_json(), encoding="utf-8")
        # read back as the plan will read it, and refused (the old profile kept) where it does not read
        profile = Profile.from_fields(FileFields.read(partial, fix=PROFILE_FIX))
    print(f"wrote {path}: attention bf16 products up to {profile.attention['bf16'].decode_keys} keys (decoding) "
          f"and {profile.attention['bf16'].pass_keys} (passes); linear layers fp32 {profile.decode_linear['fp32']}, "
          f"bf16 {profile.decode_linear['bf16']}; int8 and int4 weights through "
          f"{profile.decode_linear.get('int8', 'no')} and {profile.decode_linear.get('int4', 'no')} kernels; bf16 "
          f"decoding products at {profile.dtype_speed['bf16']:.2f}x fp32's time")
    return 0
