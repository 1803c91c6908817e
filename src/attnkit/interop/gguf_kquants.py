"""llama.cpp's K-quants (Q4_K_M, Q6_K, ...) of a GGUF file, made by llama.cpp's own quantizer (`llama-quantize`'s
`llama_model_quantize`, through llama-cpp-python), in a child process.

    KQUANT_TYPES                        --type, as llama-quantize spells it -> llama.cpp's file type (llama_cpp name)
    check_quantizer(type)               ConfigError naming the extra where llama-cpp-python is not installed
    quantize_gguf(source, out, type)    an f16 GGUF file -> `out` at `type`; each tensor logged as it is written

K-quants store 256-value super-blocks of 8 or 16 scaled sub-blocks (llama.cpp PR #1684); the `_S`/`_M`/`_L` mixes
give some tensors (attn_v, ffn_down, the output layer) more bits. A weight whose rows are no whole number of 256
values is stored at llama.cpp's per-tensor fallback, a 32-value block type (llama-cpp-python 0.3.36: q2_K and q3_K
-> q4_0, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, iq4_xs -> iq4_nl; f16 where 32 does not divide the row either);
one line says which. Only the types llama.cpp makes
without an importance matrix are offered (its IQ1/IQ2 and Q2_K_S refuse to run without one).

The quantizer runs in its own process: a crash inside llama.cpp (an abort, a segmentation fault) ends that process,
and attnkit reports it, where in-process it would end attnkit's without a word. The child imports llama_cpp alone
(no torch), so it starts in a moment. On Linux it also ends with attnkit's process, even one killed outright
(SIGKILL), by the kernel's PR_SET_PDEATHSIG; elsewhere such a kill leaves it to finish or fail on its own.
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from attnkit.errors import AttnkitError, ConfigError

log = logging.getLogger(__name__)

# --type -> llama_cpp's LLAMA_FTYPE_* constant: the mixes llama-quantize makes without an importance matrix
KQUANT_TYPES: dict[str, str] = {
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "Q3_K_S": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    "Q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "Q3_K_L": "LLAMA_FTYPE_MOSTLY_Q3_K_L",
    "Q4_K_S": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "Q5_K_S": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
}
SUPER_BLOCK = 256  # values in a K-quant super-block (QK_K)

# The child's first lines: on Linux the kernel sends it SIGKILL when the thread that started it ends (prctl's
# PR_SET_PDEATHSIG, 1), so a quantizer never outlives attnkit killed outright; a parent gone before the prctl call
# shows as another parent id. The parent's id is argv[1], taken off before the child's own arguments.
_DIES_WITH_PARENT = """
import ctypes, os, signal, sys
parent = int(sys.argv.pop(1))
if sys.platform == "linux":
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != parent:
    sys.exit("attnkit ended before its quantizer started")
"""
# The child: llama.cpp's quantizer alone. Importing llama_cpp points llama.cpp's log at stderr, where each tensor is
# reported as it is written; the exit status is llama_model_quantize's (0: written).
_CHILD = _DIES_WITH_PARENT + """
import sys, llama_cpp
source, out, ftype = sys.argv[1:]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, ftype)
sys.exit(llama_cpp.llama_model_quantize(source.encode(), out.encode(), params))
"""
# "[   3/  20]  blk.0.attn_k.weight  - [64, 64, 1, 1], type = f16, converting to q5_0 .. size = ..."
_TENSOR_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+- .*?type =\s*(\S+?),(?: converting to (\S+))?")
# "warning: blk.0.attn_k.weight - ncols 64 not divisible by 256 (required for type q4_K) -> falling back to q5_0"
_FALLBACK_LINE = re.compile(r"warning: (\S+)\s+- ncols\s+(\d+) not divisible by\s+(\d+) \(required for type\s+(\S+)\)"
                            r" -> falling back to\s+(\S+)")


class QuantizerError(AttnkitError, RuntimeError):
    """llama.cpp's quantizer failed or crashed; nothing was written."""


def check_quantizer(type: str) -> None:
    """ConfigError, in one line, where llama-cpp-python (llama.cpp's quantizer) is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(f"--type {type} is made by llama.cpp's quantizer, which comes with llama-cpp-python: pip "
                          f"install 'attnkit[kquants]' (it builds llama.cpp); or export --type f16 and run llama.cpp's "
                          f"llama-quantize model-f16.gguf model-{type}.gguf {type}")


def quantize_gguf(source: Path, out: Path, type: str) -> None:
    """Write the GGUF file `source` (f16 or f32) to `out` at llama.cpp's `type` (a KQUANT_TYPES name), logging each
    tensor as llama.cpp writes it and, in one line, those kept at a fallback type. The child is ended with the call
    (Ctrl-C included). Raises QuantizerError, with llama.cpp's last lines, when it fails or crashes."""
    command = [sys.executable, "-c", _CHILD, str(os.getpid()), str(source), str(out), KQUANT_TYPES[type]]
    last = collections.deque(maxlen=8)  # llama.cpp's last lines: what it said before it failed
    fallbacks: list[tuple[str, str]] = []  # (tensor, the type it got)
    tensor = None
    log.info("llama.cpp's quantizer (llama-cpp-python, in a child process) makes %s from the f16 file:", type)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, errors="replace")
    try:
        for line in child.stderr:
            line = line.rstrip()
            last.append(line)
            if match := _FALLBACK_LINE.match(line):
                fallbacks.append((match[1], match[5]))
            elif match := _TENSOR_LINE.match(line):
                tensor = match[3]
                stored = match[5] or f"{match[4]} (kept)"
                log.info("quantizing [%s/%s] %s: %s", match[1], match[2], tensor, stored)
        status = child.wait()
    finally:
        if child.poll() is None:  # the call ended before the child did (Ctrl-C, an error reading its log)
            child.kill()
            child.wait()
        child.stderr.close()
    if status:
        raise QuantizerError(_failure(status, type, tensor, list(last)))
    if fallbacks:
        named = ", ".join(f"{name} {stored}" for name, stored in fallbacks[:3]) + ", ..." * (len(fallbacks) > 3)
        log.warning("%d tensors have rows that are no whole number of %s's %d-value super-blocks; llama.cpp stored "
                    "them at its fallback type (%s)", len(fallbacks), type, SUPER_BLOCK, named)


def _failure(status: int, type: str, tensor: str | None, last: list[str]) -> str:
    """One message for a quantizer that stopped with `status` (negative: the signal that ended it)."""
    where = f" at {tensor}" if tensor else ""
    said = " | ".join(line for line in last if line.strip())[-600:]
    if status < 0:
        how = f"crashed ({signal.strsignal(-status) or f'signal {-status}'}){where}"
    else:
        how = f"failed (exit status {status}){where}"
    return (f"llama.cpp's quantizer {how} making {type}; nothing was written. It said: {said or '(nothing)'}. "
            f"Export --type f16 and run llama.cpp's llama-quantize on it to see its full report")
