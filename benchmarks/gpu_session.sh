#!/usr/bin/env bash
# The GPU checks, for a GPU machine lent by the minute (an H100 or H200): what the CPU cannot measure, in the order
# issue 46 gives them, each stage's results published before the next stage starts, so a run cut short keeps what it
# finished.
#
#   bash benchmarks/gpu_wheels.sh                          # here first: what the GPU image lacks, in .whl/
#   BUDGET_S=560 bash benchmarks/gpu_session.sh [PART ...] # on the GPU machine, from the checkout's root
#   bash benchmarks/gpu_session.sh --smoke                 # here: every stage tiny on the CPU, the same files
#                                                          # (BUDGET_S 1800 unless given: compiles take minutes here)
#   python -m benchmarks.gpu_results DIR --commit          # here, after: DIR ($OUT) into benchmarks/results, docs
#
# PART, in this order (none named: all):
#   tests        pytest -m gpu -x --tb=short over every module holding a CUDA test         -> pytest-gpu.txt
#   train serve decode variants                                                             -> gpu-<device>.json .md
#                python -m benchmarks gpu --only PART --append: one process a part, one report gathering them
#   experiments  attnkit experiment rnn-vs-transformer-cost, then transformer-plus-plus, --device cuda --budget gpu
#                                                                                           -> NAME.tgz (its results)
# Each stage runs under `timeout` at the smaller of its cap and what is left of BUDGET_S (default 560 s: one command of
# the device tool, 600 s at most, less Python's start and the copies); a stage whose minimum no longer fits is not
# started, and session.txt says so (variants writes its report after each variant, so its minimum is SDPA-causal's
# and one variant's rows). Caps and minimums in seconds, from the H200 run of gpu-nvidia-h200.md (train: three
# compiles of about 30 s; decode: eight rows with first calls of 6-15 s; train, serve and decode 251 s together):
STAGES="tests:150:60 train:150:110 serve:90:45 decode:150:100 variants:330:130 rnn-vs-transformer-cost:150:40
        transformer-plus-plus:600:240"
# Everything is written under runs/gpu-session/ (or $GPU_SESSION_DIR), which git ignores and a machine still warm keeps
# for the next command (transformer-plus-plus resumes from the arms it finished), and after each stage copied into $OUT,
# the folder the device tool brings back, which takes at most 8 files: session.txt, pytest-gpu.txt, gpu-<device>.json
# and .md, bench-log.txt, and a .tgz of each experiment's results.json, table.md, plots and log. A GPU image with its
# own python3 (torch and transformers installed, no network) runs as it is: attnkit is read from src/, the wheels of
# .whl/ are installed beside it; a checkout with .venv uses that.
set -u
smoke=0
if [ "${1:-}" = --smoke ]; then smoke=1; shift; fi
parts=${*:-tests train serve decode variants experiments}
for part in $parts; do
    case $part in tests|train|serve|decode|variants|experiments) ;;
    *) echo "unknown part $part: tests, train, serve, decode, variants or experiments"; exit 2 ;; esac
done
budget=${BUDGET_S:-$([ $smoke = 1 ] && echo 1800 || echo 560)}  # --smoke: the CPU's compiles, not a GPU command's
work=${GPU_SESSION_DIR:-runs/gpu-session$([ $smoke = 1 ] && echo -smoke)}
out=${OUT:-$work}
mkdir -p "$work/bench" "$out" && out=$(cd "$out" && pwd) \
    || { echo "cannot write into $work or $out: run it from the checkout's root, with OUT a folder it may write"; exit 2; }
