"""A decoding step captured ahead of time: exported once, compiled into a shared library by AOTInductor, and run
as one call per token.

torch.compile (`static_decode.py`) keeps Python in every step: the compiled graph is entered through Python, with
guards checked first. A captured step leaves none of that:

    torch.export      `static_step` as a function of (token, slot, filled, cache buffers) -> logits: one graph,
                      the cache length left symbolic, so one capture serves every length
    AOTInductor       that graph -> C++ and a shared library in a package (.pt2), norms, activations, attention
                      and residual additions fused into loops
    each step         one call into the library: no Python per layer, no guards, no graph lookup

Two forms of the step are captured, each the first time it is needed (`STEP_FORMS`):

    one-row    batch size 1, the decoding of a single prompt. A matrix product of one row is a matrix-vector
               product, bound by reading the weight; ATen's kernels read an fp32 weight at about half the rate a
               plain sum reads memory, oneDNN an unpacked bf16 one slower still. So each product is captured as
               a reduction over the weight's rows (`row_products`), which inductor compiles into one vectorized
               loop reading each weight once (fp32, bf16 and, with AVX-512, int8 weights alike: the int8 bytes are
               what it reads; under AVX2 inductor's int8 loop is scalar, `CpuCapabilities.int8_loops_vectorized`, and an
               int8 kernel runs instead)
    rows       any batch size from 2: matrix products

The weights are arguments of the library, not part of it: a loaded package reads the model's own tensors (no
second copy in memory or on disk), so every checkpoint of one architecture shares its packages.

Capture takes tens of seconds (a C++ compiler runs), so packages are kept on disk and a second start loads them in
a fraction of a second. Their names hold a digest of everything the library depends on: the model's structure and
settings, its tensors' shapes and dtypes, the source the step can run (`step_sources`: attnkit's but the layers
that never run in a step, and the files of the model's own module classes), PyTorch's version, the CPU's
capabilities and the thread count inductor wrote its loops for; anything else gets packages of its own. They are
kept under `default_package_dir()` (`$ATTNKIT_COMPILED`, else `machine.cache_home()`/compiled); deleting that folder
only costs the next start its capture. Each package's SHA-256 is recorded beside it (`.pt2.sha256`) and checked
before it is loaded: a damaged one is captured again (`kept_package`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.checkpoint import digest
from attnkit.errors import InputError
from attnkit.generate.decoder import Window
from attnkit.generate.quantize import Int4Linear
from attnkit.generate.static_decode import StaticDecoding, static_step
from attnkit.layers.kv_cache import StaticKVCache
from attnkit.machine import CpuCapabilities, cache_home
from attnkit.outputs import atomic_write

log = logging.getLogger(__name__)
PACKAGE_DIR_ENV = "ATTNKIT_COMPILED"  # where captured steps are kept, when set
EXAMPLE_BATCH, EXAMPLE_CACHE_LEN = 2, 37  # the shapes traced; neither 0 nor 1, which torch.export would fix


def default_package_dir() -> Path:
    """$ATTNKIT_COMPILED, else `machine.cache_home()`/compiled."""
    return Path(os.environ.get(PACKAGE_DIR_ENV) or cache_home() / "compiled")


class StepGraph(nn.Module):
    """`static_step` with its cache given as tensors, the form torch.export traces:
    (token (B, 1), slot (1,), filled (B, S), buffers [(B, Hkv, S, D)] * 2L) -> logits (B, V); writes the buffers at
    `slot` in place."""

    def __init__(self, model: nn.Module, template: StaticKVCache) -> None:
        super().__init__()
        self.model = model
        self.template = template  # its layers' structure; its tensors are replaced by the arguments

    def forward(self, token: Tensor, slot: Tensor, filled: Tensor, buffers: list[Tensor]) -> Tensor:
        return static_step(self.model, token, self.template.over(buffers, slot, filled))


class CapturedDecoding(StaticDecoding):
    """Decoding `model` as `StaticDecoding` does (eager prefill, fixed-shape steps over a `StaticKVCache`), each step
    one call into an AOTInductor package (see the module docstring). Built from a model already prepared for
    inference (`plan.py`), whose tensors the packages read as they run. Captures, or loads the kept package of, the
    one-row step when built; the several-row step at the first step with several rows.

    package_dir: where packages are kept (default `default_package_dir()`). `capture_s`, `load_s` and `steps_run`
    record, per form, the seconds its capture and its load took and the steps its package has run.
    """

    def __init__(self, model: nn.Module, *, package_dir: str | Path | None = None) -> None:
        if _has_int4_weights(model):
            raise InputError("a step with int4 weights cannot be captured (inductor derives new weight tensors from "
                             "them); use compile=True (torch.compile's step) for int4, or int8 weights")
        super().__init__(model, compile=False)  # the eager static step: what is captured, and the tests' reference
        folder = Path(package_dir) if package_dir is not None else default_package_dir()
        digest = package_digest(model)
        self.package_paths = {form: folder / f"step-{digest}-{form}.pt2" for form in STEP_FORMS}
        self.capture_s: dict[str, float] = {}  # seconds each form took to capture (absent: loaded from disk)
        self.load_s: dict[str, float] = {}  # seconds each form took to load
        self.steps_run = dict.fromkeys(STEP_FORMS, 0)  # steps each form's package has run
        self._runners: dict[str, Callable] = {}
        self.prepare(1)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """What StaticDecoding supports, without int4 weights: compiling PyTorch's int4 product, inductor derives new
        weight tensors from the model's, which a library reading the model's own tensors cannot be given."""
        return StaticDecoding.supports(model) and not _has_int4_weights(model)

    @staticmethod
    def form_for(batch_size: int) -> str:
        """The step form (`STEP_FORMS`) that serves `batch_size` rows."""
        return "one-row" if batch_size == 1 else "rows"

    def prepare(self, batch_size: int) -> Callable:
        """Capture, or load, the step form for `batch_size` rows now rather than at the first such step; returns it."""
        form = self.form_for(batch_size)
        if form not in self._runners:
            path = self.package_paths[form]
            if not kept_package(path):
                log.info("capturing the %s decoding step (a C++ compiler runs: tens of seconds, once; kept in %s)",
                         form, path.parent)
                started = time.perf_counter()
                capture_step(self.model, path, form)
                self.capture_s[form] = time.perf_counter() - started
                log.info("captured in %.0f s", self.capture_s[form])
            started = time.perf_counter()
            self._runners[form] = load_step(path, self.model)
            self.load_s[form] = time.perf_counter() - started
        return self._runners[form]

    def step(self, window: Window, cache: StaticKVCache) -> Tensor:
        cache.advance()
        token = window.ids[:, -1:].contiguous()  # (B, 1)
        (logits,) = self.prepare(token.shape[0])([token, cache.slot, cache.filled, *cache.buffers()])
        self.steps_run[self.form_for(token.shape[0])] += 1
        return logits  # (B, V)


def load_step(path: Path, model: nn.Module) -> Callable[[list[Tensor]], list[Tensor]]:
    """A captured step's package, its weights pointed at `model`'s own tensors (not copied): the step as a function
    of its flat inputs [token, slot, filled, *buffers] -> [logits]. Raises InputError for a package that asks for a
    tensor the model does not have (one captured from another model under the same name)."""
    with _without_torch_deprecations():
        package = torch._inductor.aoti_load_package(str(path), run_single_threaded=True)  # one thread calls it
    named = (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    tensors = {f"model.{name}": tensor for name, tensor in named}  # as StepGraph names them; tied ones under each name
    wanted = package.get_constant_fqns()
    missing = [name for name in wanted if name not in tensors]
    if missing:
        raise InputError(f"{path} was captured from another model (it needs {', '.join(missing[:3])}); delete it and "
                         "load again to capture this one")
    package.load_constants({name: tensors[name].detach() for name in wanted}, check_full_update=True,
                           user_managed=True)
    return package.loader.boxed_run  # the call without the pytree (de)serialisation AOTICompiledModel adds each time


def digest_path(package: Path) -> Path:
    """Where the SHA-256 of a kept package is recorded when it is captured: `step-....pt2.sha256` beside it."""
    return package.with_name(package.name + ".sha256")


def kept_package(path: Path) -> bool:
    """Whether a whole package is kept at `path`: its SHA-256 is the one recorded when it was captured. A package
    that is damaged (truncated, emptied, bytes flipped) or has no digest (a capture cut short) is removed, with a
    warning, so that it is captured again rather than handed to the loader (a zip or dlopen error)."""
    if not path.is_file():
        return False
    record = digest_path(path)
    try:
        recorded = record.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        recorded = None
    if recorded is not None and recorded == digest(path):
        return True
    why = "no digest was recorded for it" if recorded is None else "its SHA-256 differs from the one recorded"
    log.warning("the kept decoding step %s is damaged (%s): capturing it again", path, why)
    path.unlink(missing_ok=True)
    record.unlink(missing_ok=True)
    return False


def _has_int4_weights(model: nn.Module) -> bool:
    return any(isinstance(module, Int4Linear) for module in model.modules())


def row_products(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear for one row as a reduction over each weight row, accumulated in float32 at least: x (..., K),
    weight (N, K) -> (..., N). Inductor compiles it into one vectorized loop that reads each weight once (on an
    AVX-512 EPYC, one thread, the small model's products took 1.7 ms this way against 4.1 ms through F.linear)."""
    accumulate = torch.promote_types(x.dtype, torch.float32)
    out = (x.unsqueeze(-2).to(accumulate) * weight.to(accumulate)).sum(-1)  # (..., N)
    return (out if bias is None else out + bias.to(accumulate)).to(x.dtype)


