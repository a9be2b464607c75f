#!/bin/bash
# Issue 53, Deliver 6: issue 40's prepared GPU pieces (docs/gpu.md) on the tree before the run
# level moved into the engine (bb85dab: the *_stacked.py modules) and on this one, in ONE device
# call, each tree's pieces with their own deadline; the λ sweep's `speedup` and `vs_plain` rows
# (sequential batch over lockstep, target >= 10) decide whether the GPU's `auto` batches in
# lockstep.
#
# Here, once (after `make data`):
#   bash ../shared/gpu/prepare.sh
#   mkdir -p .gpu/old && git archive bb85dab src benchmarks | tar -x -C .gpu/old
# On the device (the `run` tool, carry [".gpu"], timeout 600):
#   . .gpu/env.sh && bash benchmarks/gpu_issue53.sh "$OUT"
# Then commit "$OUT"/{old,new}.log and the kept tables under docs/results/gpu-issue53/.
#
# On the CPU, as a check of the script itself:  SMOKE=1 DEVICE=cpu bash benchmarks/gpu_issue53.sh DIR
set -u
OUT=${1:?usage: bash benchmarks/gpu_issue53.sh OUT}
PIECES=${PIECES:-"sweep-lam sweep-graphs run-graphs"}
DEADLINE=${DEADLINE:-250}  # seconds per tree (the two trees and the start within one 600 s call)
DEVICE=${DEVICE:-cuda}
ROOT=$(pwd)
mkdir -p "$OUT"
[ -d "$ROOT/.gpu/old/src/fedhp" ] || { echo "no .gpu/old: see the set-up lines above" >&2; exit 2; }
# the bundle's site and the MNIST stand-in from env.sh, without this tree's src
BASE_PATH=$(printf '%s' "${PYTHONPATH:-}" | tr ':' '\n' | grep -vx "$ROOT/src" | paste -sd: -)
rc=0
for tree in old new; do
    dir=$ROOT; [ "$tree" = old ] && dir=$ROOT/.gpu/old
    smoke=(); [ -n "${SMOKE:-}" ] && smoke=(--smoke)
    # shellcheck disable=SC2086
    (cd "$dir" && PYTHONPATH="$dir/src${BASE_PATH:+:$BASE_PATH}" python3 benchmarks/gpu_check.py \
        --device "$DEVICE" --only $PIECES --deadline "$DEADLINE" --keep "$OUT/$tree" \
        "${smoke[@]}") > "$OUT/$tree.log" 2>&1 || rc=1
    echo "== $tree ($dir)"
    grep -A40 '^# gpu_check:' "$OUT/$tree.log"
done
exit $rc