if [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=python3
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || { echo "installing .whl/ failed (pip says why above): make it again with"\
                              "bash benchmarks/gpu_wheels.sh on the CPU machine and carry it"; exit 1; }
    fi
    export PYTHONPATH="$PWD/src:$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
if [ $smoke = 1 ]; then
    bench=(--smoke --rounds 1 --steps 1 --warmup 1); experiment=(--device cpu --budget tiny)
else
    bench=(); experiment=(--device cuda --budget gpu)
fi
note() { echo "$*" | tee -a "$work/session.txt"; }

publish() {  # the results so far, into $OUT: 7 files at most
    [ "$out" = "$(cd "$work" && pwd)" ] && return
    cp -f "$work/session.txt" "$out/" 2>/dev/null
    cp -f "$work/pytest-gpu.txt" "$out/" 2>/dev/null
    cp -f "$work"/bench/gpu-*.json "$work"/bench/gpu-*.md "$out/" 2>/dev/null
    cp -f "$work/bench/log.txt" "$out/bench-log.txt" 2>/dev/null
    for name in rnn-vs-transformer-cost transformer-plus-plus; do
        [ -f "$work/$name.txt" ] || continue
        (cd "$work" && tar -czf "$out/$name.tgz" --exclude="$name/arms" "$name.txt" \
            $( [ -f "$name/results.json" ] && echo "$name" ))
    done
}

stage() {  # stage NAME LOG COMMAND...: run it under the time left, its output added to LOG; note how it ended; publish
    local name=$1 log=$2 cap min left limit began code
    shift 2
    read -r cap min <<< "$(echo $STAGES | tr ' ' '\n' | grep "^$name:" | cut -d: -f2,3 | tr : ' ')"
    left=$((budget - SECONDS))
    [ $smoke = 1 ] && cap=$left min=1  # a CPU compiles for minutes what a GPU machine compiles in seconds (1: timeout 0
                                       # would mean no limit)
    if [ "$left" -lt "$min" ]; then
        note "$name: not started, $left s left of $budget and it needs $min s"
        return
    fi
    limit=$((cap < left ? cap : left))
    began=$SECONDS
    timeout -s INT -k 20 "$limit" "$@" >> "$log" 2>&1  # INT: pytest and Python say where they were, then stop
    code=$?
    note "$name: exit $code after $((SECONDS - began)) s of its $limit s$(case $code in 124) echo ', cut at its limit';;
        137) echo ', cut at its limit and killed 20 s later';; esac)"
    publish
}

note "== gpu_session $(date -u +%FT%TZ) parts: $parts; budget $budget s$([ $smoke = 1 ] && echo '; --smoke')"
# the checkout's commit: GPU_SESSION_COMMIT where the machine gets the files without .git (the device tool's copy)
commit=${GPU_SESSION_COMMIT:-}
if [ -z "$commit" ] && commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit="$commit + changes"
fi
note "commit ${commit:-unknown (no .git here: give GPU_SESSION_COMMIT)}"
[ $py = python3 ] && [ ! -d .whl ] && note "no .whl/ here (make it with gpu_wheels.sh and carry it): without FastAPI,
  uvicorn, seqeval and Liger Kernel the serve part and the tests that need them fail or are skipped"
# the GPU's name on a line of its own: python -m benchmarks.gpu_results names the files after it
$py -c "import torch; print('gpu:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')
import attnkit; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'attnkit', attnkit.__file__)" 2>&1 \
    | tee -a "$work/session.txt"
for part in $parts; do
    case $part in
    tests)  # the CUDA tests, first failure with its details (FlexAttention's gradients, the bf16 run loaded on the CPU)
        rm -f "$work/pytest-gpu.txt"
        stage tests "$work/pytest-gpu.txt" $py -m pytest -m gpu -x --tb=short -v -rs --durations=10 -n 0 \
            -p no:cacheprovider tests/test_devices.py tests/test_flex_attention.py tests/test_output_loss.py \
            tests/test_experiments.py
        tail -3 "$work/pytest-gpu.txt" ;;
    train|serve|decode|variants)  # one part of the GPU benchmark, its rows added to the one report
        echo "== python -m benchmarks gpu --only $part" >> "$work/bench/log.txt"
        stage "$part" "$work/bench/log.txt" $py -m benchmarks gpu --only "$part" --append --out "$work/bench" \
            "${bench[@]}" ;;
    experiments)  # the lectures' GPU claims at the sizes a GPU makes cheap
        for name in rnn-vs-transformer-cost transformer-plus-plus; do
            rm -f "$work/$name.txt"
            stage "$name" "$work/$name.txt" $py -m attnkit experiment "$name" "${experiment[@]}" --no-progress \
                --out "$work/$name"
        done ;;
    esac
done
note "done after $SECONDS s"
publish
