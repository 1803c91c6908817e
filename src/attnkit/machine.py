"""What this machine can do: the CPU's reported capabilities, and the profile of measured kernel choices.

Fast paths differ between CPUs. oneDNN's packed bf16 matrix kernels need AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT;
native bf16 arithmetic needs AVX512-BF16 or AMX; FBGEMM's int8 products add pairs without saturating only with
VNNI. And which of two correct kernels is faster (SDPA or plain matrix products for short bf16 attention; a
transposed or packed weight for decoding) depends on the machine. So nothing here assumes an instruction set:

    CpuCapabilities.detect()   what PyTorch reports (`torch.cpu.get_capabilities()`, `get_cpu_capability()`)
    Profile                    the choices measured on this machine by `attnkit tune` (`tune.py`; the inference
                               plan measures briefly on first use where none is kept), read from $ATTNKIT_PROFILE or
                               ~/.cache/attnkit/profiles/, one file per CPU, vector level and PyTorch version, when it
                               was measured on this CPU and PyTorch; otherwise `DEFAULT_PROFILE`, whose figures are
                               documented below

The inference plan (`generate/plan.py`) and the trainer read both; the layers only take the choices they are given.
`free_bytes` says how much memory is free, which `build_model` checks a model's weights against before allocating;
`pick_device` turns a user's `--device` into a device this machine has, or one line naming the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnkit.errors import ConfigError
from attnkit.readback import FileFields

PROFILE_ENV = "ATTNKIT_PROFILE"  # where a profile is read from, when set
# 2: the native kernels (`generate/native_gemv.py`) among the measured layouts and forms; 3: their bf16 product
# through AVX512-BF16's dot product where the CPU reports it (a profile measured before may have chosen another); 4:
# layouts whose eight rows share one product told apart by one row (`tune.choose_layout`), where version 3 kept the
# first measured (packed bf16 over native+packed)
PROFILE_VERSION = 4
PROFILE_FIX = "measure this machine again with `attnkit tune` (or delete the file: documented defaults are used)"
# what a profile's decode_linear may name: "fp32" and "bf16" layouts, "int8" and "int4" kernels ("native", "pytorch")
DECODE_LAYOUTS = ("plain", "transposed", "packed", "gemv+packed", "gemv", "native", "native+packed", "pytorch")
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def pick_device(name: str | torch.device | None) -> torch.device:
    """`name` ("cpu", "cuda", "cuda:1", a torch.device), or CUDA when available, else the CPU; a device torch does not
    know, or CUDA on a machine without it, is a ConfigError naming the choices."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"--device {name!r} is not a device torch knows ({err}); use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name} was asked for, but torch sees no CUDA device; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s), numbered from "
                              "0; use one of them")
    elif device.type not in ("cpu", "meta"):  # meta: no memory, a device other than the CPU for cheap checks
        raise ConfigError(f"--device {name!r}: attnkit runs on cpu and cuda; use one of them")
    return device


