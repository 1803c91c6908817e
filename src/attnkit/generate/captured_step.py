"""A decoding step captured ahead of time: exported once, compiled into a shared library by AOTInductor, and run
as one call per token.

torch.compile (`static_decode.py`) keeps Python in every step: the compiled graph is entered through Python, with
guards checked first. A captured step leaves none of that:

    torch.export      `static_step` as a function of (token, slot, filled, cache buffers) -> logits: one graph,
                      with the batch size and the cache length left symbolic, so one capture serves them all
    AOTInductor       that graph -> C++ and a shared library in a package (.pt2), weights frozen into it and packed
                      for the CPU's matrix kernels, norms, activations and residual additions fused
    each step         one call into the library: no Python per layer, no guards, no graph lookup

Capture takes tens of seconds (a C++ compiler runs), so the package is kept on disk and a second start loads it
in a fraction of a second. Its name is a digest of everything the library depends on: the model's structure and
weights, attnkit's source, PyTorch's version and the CPU's capabilities; anything else gets a package of its own.
They are kept under `default_package_dir()` (`$ATTNKIT_COMPILED`, else `machine.cache_home()`/compiled); deleting
that folder only costs the next start its capture.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

import attnkit
from attnkit.errors import InputError
from attnkit.generate.decoder import Window
from attnkit.generate.static_decode import StaticDecoding, static_step
from attnkit.layers.kv_cache import StaticKVCache
from attnkit.machine import CpuCapabilities, cache_home

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
    inference (`plan.py`); its weights are frozen into the package, so a model whose weights change needs a new
    CapturedDecoding. Captures, or loads the kept package, when built.

    package_dir: where packages are kept (default `default_package_dir()`).
    """

    def __init__(self, model: nn.Module, *, package_dir: str | Path | None = None) -> None:
        super().__init__(model, compile=False)  # the eager static step: what is captured, and the tests' reference
        folder = Path(package_dir) if package_dir is not None else default_package_dir()
        self.package_path = folder / f"step-{package_digest(model)}.pt2"
        self.capture_s: float | None = None  # seconds spent capturing; None: the package was on disk
        if not self.package_path.is_file():
            started = time.perf_counter()
            capture_step(model, self.package_path)
            self.capture_s = time.perf_counter() - started
        started = time.perf_counter()
        self._runner = torch._inductor.aoti_load_package(str(self.package_path))
        self.load_s = time.perf_counter() - started

    def step(self, window: Window, cache: StaticKVCache) -> Tensor:
        cache.advance()
        token = window.ids[:, -1:].contiguous()  # (B, 1)
        return self._runner(token, cache.slot, cache.filled, cache.buffers())  # (B, V)


def capture_step(model: nn.Module, path: Path) -> None:
    """Export `model`'s decoding step and compile it with AOTInductor into the package `path` (written whole or
    not at all). Raises InputError without a C++ compiler, or where the step cannot be captured."""
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise InputError(f"compile='aot' builds the decoding step with a C++ compiler and {compiler} is not on PATH: "
                         "install one (Debian: apt-get install g++) or set CXX, or decode without it (compile=False)")
    example = model.allocate_cache(EXAMPLE_BATCH, EXAMPLE_CACHE_LEN, static=True)
    token = torch.zeros((EXAMPLE_BATCH, 1), dtype=torch.long, device=example.slot.device)
    batch, length = torch.export.Dim("batch", min=1), torch.export.Dim("cache_len", min=2)
    buffer_axes = {0: batch, 2: length}
    dynamic = ({0: batch}, None, {0: batch, 1: length}, [buffer_axes] * len(example.buffers()))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)  # torch's own, internal
            program = torch.export.export(StepGraph(model, example), (token, example.slot, example.filled,
                                                                      example.buffers()), dynamic_shapes=dynamic)
        with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
            # freezing: weights become constants of the graph, which lets inductor pack them for its matrix kernels;
            # a private setting, as in static_decode.py: aoti_compile_and_package takes no public switch for it
            with torch._inductor.config.patch(freezing=True):
                written = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(scratch) /
                                                                                                 "step.pt2"))
            os.replace(written, path)  # whole or not at all: a capture cut short leaves no package behind
    except Exception as err:  # torch's export and compile errors have no common base; each is turned into one line
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"compile='aot' could not capture {type(model).__name__}'s decoding step ({first_line}); "
                         "use compile=True (torch.compile) or compile=False") from err


def package_digest(model: nn.Module) -> str:
    """A digest of what a captured step depends on (see the module docstring): 32 hex digits."""
    digest = hashlib.blake2b(digest_size=16)
    cpu = CpuCapabilities.detect()
    for part in (torch.__version__, cpu.isa, ",".join(sorted(cpu.flags)), repr(model), _source_digest()):
        digest.update(part.encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _source_digest() -> str:
    """A digest of attnkit's Python source: a package captured from other code is not used."""
    digest = hashlib.blake2b(digest_size=16)
    root = Path(attnkit.__file__).parent
    for source in sorted(root.rglob("*.py")):
        digest.update(str(source.relative_to(root)).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()
