#!/usr/bin/env bash
# One GPU session (an H100 or H200, about 15 minutes): what the CPU cannot measure, in the order of its value, each
# result written to a file under runs/gpu-session/ (and the benchmark's and experiments' own results files), so that
# a session cut short keeps what it finished.
#
#   bash benchmarks/gpu_session.sh            # from the repository root, with .venv built
set -u
out=runs/gpu-session
mkdir -p "$out"
py=.venv/bin/python
# 1. the CUDA tests, first failure with its details (FlexAttention's gradients, the bf16 run loaded on the CPU, ...)
$py -m pytest -m gpu -x --tb=short -n 0 -p no:cacheprovider > "$out/pytest-gpu.txt" 2>&1
echo "pytest -m gpu: exit $? ($out/pytest-gpu.txt)"
# 2. training against the faithful nanoGPT peer, the attention variants, decoding and serving
$py -m benchmarks gpu --only train variants decode serve > "$out/benchmarks-gpu.txt" 2>&1
echo "python -m benchmarks gpu: exit $? (benchmarks/results/gpu-*.md, $out/benchmarks-gpu.txt)"
# 3. the lectures' GPU claims at the sizes a GPU makes cheap
for name in rnn-vs-transformer-cost transformer-plus-plus; do
    .venv/bin/attnkit experiment "$name" --device cuda --budget gpu --no-progress > "$out/$name.txt" 2>&1
    echo "attnkit experiment $name: exit $? (runs/experiments/$name, $out/$name.txt)"
done
