"""Hand-written matrix products for decoding (`native/gemv.c`), for the forms PyTorch has no fast CPU kernel for;
and one decoding query's attention.

A decoding step multiplies one row (or a few) by every weight matrix, so its speed is the speed of reading the
weights. PyTorch's kernels read them below the memory's rate in every form measured here (`python -m benchmarks
bandwidth`, docs/benchmarks.md): fp32 through MKL's matrix-vector product at about 0.7x of a plain sum's rate,
int8 weights with fp32 inputs through a scalar loop (10-50x slower than bf16), 4-bit weights only with bf16
inputs, and torch.compile's generated reductions keep one accumulator, which caps int8 and int4 rows below the
memory's rate. `native/gemv.c` reads each form at the memory's rate where the arithmetic allows it, with fp32
inputs and arithmetic throughout:

    gemv_f32(weight, x, bias)                  weight (N, K) fp32
    gemv_bf16(weight, x, bias)                 weight (N, K) bf16, widened to fp32 as read; where the CPU reports
                                               AVX512-BF16 and x is bf16, bf16 pairs multiplied and summed into fp32
                                               by its dot-product instruction (`vdpbf16ps`), unwidened, and by
                                               its twin writing the sums rounded to bf16 for a bf16 layer
    gemv_i8(weight, scales, x, bias)           weight (N, K) int8, scales (N,) fp32: one per output row
    gemv_i4(codes, scales, offsets, x, bias)   codes (N, K / 2) uint8 (`pack_int4`), scales and offsets (N, K / 32)
                                               fp32: weights (code - 8) * scale + zero, offset = zero - 8 * scale
                                               x (M, K), bias (N,) fp32 or None -> (M, N) fp32 in each
    attend_one(q, k, v, scale)                 one decoding query's attention over every cached key, fp32 or bf16
                                               (`attend_one_query`: the plan's one-query kernel, None where it does
                                               not take the inputs)
    dense_product(weight, bias, scales)        the fp32, bf16 or int8 product bound to one weight: its checks and
                                               addresses taken once, when a decoding layer is built, so that a step's
                                               call costs one ctypes call and one output tensor (`DenseProduct`);
                                               `layer_product` binds it again where a layer's tensors were replaced

The library is built on first use with the machine's C compiler ($CC, else cc, gcc or clang), about a second, for
the vector level the CPU reports (`build_for`: AVX-512 F/BW/VL/DQ with AVX512-BF16, else AVX-512 F/BW/VL/DQ, else
AVX2 and FMA; an AVX-512 CPU run with its AVX2 kernels, `ATEN_CPU_CAPABILITY=avx2`, gets the AVX2 build), and kept
under `cache_home()`/kernels, named by a digest of its source, flags and compiler, beside the digest of the built
file, which is checked before each load (a file that does not match is built again). `unavailable()` says why the
kernels cannot run here (a CPU without AVX2 and FMA, no compiler, a failed build); the inference plan then keeps
PyTorch's kernels and says so. Calls release the interpreter lock (ctypes); the products share output rows among
`torch.get_num_threads()` OpenMP threads, and `attend_one` runs on one.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from attnkit.machine import CpuCapabilities, cache_home

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "gemv.c"
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-lm")
AVX512 = ("-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
BUILDS = {  # vector level -> (the CPU flags it needs, as PyTorch names them; the compiler flags that target it)
    "avx512_bf16": (("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16", "avx2", "fma3"),
                    (*AVX512, "-mavx512bf16")),
    "avx512": (("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx2", "fma3"),
               AVX512),
    "avx2": (("avx2", "fma3"), ("-mavx2", "-mfma")),
}
INT4_GROUP = 32  # inputs per scale and zero in `gemv_i4` (the source's INT4_GROUP)
BUILD_TIMEOUT_S = 300

_POINTER, _SIZE, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {  # argument types of each exported function
    "gemv_f32": [_POINTER] * 4 + [_SIZE] * 3 + [_INT],
    "gemv_bf16": [_POINTER] * 4 + [_SIZE] * 3 + [_INT],
    "gemv_i8": [_POINTER] * 5 + [_SIZE] * 3 + [_INT],
    "gemv_i4": [_POINTER] * 7 + [_SIZE] * 3 + [_INT],
    "gemv_bf16_dot": [_POINTER] * 4 + [_SIZE] * 3 + [_INT],  # the AVX512-BF16 build's only
    "gemv_bf16_dot_to_bf16": [_POINTER] * 4 + [_SIZE] * 3 + [_INT],  # the same, its sums rounded to bf16
    "attend_one": [_POINTER] * 4 + [_SIZE] * 11 + [ctypes.c_float, _INT],  # returns 0, or 1 without memory
}
DOT_ONLY = ("gemv_bf16_dot", "gemv_bf16_dot_to_bf16")  # the kernels only the AVX512-BF16 build has
ROUNDED = {"gemv_bf16_dot": "gemv_bf16_dot_to_bf16"}  # a kernel -> its twin writing its sums rounded to bf16


def compiler() -> list[str] | str:
    """The C compiler to build with, as a command: $CC (which may carry a launcher or flags: "ccache gcc"), else the
    first of cc, gcc, clang on the PATH; or, where there is none, why not in one line."""
    if os.environ.get("CC"):
        command = shlex.split(os.environ["CC"])
        found = shutil.which(command[0]) if command else None
        return [found, *command[1:]] if found else f"$CC is {os.environ['CC']!r}, which is not a program on PATH"
    found = next((path for name in ("cc", "gcc", "clang") if (path := shutil.which(name))), None)
    return [found] if found else "no C compiler found to build them (install gcc, or set $CC)"


def build_for(cpu: CpuCapabilities) -> str | None:
    """The build that runs on `cpu` ("avx512", "avx2"), or None where it lacks AVX2 and FMA."""
    return next((name for name, (needs, _) in BUILDS.items() if set(needs) <= cpu.flags), None)


def bf16_dot(cpu: CpuCapabilities | None = None) -> bool:
    """Whether `gemv_bf16` multiplies bf16 rows with AVX512-BF16's dot product on `cpu` (default: this one): the CPU
    reports AVX512-BF16 and, on this one, the library was built with it."""
    if cpu is not None and cpu != _this_cpu():
        return build_for(cpu) == "avx512_bf16"  # a plan for another CPU: whether it builds there is its question
    return _bf16_dot_here()


@functools.cache
def _bf16_dot_here() -> bool:
    """`bf16_dot` for this CPU, asked once: every bf16 decoding product asks it."""
    library = _library()
    built = not isinstance(library, str) and hasattr(library, "gemv_bf16_dot")
    return build_for(_this_cpu()) == "avx512_bf16" and built


def unavailable(cpu: CpuCapabilities | None = None) -> str | None:
    """None where the kernels can run for `cpu` (default: this one) and are built; else why not, in one line."""
    cpu = cpu or _this_cpu()
    build = build_for(cpu)
    if build is None:
        return f"they need AVX2 and FMA, and this CPU reports neither both nor AVX-512 ({cpu.isa})"
    if cpu != _this_cpu():
        return None  # a plan for another CPU: whether it builds there is that machine's question
    loaded = _library()
    return loaded if isinstance(loaded, str) else None


@functools.cache
def _this_cpu() -> CpuCapabilities:
    return CpuCapabilities.detect()


def library_path(cc: list[str], build: str) -> Path:
    """Where the library `cc` builds from this source for `build` is kept."""
    version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = (*FLAGS, *BUILDS[build][1])
    digest = hashlib.sha256(SOURCE.read_bytes() + repr((flags, version)).encode()).hexdigest()[:16]
    return cache_home() / "kernels" / f"gemv-{build}-{digest}.so"


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(cc: list[str], build: str, path: Path) -> None:
    """Compile the library for `build` to `path`, whole or not at all, with the digest of what was written beside
    it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("building the native decoding kernels with %s (once; kept in %s)", cc, path.parent)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        built = Path(scratch) / path.name
        done = subprocess.run([*cc, *FLAGS, *BUILDS[build][1], "-o", str(built), str(SOURCE)], capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(f"{Path(cc[0]).name} failed: {(done.stderr.strip().splitlines() or ['no message'])[-1]}")
        digest = Path(scratch) / "digest"
        digest.write_text(_file_digest(built))
        os.replace(built, path)
        os.replace(digest, path.with_suffix(".sha256"))


def _load(cc: list[str], build: str) -> ctypes.CDLL:
    """The library of `build`, built first where none that matches its digest is kept."""
    path = library_path(cc, build)
    digest = path.with_suffix(".sha256")
    if not (path.is_file() and digest.is_file() and digest.read_text().strip() == _file_digest(path)):
        _build(cc, build, path)
    library = ctypes.CDLL(str(path))
    for name, argtypes in _SIGNATURES.items():
        if name in DOT_ONLY and build != "avx512_bf16":
            continue
        getattr(library, name).argtypes = argtypes
        getattr(library, name).restype = _INT if name == "attend_one" else None
    return library


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The library for this CPU, or why it cannot be had. Where the AVX512-BF16 build fails (a compiler that does not
    know -mavx512bf16), the plain AVX-512 one serves, without `gemv_bf16_dot`."""
    build = build_for(_this_cpu())
    if build is None:
        return "they need AVX2 and FMA"
    cc = compiler()
    if isinstance(cc, str):
        return cc
    try:
        return _load(cc, build)
    except (OSError, subprocess.SubprocessError) as err:
        if build != "avx512_bf16":
            return f"building them failed ({err})"
        log.warning("the AVX512-BF16 kernels did not build (%s): bf16 rows are widened to fp32 instead", err)
    try:
        return _load(cc, "avx512")
    except (OSError, subprocess.SubprocessError) as err:
        return f"building them failed ({err})"


def _kernel(name: str):
    library = _library()
    if isinstance(library, str):
        raise RuntimeError(f"the native decoding kernels cannot run here: {library}")
    return getattr(library, name)


def _rows(x: Tensor, width: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """x (M, K) as the contiguous rows of `dtype` the kernels read."""
    if x.dim() != 2 or x.shape[1] != width or not x.is_cpu:
        raise ValueError(f"expected CPU rows (M, {width}), got {tuple(x.shape)} on {x.device}")
    if x.dtype == dtype and x.is_contiguous():  # a decoding step's rows, as a rule: no call to convert them
        return x
    return x.to(dtype).contiguous()


def _weight(tensor: Tensor, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> None:
    """Refuse a tensor the kernel would read out of bounds or misread: it must be contiguous CPU `dtype` of `shape`."""
    if tensor.dtype != dtype or tuple(tensor.shape) != shape or not tensor.is_contiguous() or not tensor.is_cpu:
        layout = "contiguous" if tensor.is_contiguous() else "strided"
        raise ValueError(f"{what} must be a contiguous CPU {dtype} tensor of shape {shape}, not a {layout} "
                         f"{tensor.dtype} one of shape {tuple(tensor.shape)} on {tensor.device}")


def _bias(bias: Tensor | None, n: int) -> int | None:
    """The address of an fp32 bias (N,) for the kernels, or None (NULL: no bias)."""
    if bias is None:
        return None
    _weight(bias, torch.float32, (n,), "bias")
    return bias.data_ptr()


DENSE_WEIGHTS = {"gemv_f32": torch.float32, "gemv_bf16": torch.bfloat16, "gemv_bf16_dot": torch.bfloat16,
                 "gemv_i8": torch.int8}  # each kernel of whole weight rows -> the weight dtype it reads


def _tables(kernel: str, weight: Tensor, bias: Tensor | None, scales: Tensor | None) -> tuple[int | None, ...]:
    """The addresses `kernel` reads before the rows' (the weight's, int8's scales', the bias's or NULL), once the
    tensors are checked: ValueError for one the kernel would misread."""
    n = weight.shape[0]
    _weight(weight, DENSE_WEIGHTS[kernel], tuple(weight.shape), "weight")
    if scales is None:
        return weight.data_ptr(), _bias(bias, n)
    _weight(scales, torch.float32, (n,), "scales")
    return weight.data_ptr(), scales.data_ptr(), _bias(bias, n)


def _dense(kernel: str, weight: Tensor, x: Tensor, bias: Tensor | None, scales: Tensor | None = None,
           rows_dtype: torch.dtype = torch.float32) -> Tensor:
    """x (M, K) @ weight^T + bias through `kernel` for one call -> (M, N) fp32, the tensors checked for it: the
    one-call functions' product (a captured step's operators are given their tensors anew each call), where building
    a `DenseProduct` for one call would add its binding to the checks."""
    tables = _tables(kernel, weight, bias, scales)
    n, k = weight.shape
    rows = _rows(x, k, rows_dtype)
    out = torch.empty(rows.shape[0], n)
    _kernel(kernel)(*tables, rows.data_ptr(), out.data_ptr(), rows.shape[0], n, k, torch.get_num_threads())
    return out


class DenseProduct:
    """x (M, K) @ weight^T + bias for one fp32, bf16 or int8 weight (N, K) (int8: times its `scales` (N,) fp32), bias
    (N,) fp32 or None -> (M, N) fp32, or in the `dtype` a call asks for, with the weight's checks and addresses taken
    once, when a layer is built (`decode_layout.NativeLinear`, `quantize.NativeInt8Linear`): a decoding step calls its
    products one row at a time, where the Python around a kernel call rivals the kernel's own time. A kernel with a
    twin that rounds its sums to bf16 as it writes them (`ROUNDED`) serves a call asking for bf16 with no conversion
    after it; the numbers are those of the fp32 output converted, bit for bit.

    kernels: the rows' dtype -> the kernel that reads rows of it ("gemv_f32", "gemv_bf16", "gemv_bf16_dot",
    "gemv_i8"), all of one weight dtype; rows of any other dtype are converted to the first one's. The product holds
    its tensors and, each call, checks that their memory has not moved under them (`.data =`, `set_` and
    `share_memory_` give a tensor new memory and free the old): where it has, it checks and binds them again, so it
    never reads a freed address; a layer whose tensors are replaced by others builds a new one. Raises ValueError for
    a weight, scales or bias the kernels would misread, and for rows not (M, K) on the CPU."""

    def __init__(self, weight: Tensor, bias: Tensor | None, kernels: dict[torch.dtype, str],
                 scales: Tensor | None = None) -> None:
        self.weight, self.bias, self.scales = weight, bias, scales
        self._names, self._fallback = dict(kernels), next(iter(kernels))
        self._bind()

    def _bind(self) -> None:
        """Check the tensors and bind the kernels to their addresses, kept last (a call on another thread that reads
        them finds the kernels bound to them)."""
        self.out_features, self.in_features = self.weight.shape
        tables = _tables(self._names[self._fallback], self.weight, self.bias, self.scales)
        self._kernels = {dtype: functools.partial(_kernel(name), *tables) for dtype, name in self._names.items()}
        self._rounded = {(dtype, torch.bfloat16): functools.partial(_kernel(ROUNDED[name]), *tables)
                         for dtype, name in self._names.items() if name in ROUNDED}  # (rows, output) dtypes -> twin
        self._addresses = self._where()

    def _where(self) -> tuple[int, int | None, int | None]:
        """Where the weight, scales and bias lie now."""
        return (self.weight.data_ptr(), None if self.scales is None else self.scales.data_ptr(),
                None if self.bias is None else self.bias.data_ptr())

    def __reduce__(self):  # copied (a model's deepcopy) or pickled as what it is built from: addresses are per process
        return DenseProduct, (self.weight, self.bias, self._names, self.scales)

    def reads(self, weight: Tensor, bias: Tensor | None, scales: Tensor | None = None) -> bool:
        """Whether this product reads these tensors (a layer's, which `.to` or an assignment may have replaced)."""
        return self.weight is weight and self.bias is bias and self.scales is scales

    def __call__(self, x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """x (M, K) -> (M, N) in `dtype`: written so by the kernel's rounding twin where it has one, else converted."""
        if self._where() != self._addresses:  # moved under the same tensors: the bound addresses may be freed
            self._bind()
        kernel, written = self._kernels.get(x.dtype), torch.float32
        if kernel is None or x.dim() != 2 or x.shape[1] != self.in_features or not (x.is_contiguous() and x.is_cpu):
            kernel = self._kernels[self._fallback]
            x = _rows(x, self.in_features, self._fallback)  # (M, K); refuses rows of another shape or device
        elif dtype != written and (x.dtype, dtype) in self._rounded:
            kernel, written = self._rounded[x.dtype, dtype], dtype
        rows = x.shape[0]
        out = torch.empty(rows, self.out_features, dtype=written)
        kernel(x.data_ptr(), out.data_ptr(), rows, self.out_features, self.in_features, torch.get_num_threads())
        return out if written == dtype else out.to(dtype)


def dense_product(weight: Tensor, bias: Tensor | None, scales: Tensor | None = None) -> DenseProduct:
    """The native product of an fp32, bf16 or int8 `weight` (N, K) (int8: times its `scales` (N,) fp32) and fp32
    `bias` (N,) or None, for rows of any float dtype: fp32 weights through `gemv_f32`; int8 ones through `gemv_i8`
    with the rows in fp32; bf16 ones through `gemv_bf16_dot` for bf16 rows where the CPU has AVX512-BF16
    (`bf16_dot`), else through `gemv_bf16` with the rows in fp32."""
    if weight.dtype == torch.int8:
        return DenseProduct(weight, bias, {torch.float32: "gemv_i8"}, scales)
    if weight.dtype == torch.float32:
        return DenseProduct(weight, bias, {torch.float32: "gemv_f32"})
    dot = {torch.bfloat16: "gemv_bf16_dot"} if bf16_dot() else {}
    return DenseProduct(weight, bias, {torch.float32: "gemv_bf16", **dot})


def layer_product(layer: torch.nn.Module, *, bias: str = "bias", scales: str | None = None) -> DenseProduct:
    """The product a decoding layer calls (`layer.product`, a `dense_product`), reading the layer's `weight` and its
    tensors named `bias` and `scales` as they are now: the layer's own product where it reads them (one identity check
    each), else, where `.to` or an assignment replaced them, a new one, kept as `layer.product`, with the bias and
    scales widened to fp32 in the layer again where `.to(dtype)` converted them (the kernels read them in fp32). Used
    by every layer that holds a `DenseProduct` (`decode_layout.NativeLinear`, `quantize.NativeInt8Linear`)."""
    names = (bias, scales)
    tensors = [None if name is None else getattr(layer, name) for name in names]  # bias (N,), scales (N,), or None
    if layer.product.reads(layer.weight, *tensors):
        return layer.product
    for name, tensor in zip(names, tensors, strict=True):
        if tensor is not None and tensor.dtype != torch.float32:
            setattr(layer, name, tensor.float())
    bias_now, scales_now = (None if name is None else getattr(layer, name) for name in names)
    layer.product = dense_product(layer.weight, bias_now, scales_now)
    return layer.product


def gemv_f32(weight: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (M, K) @ weight^T + bias, weight (N, K) fp32, bias (N,) fp32 or None -> (M, N) fp32."""
    return _dense("gemv_f32", weight, x, bias)


def gemv_bf16(weight: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (M, K) @ weight^T + bias, weight (N, K) bf16 read as it is stored and computed in fp32, bias (N,) fp32 or
    None -> (M, N) fp32. bf16 rows x on a CPU with AVX512-BF16 (`bf16_dot`) go through `gemv_bf16_dot`."""
    if x.dtype == torch.bfloat16 and bf16_dot():
        return gemv_bf16_dot(weight, x, bias)
    return _dense("gemv_bf16", weight, x, bias)


def gemv_bf16_dot(weight: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (M, K) @ weight^T + bias for bf16 weight (N, K) and bf16 rows x, each pair's product exact and summed in fp32
    by AVX512-BF16's `vdpbf16ps` (subnormal inputs read as zero), bias (N,) fp32 or None -> (M, N) fp32. Raises
    RuntimeError on a CPU without AVX512-BF16 (`bf16_dot`)."""
    if not _bf16_dot_here():
        raise RuntimeError(f"the bf16 dot-product kernel needs AVX512-BF16; this CPU reports {_this_cpu().isa}")
    return _dense("gemv_bf16_dot", weight, x, bias, rows_dtype=torch.bfloat16)


def gemv_i8(weight: Tensor, scales: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (M, K) @ (weight * scales[:, None])^T + bias, weight (N, K) int8, scales (N,) fp32, bias (N,) fp32 or None
    -> (M, N) fp32."""
    return _dense("gemv_i8", weight, x, bias, scales)


def pack_int4(codes: Tensor) -> Tensor:
    """4-bit codes (N, K), integers 0..15, K a multiple of 32 -> (N, K / 2) uint8 as `gemv_i4` reads them: in each
    group of 32 codes, byte j holds code j in its low half and code j + 16 in its high half (llama.cpp's q4_0 order,
    which unpacks a group's two halves with one mask and one shift). Raises ValueError for codes of a floating dtype or
    outside 0..15, which four bits cannot hold (a code of 16 would wrap to 0 and spill into its neighbour's half):
    clamp them to the grid first (`quantize.int4_grid` does)."""
    rows, inputs = codes.shape
    if inputs % INT4_GROUP:
        raise ValueError(f"4-bit rows are packed in groups of {INT4_GROUP}; got {inputs} codes a row")
    if codes.is_floating_point() or codes.is_complex():
        raise ValueError(f"4-bit codes must be integers 0..15, not {codes.dtype}: round and clamp them first")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError(f"4-bit codes must lie in 0..15; got {int(codes.min())}..{int(codes.max())}: clamp them to "
                         f"the grid first")
    groups = codes.to(torch.uint8).reshape(rows, inputs // INT4_GROUP, INT4_GROUP)  # (N, G, 32)
    return (groups[..., : INT4_GROUP // 2] | (groups[..., INT4_GROUP // 2:] << 4)).reshape(rows, inputs // 2)


def unpack_int4(packed: Tensor) -> Tensor:
    """`pack_int4`'s inverse: (N, K / 2) uint8 -> the codes (N, K), uint8 in 0..15."""
    rows = packed.shape[0]
    halves = [half.reshape(rows, -1, INT4_GROUP // 2) for half in (packed & 15, packed >> 4)]  # codes j, j + 16
    return torch.cat(halves, dim=-1).reshape(rows, -1)


def gemv_i4(codes: Tensor, scales: Tensor, offsets: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (M, K) @ W^T + bias for 4-bit weights W = (code - 8) * scale + zero in groups of 32 inputs: codes (N, K / 2)
    from `pack_int4`, scales and offsets = zero - 8 * scale (N, K / 32) fp32, K a multiple of 32, bias (N,) fp32 or
    None -> (M, N) fp32."""
    n, half = codes.shape
    k = 2 * half
    _weight(codes, torch.uint8, (n, half), "codes")
    if k % INT4_GROUP:
        raise ValueError(f"4-bit rows hold groups of {INT4_GROUP} inputs; got {k} inputs")
    for tensor, what in ((scales, "scales"), (offsets, "offsets")):
        _weight(tensor, torch.float32, (n, k // INT4_GROUP), what)
    rows = _rows(x, k)
    sums = rows.view(rows.shape[0], k // INT4_GROUP, INT4_GROUP).sum(dim=-1)  # (M, K / 32): each group's inputs
    out = torch.empty(rows.shape[0], n)
    _kernel("gemv_i4")(codes.data_ptr(), scales.data_ptr(), offsets.data_ptr(), _bias(bias, n), rows.data_ptr(),
                       sums.data_ptr(), out.data_ptr(), rows.shape[0], n, k, torch.get_num_threads())
    return out


ONE_QUERY_DTYPES = (torch.float32, torch.bfloat16)  # what `attend_one` reads


def attends_one(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether `attend_one` takes these: q (B, H, 1, D) and k, v (B, Hkv, S, D) of one shape, S >= 1 and H a multiple
    of Hkv, all in CPU memory (the kernel reads their addresses), of one dtype it reads, k and v with D's stride 1; no
    gradient asked for (the kernel records none); outside a traced step (which cannot call into C)."""
    queries, keys = q.shape, k.shape  # (B, H, 1, D), (B, Hkv, S, D)
    return (len(queries) == len(keys) == 4 and keys == v.shape and queries[2] == 1 and keys[2] > 0 and keys[1] > 0
            and queries[1] % keys[1] == 0 and queries[0] == keys[0] and queries[3] == keys[3]
            and q.dtype in ONE_QUERY_DTYPES and q.dtype == k.dtype == v.dtype and q.is_cpu and k.is_cpu and v.is_cpu
            and k.stride(-1) == v.stride(-1) == 1
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            and not tracing())


def attend_one(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale) v over every key for one query a head, computed in fp32 (`native/gemv.c`): q (B, H, 1, D),
    k and v (B, Hkv, S, D) views at any strides but D's, H a multiple of Hkv (grouped queries) -> (B, H, 1, D) in q's
    dtype. No mask: a decoding query may see every key its cache holds. Raises ValueError for inputs `attends_one`
    refuses and MemoryError where the kernel's scratch (S + D floats) cannot be had."""
    out = attend_one_query(q, k, v, scale)
    if out is None:
        raise ValueError(f"attend_one takes one CPU query a head, q (B, H, 1, D) and k, v (B, Hkv, S >= 1, D) of "
                         f"one float32 or bfloat16 dtype with D's stride 1, needing no gradient; got {tuple(q.shape)} "
                         f"{q.dtype} {q.device}, {tuple(k.shape)} {k.dtype} {k.device}, {tuple(v.shape)} {v.dtype} "
                         f"{v.device}")
    return out


def attend_one_query(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor | None:
    """`attend_one` where it takes these inputs (`attends_one`, asked once: a decoding step calls this for every
    layer), else None: the one-query kernel the inference plan hands attention (`layers.kernels.MathKernel.one_query`),
    which falls back to the math kernel on None."""
    if not attends_one(q, k, v):
        return None
    batch, heads, _, dim = q.shape
    q = q.contiguous()  # (B, H, 1, D): a fused projection's view is strided
    out = torch.empty_like(q)
    if _kernel("attend_one")(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), batch, heads, k.shape[1],
                             k.shape[2], dim, *k.stride()[:3], *v.stride()[:3], scale, q.dtype == torch.bfloat16):
        raise MemoryError(f"attend_one could not allocate {k.shape[2] + dim} floats of scratch")
    return out


def tracing() -> bool:
    """Whether a step is being compiled or exported: torch.compile and torch.export cannot trace into a ctypes call,
    so the layers then call their products as PyTorch operators, which a compiled step keeps opaque and calls (an
    AOTInductor package through its proxy executor: `quantize.native_int8_op`, `quantize.native_int4_op`)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()
