#!/usr/bin/env bash
# Every GPU check of issue 48 in one run, on one GPU (an H100/H200-class, ~140 GiB): docs/gpu.md.
#
#     OUT=/some/folder bash bench/gpu_check.sh            (from the project's folder; python3 with CuPy, torch and
#                                                          transformers; nothing is installed or downloaded)
#     OUT=/tmp/q bash bench/gpu_check.sh --quick          the same plumbing on tiny shapes, anywhere (no GPU: the
#                                                          fake device, torch's CPU), to check the script itself
#
# Writes two files into $OUT: gpu_figures.jsonl, every figure as a JSON line, written as it comes (the exactness
# tests of tests/test_gpu.py, then bench/bench_gpu.py's sections), and gpu_check.log, each section's command,
# time, exit status and stderr. Each section runs in a process of its own under its own time limit, cut to
# what is left of the whole budget ($BUDGET seconds, 400 unless set: under 7 minutes), so a failure or a
# slow section loses nothing else; the most wanted run first. TF32: CUPY_TF32 is set per process.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
FIGURES=$OUT/gpu_figures.jsonl
LOG=$OUT/gpu_check.log
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-400}
QUICK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
: > "$FIGURES"
: > "$LOG"
START=$SECONDS

section() {  # section LIMIT TF32 COMMAND...: run it if time is left, under min(LIMIT, what is left)
    local limit=$1 tf32=$2
    shift 2
    local name
    name=$(printf '%s' "$*" | head -c 120 | tr -d '"\\\n')  # the command, as a JSON string can hold it
    local left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt 15 ]; then
        echo "{\"section\": \"skipped\", \"command\": \"$name\", \"why\": \"the budget of ${BUDGET}s is spent\"}" >> "$FIGURES"
        echo "== skipped (budget spent): $*" >> "$LOG"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $* (CUPY_TF32=$tf32, limit ${limit}s, at $((SECONDS - START))s)" >> "$LOG"
    local t0=$SECONDS
    CUPY_TF32=$tf32 timeout -k 5 "$limit" "$@" >> "$FIGURES" 2>> "$LOG"
    local status=$?
    echo "== exit $status after $((SECONDS - t0))s" >> "$LOG"
    if [ "$status" -ne 0 ]; then
        echo "{\"section\": \"failed\", \"command\": \"$name\", \"exit\": $status, \"seconds\": $((SECONDS - t0))}" >> "$FIGURES"
    fi
}

B="$PY bench/bench_gpu.py"
section 30 0 $B env $QUICK
if [ -n "$QUICK" ]; then  # the exactness tests' code on the fake device (tests/test_gpu.py's own skip needs a GPU)
    section 60 0 $PY -c "import sys; sys.path[:0] = ['tests', '.']; import fake_device as f, test_gpu as t
f.fuse = f.identity_fuse; t.gpu = lambda: f; real = t.device.backend
t.device.backend = lambda name='cpu': f if t.device.chosen(name) == 'gpu' else real(name)
t.HP = {'n_vocab': 300, 'n_ctx': 256, 'n_embd': 32, 'n_head': 4, 'n_layer': 2}
for test in t.TESTS:
    t.WORST.clear(); test(); print('{\"section\": \"exactness\", \"quick\": true, \"test\": \"%s\", \"passed\": true}' % test.__name__)"
else
    section 110 0 $PY tests/test_gpu.py
fi
section 75 0 $B step 124M --batch 16 --context 1024 --steps 5 --parts --twins-off $QUICK
section 50 0 $B torch-step 124M --batch 16 --context 1024 --steps 5 $QUICK
section 45 1 $B step 124M --batch 16 --context 1024 --steps 5 $QUICK
section 40 1 $B torch-step 124M --batch 16 --context 1024 --tf32 --steps 5 $QUICK
section 50 0 $B decode 124M --tokens 64 $QUICK
section 60 0 $B decode 1558M --tokens 32 $QUICK
section 50 0 $B step 1558M --lora 8 --batch 4 --context 1024 --steps 3 $QUICK
section 45 0 $B torch-step 1558M --lora 8 --batch 4 --context 1024 --steps 3 $QUICK
section 60 0 $B step 1558M --batch 2 --context 1024 --steps 3 $QUICK
section 50 0 $B torch-step 1558M --batch 2 --context 1024 --steps 3 $QUICK
section 60 0 $B scratch --steps 30 $QUICK
echo "== done in $((SECONDS - START))s" >> "$LOG"
