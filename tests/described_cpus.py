"""CPUs described, not detected, for tests of the choices made from what a CPU reports (`attnkit.machine`): each
with the flags PyTorch reports for such a CPU, so that every branch is checked on any machine."""

from attnkit.machine import CpuCapabilities

AVX2 = CpuCapabilities(isa="AVX2", flags=frozenset({"avx2", "fma3"}), name="AVX2-only CPU")
AVX512 = CpuCapabilities(isa="AVX512", flags=AVX2.flags | {"avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"})
AVX512_BF16 = CpuCapabilities(isa="AVX512", flags=AVX512.flags | {"avx512_bf16", "avx512_vnni"})
NE_CONVERT = CpuCapabilities(isa="AVX2", flags=AVX2.flags | {"avx_ne_convert", "avx_vnni"})
BASELINE = CpuCapabilities(isa="DEFAULT", name="x86-64 without AVX2")  # also what ATen reports on many ARM CPUs
