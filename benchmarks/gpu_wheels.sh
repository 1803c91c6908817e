#!/usr/bin/env bash
# The Python packages attnkit needs that a GPU machine's image may lack, as wheels in .whl/ (ignored by git), for an
# image with Python 3.12 on x86-64, at the versions this checkout's .venv runs. PyTorch's GPU images hold torch,
# transformers, tokenizers, safetensors, numpy, matplotlib, sacrebleu, httpx, pytest and hypothesis, but not the
# server's packages (fastapi, starlette, pydantic, uvicorn; FastAPI imports opentelemetry-api whenever it is imported,
# and pydantic needs a typing-extensions newer than the image may hold), the tagging task's (seqeval, conllu) nor
# Liger Kernel (the gpu extra's fused loss). Where such a machine fetches nothing, the wheels go along with the
# checkout and benchmarks/gpu_session.sh installs them.
#
#   bash benchmarks/gpu_wheels.sh            # from the repository root, with .venv built (make test)
set -euo pipefail
py=.venv/bin/python
packages="fastapi starlette pydantic pydantic-core annotated-types typing-inspection typing-extensions opentelemetry-api
          uvicorn conllu seqeval"
pins=$($py - $packages <<'EOF'
import sys
from importlib.metadata import version

print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
EOF
)
# the gpu extra's kernels (pyproject.toml), which this CPU venv does not hold, at the release that was newest when
# this line was written: pure Python over the image's Triton, for the plan's fused loss and its CUDA test
pins="$pins liger-kernel==0.8.5"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
for pin in $pins; do
    # a wheel for CPython 3.12 on manylinux x86-64; seqeval publishes only its source, built here (pure Python)
    $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$pin" 2>/dev/null || $py -m pip wheel -q --no-deps -w .whl "$pin"
done
ls .whl
du -sh .whl