def row_int8_products(x: Tensor, weight: Tensor, scales: Tensor) -> Tensor:
    """`_weight_int8pack_mm` (int8 weights (N, K), a scale per output) for one row, as `row_products`: the int8
    bytes are what the loop reads, each converted straight to float32 (exactly, as through bf16)."""
    return (row_products(x.float(), weight).float() * scales.float()).to(x.dtype)


STEP_FORMS = {  # form -> (example batch, the batch size is symbolic, products as reductions)
    "one-row": (1, False, True),
    "rows": (EXAMPLE_BATCH, True, False),
}


def capture_step(model: nn.Module, path: Path, form: str = "one-row") -> None:
    """Export `model`'s decoding step in a STEP_FORMS form and compile it with AOTInductor into the package `path`
    (written whole or not at all). Raises InputError without a C++ compiler, or where the step cannot be captured.

    one-row: batch size 1; every product a reduction (`row_products`). rows: any batch size from 2; matrix products.
    The weights stay arguments of the library, not part of it (`load_step` points them at the model's tensors).
    """
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise InputError(f"compile='aot' (--compile aot) builds the decoding step with a C++ compiler and {compiler} "
                         "is not on PATH: install one (Debian: apt-get install g++) or set CXX, or decode without it "
                         "(compile=False: no --compile)")
    example_batch, any_batch, as_reductions = STEP_FORMS[form]
    example = model.allocate_cache(example_batch, EXAMPLE_CACHE_LEN, static=True)
    token = torch.zeros((example_batch, 1), dtype=torch.long, device=example.slot.device)
    batch = torch.export.Dim("batch", min=2) if any_batch else torch.export.Dim.STATIC
    length = torch.export.Dim("cache_len", min=2)
    dynamic = ({0: batch}, None, {0: batch, 1: length}, [{0: batch, 2: length}] * len(example.buffers()))
    decompositions = torch.export.default_decompositions()
    if as_reductions:
        decompositions[torch.ops.aten.linear.default] = row_products
        if CpuCapabilities.detect().int8_loops_vectorized:
            decompositions[torch.ops.aten._weight_int8pack_mm.default] = row_int8_products
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with torch.no_grad(), _without_torch_deprecations():
            program = torch.export.export(StepGraph(model, example), (token, example.slot, example.filled,
                                                                      example.buffers()), dynamic_shapes=dynamic)
            program = program.run_decompositions(decompositions)
        with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
            with torch._inductor.config.patch(**_inductor_settings(as_reductions)), \
                    _without_torch_deprecations():
                written = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(scratch) /
                                                                                                 "step.pt2"))
            os.replace(written, path)  # whole or not at all: a capture cut short leaves no package behind
            atomic_write(digest_path(path), digest(path) + "\n")  # recorded last: a package without it is not kept
    except Exception as err:  # torch's export and compile errors have no common base; each is turned into one line
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"compile='aot' (--compile aot) could not capture {type(model).__name__}'s decoding step "
                         f"({first_line}); use compile=True (torch.compile: bare --compile) or compile=False (no "
                         "--compile)") from err


