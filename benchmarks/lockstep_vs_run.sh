#!/bin/bash
# Issue 53's must-show: a lockstep sweep of each method that stacks its rounds (the docs' FedAvgM
# plugin included) against `fedhp run` alone, metrics.csv byte for byte, and the batch line of
# sweep.log ("... N rounds stacked").
# Usage: bash benchmarks/lockstep_vs_run.sh [WORKDIR]   (from the repository root, after make data)
set -u
ROOT=$(pwd)
F=${FEDHP:-$ROOT/.venv/bin/fedhp}
W=${1:-$(mktemp -d)}
mkdir -p "$W" && cd "$W" || exit 2
awk '/<!-- file: fedavgm.py -->/{f=1;next} f&&/^```python/{g=1;next} g&&/^```/{exit} g{print}' \
    "$ROOT/docs/extending.md" > fedavgm.py
BASE="rounds=3 eval_every=1 threads=1 progress=false federation.num_clients=8 federation.num_edges=2"
check() {  # name, plugin arguments, grid key, values, base overrides
    name=$1; plug=$2; key=$3; vals=$4; extra=$5
    rm -rf "sw-$name" "al-$name"
    # shellcheck disable=SC2086
    $F sweep $plug --batching lockstep --grid "$key=$vals" --seeds 0,1 --out "sw-$name" $BASE $extra \
        > "sw-$name.log" 2>&1
    echo "$name: $(grep -h 'in lockstep' "sw-$name/sweep.log" | cut -d' ' -f3-)"
    n=0; same=0
    for v in ${vals//,/ }; do for s in 0 1; do
        # shellcheck disable=SC2086
        $F run $plug --out "al-$name/$v-$s" $BASE $extra "$key=$v" "seed=$s" > /dev/null 2>&1
        n=$((n + 1))
        if cmp -s "sw-$name/runs/$key=$v/seed$s/metrics.csv" "al-$name/$v-$s/metrics.csv"; then
            same=$((same + 1))
        else
            echo "  differs: $key=$v seed $s"
        fi
    done; done
    echo "$name: $same of $n metrics.csv byte-identical to fedhp run alone"
}
check fedavgm "--plugin fedavgm.py" algorithm.momentum 0.5,0.9 "algorithm.name=fedavgm"
check sfedhp "" algorithm.lam 15,20 "algorithm.name=sfedhp"
check pfedme "" algorithm.lam 15,20 "algorithm.name=pfedme"
check fedprox "" algorithm.mu 0.01,0.1 "algorithm.name=fedprox"
check hierfavg "" algorithm.lr 0.05,0.1 "algorithm.name=hierfavg"
check perfedavg "" algorithm.beta 0.001,0.005 "algorithm.name=perfedavg"