def dtype_name(dtype: torch.dtype) -> str:
    """The short name profiles and plans use: "fp32", "bf16", "fp16"."""
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class CpuCapabilities:
    """The instruction sets the CPU reports, as PyTorch reads them (cpuinfo).

    isa: ATen's vector level (`torch.backends.cpu.get_cpu_capability()`: "DEFAULT", "AVX2", "AVX512", ...), the
    kernels PyTorch itself dispatches to; flags: the capabilities `torch.cpu.get_capabilities()` reports true.
    """

    isa: str
    flags: frozenset[str] = field(default_factory=frozenset)
    name: str = ""

    @classmethod
    def detect(cls) -> CpuCapabilities:
        """This machine's CPU, as the kernels will run on it: flags beyond ATen's vector level are dropped, so that
        an AVX-512 CPU run with its AVX2 kernels (`ATEN_CPU_CAPABILITY=avx2`, with oneDNN held to AVX2 by
        `ONEDNN_MAX_CPU_ISA=AVX2`) is planned for as the AVX2 CPU it then is."""
        report = reported_capabilities()
        isa = torch.backends.cpu.get_cpu_capability()
        flags = frozenset(k for k, v in report.items() if v is True and not _above(k, isa))
        return cls(isa=isa, flags=flags, name=str(report.get("cpu_name", "")))

    @property
    def onednn_bf16(self) -> bool:
        """Whether oneDNN runs bf16 matrix products with its own packed kernels (it refuses to pack otherwise):
        AVX-512 BW+VL+DQ (which ATen's "AVX512" level implies) or AVX-NE-CONVERT."""
        avx512 = self.isa.startswith("AVX512") or {"avx512_bw", "avx512_vl", "avx512_dq"} <= self.flags
        return avx512 or "avx_ne_convert" in self.flags

    @property
    def native_bf16(self) -> bool:
        """Whether the CPU computes in bf16 (AVX512-BF16 or AMX); without it bf16 products convert to fp32 inside."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    @property
    def int4_kernel(self) -> bool:
        """Whether PyTorch's CPU int4 matrix kernel (`_weight_int4pack_mm_for_cpu`) has a vectorized path here: ATen's
        AVX2 or AVX-512 level; elsewhere it runs a scalar loop, slower than bf16."""
        return self.isa.startswith(("AVX2", "AVX512"))

    @property
    def vnni(self) -> bool:
        """Whether int8 products accumulate without saturating (AVX-512 VNNI or AVX-VNNI)."""
        return bool({"avx512_vnni", "avx_vnni"} & self.flags)

    @property
    def int8_loops_vectorized(self) -> bool:
        """Whether inductor's compiled loops over int8 weights widen them with vector instructions: with ATen's AVX-512
        level. Under AVX2 its int8-to-float loop is scalar (`gpt2-124m`'s one-row int8 step captured as reductions
        decoded at 7 tokens/s, 0.07x llama.cpp's q8_0, against 0.76x with AVX-512), so there a captured step calls an
        int8 kernel instead (`generate/captured_step.py`, `generate/plan.py`)."""
        return self.isa.startswith("AVX512")

    def paths(self) -> dict[str, bool]:
        """Each capability the plan asks about, by the name `--explain` gives it, and whether this CPU has it."""
        return {"oneDNN packs bf16": self.onednn_bf16, "bf16 arithmetic": self.native_bf16,
                "int4 kernel vectorized": self.int4_kernel, "int8 VNNI": self.vnni,
                "compiled int8 loops vectorized": self.int8_loops_vectorized}

    def summary(self) -> str:
        """One line: the vector level, the flags the plan asks about, and what they allow (`paths`)."""
        asked = ("avx2", "avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16", "avx512_vnni", "avx_vnni",
                 "avx_ne_convert", "amx_bf16")
        have = [f for f in asked if f in self.flags]
        allows = "; ".join(f"{what}: {'yes' if has else 'no'}" for what, has in self.paths().items())
        return f"{self.name or 'CPU'}: {self.isa}" + (f" ({', '.join(have)})" if have else "") + f"; {allows}"

    def to_dict(self) -> dict[str, Any]:
        return {"isa": self.isa, "flags": sorted(self.flags), "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CpuCapabilities:
        return cls(isa=str(data["isa"]), flags=frozenset(data.get("flags", ())), name=str(data.get("name", "")))


def _above(flag: str, isa: str) -> bool:
    """Whether `flag` names instructions beyond ATen's vector level `isa`: AVX-512 and AMX below "AVX512", and AVX2's
    too (AVX2, FMA, AVX-VNNI, AVX-NE-CONVERT, ...) below "AVX2"."""
    if isa.startswith("AVX512"):
        return False
    if flag.startswith(("avx512", "amx")):
        return True
    return not isa.startswith("AVX2") and flag.startswith(("avx", "fma", "f16c"))


def reported_capabilities() -> dict[str, Any]:
    """`torch.cpu.get_capabilities()` (PyTorch 2.9 on); before it, the flags of Linux's /proc/cpuinfo, renamed."""
    report = getattr(torch.cpu, "get_capabilities", None)
    if report is not None:
        return dict(report())
    cpuinfo = Path("/proc/cpuinfo")
    words = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    renamed = {"avx512f": "avx512_f", "avx512bw": "avx512_bw", "avx512vl": "avx512_vl", "avx512dq": "avx512_dq"}
    return {renamed.get(word, word): True for word in words}  # the other flags Linux and PyTorch name alike


@dataclass(frozen=True)
class AttentionKernelLimits:
    """Key lengths up to which plain matrix products (`layers.kernels.grouped_attention`) beat SDPA for one dtype
    on the CPU: `decode_keys` for a single query (a decoding step), `pass_keys` for a causal pass over T = S keys
    (training, prefill). 0: SDPA always."""

    decode_keys: int = 0
    pass_keys: int = 0


@dataclass(frozen=True)
class Profile:
    """Kernel choices measured on one machine (`attnkit tune`), or the documented defaults.

    attention: dtype name ("bf16", "fp16") -> limits for the math kernel; a dtype not listed uses SDPA.
    decode_linear: dtype name -> the layout of linear layers for eager decoding ("plain", "transposed", "packed",
        "gemv+packed", "gemv", "native", "native+packed"); "int8", "int4" -> the kernel of those weights ("native",
        "pytorch").
    dtype_speed: dtype name -> decoding matrix-product time relative to fp32 (> 1: slower), as measured.
    timings: what was measured, for the plan to show: a comparison ("linear fp32") -> candidate -> milliseconds.
    source: where the profile came from (a path, or "defaults").
    """

    attention: dict[str, AttentionKernelLimits]
    decode_linear: dict[str, str]
    dtype_speed: dict[str, float] = field(default_factory=dict)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu: CpuCapabilities | None = None
    torch_version: str = ""
    source: str = "defaults"

    def to_json(self) -> str:
        data = {
            "version": PROFILE_VERSION,
            "cpu": self.cpu.to_dict() if self.cpu else None,
            "torch": self.torch_version,
            "attention": {k: dataclasses.asdict(v) for k, v in self.attention.items()},
            "decode_linear": self.decode_linear,
            "dtype_speed": self.dtype_speed,
            "timings": self.timings,
        }
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_fields(cls, fields: FileFields) -> Profile:
        """A profile written by `to_json`, checked field by field (`attnkit.readback`): InputError naming the file,
        the field and the fix for a version, type or value `attnkit tune` does not write (a negative limit, "abc"
        for a number, a layout it does not know)."""
        version = fields.get("version")
        if version != PROFILE_VERSION:
            fields.refuse("version", version, f"{PROFILE_VERSION}, the version this attnkit writes")
        attention = fields.mapping("attention")
        limits = {}
        for name in attention:
            entry = attention.mapping(name)
            limits[name] = AttentionKernelLimits(decode_keys=entry.integer("decode_keys", minimum=0),
                                                 pass_keys=entry.integer("pass_keys", minimum=0))
        layouts = fields.mapping("decode_linear")
        speeds = fields.mapping("dtype_speed", default=None)
        timings = fields.mapping("timings", default=None)
        cpu = fields.mapping("cpu", default=None)
        return cls(
            attention=limits,
            decode_linear={name: layouts.string(name, choices=DECODE_LAYOUTS) for name in layouts},
            dtype_speed={name: float(speeds.number(name, positive=True)) for name in speeds} if speeds else {},
            timings={what: {name: float(timings.mapping(what).number(name, positive=True))
                            for name in timings.mapping(what)} for what in timings} if timings else {},
            cpu=CpuCapabilities(isa=cpu.string("isa"), flags=frozenset(cpu.strings("flags", default=[])),
                                name=cpu.string("name", default="")) if cpu else None,
            torch_version=fields.string("torch", default=""),
            source=fields.source,
        )


# Without a profile: SDPA and grouped_attention were timed on a 2-core AVX-512 EPYC (`python -m benchmarks
# attention`): for bf16, plain products won up to 512 cached keys for a decoding query and up to 128 keys for a
# causal training pass. On other CPUs `attnkit tune` measures the same comparison. Linear layers, for one decoding
# row (`python -m benchmarks bandwidth`, on AVX-512 EPYCs and under their AVX2 kernels): the hand-written products
# (`generate/native_gemv.py`) read `gpt2-124m`'s fp32 weights at a plain sum's rate, where MKL's read them at about
# 0.7 of it; bf16 as fast as ATen's matrix-vector kernel with AVX-512 and 1.35x faster under AVX2, several rows
# through the packed weight where oneDNN packs (`native+packed`); int8 and int4 weights with fp32 inputs 4-10x
# faster than PyTorch's kernels, which are vectorized only for bf16 inputs.
DEFAULT_PROFILE = Profile(
    attention={"bf16": AttentionKernelLimits(decode_keys=512, pass_keys=128),
               "fp16": AttentionKernelLimits(decode_keys=512, pass_keys=128)},
    decode_linear={"fp32": "native", "bf16": "native+packed", "int8": "native", "int4": "native"},
)


def free_bytes(device: torch.device) -> int | None:
    """The memory free on `device`: CUDA's free memory, or the system's available memory (Linux' MemAvailable,
    else free pages); None when it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n_bytes: int) -> str:
    """A size in GiB, for messages."""
    return f"{n_bytes / 2**30:.1f} GiB"


def cache_home() -> Path:
    """Where attnkit keeps what it measures or builds for this machine: ~/.cache/attnkit (under $XDG_CACHE_HOME
    where set)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit"


def default_profile_path(cpu: CpuCapabilities | None = None) -> Path:
    """$ATTNKIT_PROFILE, else `cache_home()`/profiles/ and a name of `cpu`'s (default: this one's) model, vector
    level and flags and PyTorch's version: an AVX-512 CPU run with its AVX2 kernels, or a new PyTorch, keeps a
    profile of its own beside the others."""
    if os.environ.get(PROFILE_ENV):
        return Path(os.environ[PROFILE_ENV])
    cpu = cpu or CpuCapabilities.detect()
    key = json.dumps([cpu.to_dict(), torch.__version__], sort_keys=True).encode()
    return cache_home() / "profiles" / f"{cpu.isa.lower()}-{hashlib.blake2b(key, digest_size=6).hexdigest()}.json"


def kept_by_attnkit(path: str | Path) -> bool:
    """Whether `path` lies where attnkit keeps what it measures (under `cache_home()`): a profile there that this
    attnkit cannot read is its own, to measure again or plan without; one elsewhere ($ATTNKIT_PROFILE) is the user's,
    refused naming the fix."""
    return Path(path).resolve().is_relative_to(cache_home().resolve())


def load_profile(path: str | Path | None = None, cpu: CpuCapabilities | None = None) -> tuple[Profile, str]:
    """The profile to plan with and why: the one at `path` (default: `default_profile_path()`) when it was measured
    on this CPU and PyTorch, else `DEFAULT_PROFILE`."""
    path = Path(path) if path is not None else default_profile_path(cpu)
    if not path.is_file():
        return DEFAULT_PROFILE, f"no profile at {path}: documented defaults (`attnkit tune` measures this machine)"
    profile = Profile.from_fields(FileFields.read(path, fix=PROFILE_FIX))
    cpu = cpu or CpuCapabilities.detect()
    if profile.cpu != cpu or profile.torch_version != torch.__version__:
        return DEFAULT_PROFILE, (f"{path} was measured on another CPU or PyTorch ({profile.torch_version}): "
                                 "documented defaults (run `attnkit tune` again)")
    return profile, f"measured on this machine ({path})"
