#!/usr/bin/env bash
# The GPU checks, for a GPU machine rented by the minute (an H100 or H200): what the CPU cannot measure, in the order
# of its value, each result written under $OUT (a folder copied back afterwards) or, where $OUT is unset,
# runs/gpu-session/, so that a run cut short keeps what it finished.
#
#   bash benchmarks/gpu_wheels.sh                  # on this machine first: what the GPU machine's image lacks, in .whl/
#   bash benchmarks/gpu_session.sh [PART ...]      # on the GPU machine, from the checkout's root, .whl/ copied along
#
# PART: tests (`pytest -m gpu -x --tb=short`); train, serve, decode, variants (`python -m benchmarks gpu --only PART`:
# training against the faithful nanoGPT peer, serving at 1, 8 and 32 clients, decoding against transformers, the
# attention variants; each writes its own report under $OUT/PART/); experiments (the lectures' two GPU claims). None
# named: all, in that order. The H200 run of benchmarks/results/gpu-nvidia-h200.md took 251 s for train, serve and
# decode together; variants compiles ten training steps where train compiles three, so where each command is held to
# a few minutes it runs alone. A GPU image with its own python3 (torch, transformers and the rest installed, no
# network) runs as it is: attnkit is read from src/, and the wheels of .whl/ are installed beside it; a checkout with
# .venv uses that.
set -u
parts=${*:-tests train serve decode variants experiments}
for part in $parts; do
    case $part in tests|train|serve|decode|variants|experiments) ;;
    *) echo "unknown part $part: tests, train, serve, decode, variants or experiments"; exit 2 ;; esac
done
out=${OUT:-runs/gpu-session}
mkdir -p "$out"
if [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=python3
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || { echo "installing .whl/ failed"; exit 1; }
    fi
    export PYTHONPATH="$PWD/src:$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
$py -c "import torch, attnkit; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'attnkit', attnkit.__file__)"
for part in $parts; do
    case $part in
    tests)  # the CUDA tests, first failure with its details (FlexAttention's gradients, the bf16 run loaded on the CPU)
        $py -m pytest -m gpu -x --tb=short -n 0 -p no:cacheprovider tests/test_devices.py tests/test_flex_attention.py \
            tests/test_output_loss.py tests/test_experiments.py > "$out/pytest-gpu.txt" 2>&1
        echo "pytest -m gpu: exit $? ($out/pytest-gpu.txt)"; tail -3 "$out/pytest-gpu.txt" ;;
    train|serve|decode|variants)  # a part of the GPU benchmark, its report (gpu-<device>.md and .json) in a folder
        mkdir -p "$out/$part"
        $py -m benchmarks gpu --only "$part" --out "$out/$part" > "$out/$part/log.txt" 2>&1
        echo "python -m benchmarks gpu --only $part: exit $? ($out/$part/)" ;;
    experiments)  # the lectures' GPU claims at the sizes a GPU makes cheap
        for name in rnn-vs-transformer-cost transformer-plus-plus; do
            $py -m attnkit experiment "$name" --device cuda --budget gpu --no-progress --out "$out/$name" \
                > "$out/$name.txt" 2>&1
            echo "attnkit experiment $name: exit $? ($out/$name, $out/$name.txt)"
        done ;;
    esac
done
