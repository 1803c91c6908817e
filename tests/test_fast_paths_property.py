"""Every fast linear and attention path equals its reference on drawn shapes (odd and prime widths, 1 to 17 rows, 1 to
64 for the native quantized layers traced as a captured step traces them, inputs at offsets), under this CPU's own
kernels and under its AVX2 kernels. The paths run in a subprocess
(`fast_paths.py`), so a kernel that crashes fails the test and names the case instead of ending the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fast_paths import AVX2_ENV

WORKER = Path(__file__).with_name("fast_paths.py")
NATIVE = torch.backends.cpu.get_cpu_capability()
CAPABILITIES = {"native": {}, "avx2": AVX2_ENV}


def run_paths(capability: str, examples: int, timeout: float, scratch: Path) -> subprocess.CompletedProcess:
    """The worker's run of every path under `capability`'s kernels, one torch thread, with inductor's caches of its
    own under `scratch` (torch's FX graph cache does not key on the vector level: a graph compiled for AVX-512 would
    be served to the AVX2 run)."""
    if capability == "avx2" and not NATIVE.startswith("AVX512"):
        pytest.skip(f"this CPU's own kernels are {NATIVE}'s: the native run is the AVX2 run, or there is none")
    env = {**os.environ, **CAPABILITIES[capability], "OMP_NUM_THREADS": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{capability}")}
    return subprocess.run([sys.executable, str(WORKER), "--examples", str(examples)], env=env, capture_output=True,
                          text=True, timeout=timeout)


def failure(result: subprocess.CompletedProcess) -> str:
    """What went wrong, for the assertion: the signal and the case it ended in, or the worker's own report."""
    lines = (result.stdout + result.stderr).splitlines()
    if result.returncode < 0:
        cases = [line for line in lines if line.startswith("case ")]
        last = cases[-1] if cases else "before the first case"
        return f"the worker died of {signal.Signals(-result.returncode).name} in {last}"
    return "\n".join(line for line in lines if not line.startswith("case "))[-4000:]


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_every_fast_path_equals_its_reference_on_drawn_shapes(capability, tmp_path):
    """A few drawn cases per path besides the pinned ones (int8's crash: in-width 172, two rows, AVX2)."""
    result = run_paths(capability, examples=3, timeout=240, scratch=tmp_path)
    assert result.returncode == 0, failure(result)
    assert "held int8\n" in result.stdout and "held SDPA\n" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_every_fast_path_equals_its_reference_on_many_drawn_shapes(capability, tmp_path):
    result = run_paths(capability, examples=100, timeout=1800, scratch=tmp_path)
    assert result.returncode == 0, failure(result)