@contextlib.contextmanager
def _without_torch_deprecations() -> Iterator[None]:
    """Silence a FutureWarning that torch's export raises about its own internals (nothing a user can act on)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        yield


def _inductor_settings(as_reductions: bool) -> dict:
    """Inductor's settings for a capture (private ones: aoti_compile_and_package takes no public switch for them).

    aot_inductor.package_constants_in_so=False: the weights are not copied into the library (`load_step` points it
    at the model's own). realize_opcount_threshold=0: every computed input of a product is stored before the
    product's loop reads it; by default inductor inlines a cheap producer (a LayerNorm, the embeddings) into each
    consumer, and a reduction over a weight's rows is a consumer per output: the small model's one-row step
    recomputed its inputs 384 to 1,536 times and took 3.2 ms a token, against 2.0 ms stored."""
    return {"aot_inductor.package_constants_in_so": False} | (
        {"realize_opcount_threshold": 0} if as_reductions else {})


def package_digest(model: nn.Module) -> str:
    """A digest of what a captured step depends on (see the module docstring): 32 hex digits. The weights' values
    are not part of it: the library reads them from the model, so every checkpoint of one architecture shares it."""
    digest = hashlib.blake2b(digest_size=16)
    cpu = CpuCapabilities.detect()
    threads = str(torch.get_num_threads())  # inductor writes its loops for this many threads (one: no parallel loops)
    sources = _source_digest(model)
    for part in (torch.__version__, cpu.isa, ",".join(sorted(cpu.flags)), threads, _settings(model), sources):
        digest.update(part.encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name} {tuple(tensor.shape)} {tensor.stride()} {tensor.dtype} {tensor.device}".encode())
    return digest.hexdigest()


def _settings(model: nn.Module) -> str:
    """Every module's type and plain settings (sizes, eps, theta, flags...), which the graph holds as constants."""
    plain = (int, float, str, bool, type(None), tuple)
    return "\n".join(f"{name} {type(module).__qualname__} "
                     f"{sorted((k, v) for k, v in vars(module).items() if isinstance(v, plain))}"
                     for name, module in model.named_modules())


PACKAGE = Path(__file__).resolve().parents[1]  # the attnkit package
ABOVE_THE_STEP = ("train", "interop", "viz", "inspect", "experiments", "serve", "cli.py", "__main__.py", "__init__.py")
"""attnkit's parts that no captured step runs: generate's siblings and the layers above it (DESIGN.md), which
generate never imports (tests/test_imports.py), and the package's own __init__ (names re-exported)."""


def step_sources(model: nn.Module) -> list[Path]:
    """The Python files a captured step of `model` can run: attnkit's, less `ABOVE_THE_STEP` (`attnkit_sources`),
    and the file of each of the model's module classes that is not PyTorch's (a head or a swapped-in module of one's
    own, wherever it lives). An edit elsewhere (the server, training, the command line) keeps the kept packages."""
    files = set(attnkit_sources())
    for kind in {type(module) for module in model.modules()}:
        if kind.__module__.split(".")[0] != "torch":
            with contextlib.suppress(TypeError):  # a class without a file (defined at a prompt): its name only
                files.add(Path(inspect.getfile(kind)).resolve())
    return sorted(files)


@functools.cache
def attnkit_sources() -> dict[Path, str]:
    """attnkit's files a captured step can run, each with the BLAKE2b of its bytes, read once a process: the code a
    process runs is the code it imported, so an edit made to the tree since (a file saved beside a running server)
    neither renames the packages it captures nor makes a second start miss them."""
    files = sorted(path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] not in ABOVE_THE_STEP)
    return {path: hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest() for path in files}


def _source_digest(model: nn.Module) -> str:
    """A digest of the source a captured step of `model` can run (`step_sources`): a package captured from other
    code is not used. The model's own classes' files are read each time (a module reloaded after an edit)."""
    kept = attnkit_sources()
    digest = hashlib.blake2b(digest_size=16)
    for source in step_sources(model):  # named within attnkit, so every installation of one version agrees
        digest.update(str(source.relative_to(PACKAGE) if source in kept else source.name).encode())
        digest.update(kept[source].encode() if source in kept else source.read_bytes())
    return digest.hexdigest()
