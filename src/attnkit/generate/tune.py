"""`attnkit tune`: measure this machine's kernel choices and write the profile the inference plan reads.

Three comparisons, each between kernels that compute the same numbers (tests hold them equal):

    attention       SDPA against plain float32 products (`grouped_attention`) for bf16 attention: one decoding
                    query over S cached keys, and a causal pass (forward and backward) over T = S keys. The profile
                    keeps the longest S up to which the plain products win at every measured length.
    linear layers   one decoding row through GPT-2-sized matrices: nn.Linear against a transposed fp32 weight, and
                    against a packed bf16 weight and packed plus ATen's matrix-vector kernel for single rows where
                    oneDNN packs (`decode_layout.py`). The fastest is kept.
    bf16 cost       the fastest bf16 layout's time over the fastest fp32 layout's, which the plan reports on CPUs
                    without native bf16.

Times are medians of `torch.utils.benchmark.Timer.blocked_autorange`, in this process's thread count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import benchmark

from attnkit.generate.decode_layout import GemvPackedLinear, TransposedLinear
from attnkit.layers.kernels import grouped_attention
from attnkit.layers.masks import AttentionMask
from attnkit.machine import AttentionKernelLimits, CpuCapabilities, Profile, default_profile_path
from attnkit.outputs import atomic_output

DECODE_KEYS = (64, 128, 256, 512, 1024)
PASS_KEYS = (32, 64, 128, 256, 512)
LINEAR_SHAPES = ((768, 2304), (768, 3072), (3072, 768))  # (in, out): a GPT-2-sized block's products
HEADS, HEAD_DIM = 6, 64


@dataclass(frozen=True, kw_only=True)
class TuneSettings:
    """What `attnkit tune` measures and where it writes the profile."""

    out: str | None = None  # the profile's path; none: $ATTNKIT_PROFILE, else ~/.cache/attnkit/profile.json
    quick: bool = False  # fewer, shorter measurements (a rougher profile in a few seconds)


def _seconds(fn: Callable[[], object], min_run_time: float) -> float:
    """Median seconds per call of `fn`."""
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def _longest_win(lengths: tuple[int, ...], math_wins: list[bool]) -> int:
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
    limits = AttentionKernelLimits(_longest_win(decode_lengths, decode_wins), _longest_win(pass_lengths, pass_wins))
    return limits, rows


def measure_linear(dtype: torch.dtype, cpu: CpuCapabilities, min_run_time: float, shapes: tuple[tuple[int, int], ...]
                   ) -> tuple[str, float, list[str]]:
    """One decoding row through `shapes` in each layout that applies; the fastest layout, its seconds, table rows."""
    torch.manual_seed(0)
    linears = [nn.Linear(k, n).to(dtype) for k, n in shapes]
    layouts: dict[str, list[nn.Module]] = {"plain": linears}
    if dtype == torch.float32:
        layouts["transposed"] = [TransposedLinear(layer) for layer in linears]
    elif dtype == torch.bfloat16 and cpu.onednn_bf16:
        gemv = [GemvPackedLinear(layer) for layer in linears]
        layouts["packed"] = [layer.packed for layer in gemv]  # the same packed weights, packed once
        layouts["gemv+packed"] = gemv
    rows_in = {k: torch.randn(1, k, dtype=dtype) for k, _ in shapes}
    times = {}
    with torch.no_grad():
        for name, layers in layouts.items():
            times[name] = _seconds(lambda layers=layers: [m(rows_in[m.in_features]) for m in layers], min_run_time)
    best = min(times, key=times.get)
    rows = [f"linear {str(dtype).removeprefix('torch.'):8} {name:11} {t * 1e3:8.3f} ms" for name, t in times.items()]
    return best, times[best], rows


def tune(*, quick: bool = False, cpu: CpuCapabilities | None = None) -> tuple[Profile, list[str]]:
    """Measure this machine (see the module docstring); the profile and the measurements as text rows."""
    cpu = cpu or CpuCapabilities.detect()
    min_run_time = 0.02 if quick else 0.2
    lengths = (DECODE_KEYS[:2], PASS_KEYS[:2]) if quick else (DECODE_KEYS, PASS_KEYS)
    shapes = ((64, 192),) if quick else LINEAR_SHAPES
    limits, rows = measure_attention(torch.bfloat16, min_run_time, lengths)
    fp32_layout, fp32_time, fp32_rows = measure_linear(torch.float32, cpu, min_run_time, shapes)
    bf16_layout, bf16_time, bf16_rows = measure_linear(torch.bfloat16, cpu, min_run_time, shapes)
    profile = Profile(
        attention={"bf16": limits},
        decode_linear={"fp32": fp32_layout, "bf16": bf16_layout},
        dtype_speed={"bf16": round(bf16_time / fp32_time, 3)},
        cpu=cpu,
        torch_version=torch.__version__,
        source="attnkit tune",
    )
    return profile, rows + fp32_rows + bf16_rows


def run_tune(settings: TuneSettings) -> int:
    """`attnkit tune`: measure, print the measurements, write the profile."""
    path = Path(settings.out) if settings.out else default_profile_path()
    # a profile is this machine's measurements: a new one replaces the old, whole, or leaves it as it was; a place
    # that cannot be written fails before the measuring
    with atomic_output(path, directory=False, overwrite=True, flag="--out") as partial:
        cpu = CpuCapabilities.detect()
        print(f"measuring {cpu.summary()}, {torch.get_num_threads()} threads", flush=True)
        profile, rows = tune(quick=settings.quick, cpu=cpu)
        for row in rows:
            print(" ", row)
        partial.write_text(profile.to_json(), encoding="utf-8")
    print(f"wrote {path}: attention bf16 products up to {profile.attention['bf16'].decode_keys} keys (decoding) "
          f"and {profile.attention['bf16'].pass_keys} (passes); linear layers fp32 {profile.decode_linear['fp32']}, "
          f"bf16 {profile.decode_linear['bf16']}; bf16 decoding products at {profile.dtype_speed['bf16']:.2f}x fp32's "
          "time")
    return 0
