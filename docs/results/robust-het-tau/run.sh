#!/usr/bin/env bash
# A finer tau for cclip (issue 41, must-show 1): the commands behind docs/results/robust-het-tau/.
# Run from the repository root. Every run is the full grid's own configuration
# (base-<alg>-<attack>.yaml = runs/reproduce/robust-heterogeneity-mnist-full/runs/<alg>/val/
#  shards2/<chosen cclip>/<attack>/seed0/config.yaml, by make_bases.py) with only cclip's tau,
# the client momentum, cclip's iterations, eval_split and the seed overridden.
# FEDHP defaults to the frozen snapshot's code (PYTHONPATH=/work/snap/src); one run at a time,
# threads: 1 (in the base).
#   run.sh check | fedavg-val | fedavg-iters | hierfavg-val | hierfavg-val-extra
#   run.sh fedavg-val-t2 | fedavg-val-seeds | hierfavg-val-seeds | mean-val-seeds  (extra, validation)
#   run.sh fedavg-test TAU MOMENTUM | hierfavg-test SCALE MOMENTUM
set -euo pipefail
HERE=docs/results/robust-het-tau
OUT=${OUT:-runs/robust-tau}
FEDHP=${FEDHP:-"env PYTHONPATH=/work/snap/src .venv/bin/fedhp"}
ATTACKS=(none sign_flip alie ipm)

sweep() {  # sweep BASE DIR [fedhp sweep args...]
  local base=$1 dir=$2; shift 2
  echo "== $(date -u +%H:%M:%S) $dir"
  $FEDHP sweep "$HERE/$base" "$@" --out "$dir" > "$dir.log" 2>&1 || { cat "$dir.log"; return 1; }
}

case "${1:-}" in
  check)  # the full grid's chosen FedAvg config again (validation, seed 0): must reproduce it
    for a in "${ATTACKS[@]}"; do
      mkdir -p $OUT/check
      sweep base-fedavg-$a.yaml $OUT/check/fedavg-t1-m0.9-$a --grid robust.cloud.tau=0.4
    done ;;
  fedavg-val)  # tau in {0.5, 0.75, 1.5} x S (S = 0.4) x client momentum {0, 0.9}, L = 3
    for a in "${ATTACKS[@]}"; do
      mkdir -p $OUT/fedavg/val
      sweep base-fedavg-$a.yaml $OUT/fedavg/val/$a \
        --grid robust.cloud.tau=0.2,0.3,0.6 --grid algorithm.client_momentum=0.0,0.9
    done ;;
  fedavg-val-t2)  # (extra) tau = 2 S, seed 0: where between 1.5 and 2.5 S the sign flip breaks in
    for a in "${ATTACKS[@]}"; do
      mkdir -p $OUT/fedavg/val-t2
      sweep base-fedavg-$a.yaml $OUT/fedavg/val-t2/$a \
        --grid robust.cloud.tau=0.8 --grid algorithm.client_momentum=0.0,0.9
    done ;;
  fedavg-val-seeds)  # (extra) validation seeds 1, 2 of every no-bucket cclip tau (0.25..2.5 S)
    for a in "${ATTACKS[@]}"; do
      mkdir -p $OUT/fedavg/val-seeds
      sweep base-fedavg-$a.yaml $OUT/fedavg/val-seeds/$a --seeds 1,2 \
        --grid robust.cloud.tau=0.1,0.2,0.3,0.4,0.6,0.8,1.0 --grid algorithm.client_momentum=0.0,0.9
    done ;;
  mean-val-seeds)  # (extra) the clean mean's attack-free validation runs, seeds 1, 2
    for alg in fedavg hierfavg; do
      mkdir -p $OUT/$alg/val-seeds
      sweep base-$alg-mean-none.yaml $OUT/$alg/val-seeds/mean-none --seeds 1,2
    done ;;
  fedavg-iters)  # L in {1, 5} at tau = 1 S, beta = 0.9
    for a in "${ATTACKS[@]}"; do
      mkdir -p $OUT/fedavg/val-iters
      sweep base-fedavg-$a.yaml $OUT/fedavg/val-iters/$a \
        --grid robust.cloud.clip_iters=1,5
    done ;;
  hierfavg-val|hierfavg-val-extra|hierfavg-val-seeds)  # cclip at the edges (S = 0.3), cloud (S = 0.13)
    # hierfavg-val: seed 0; -extra: (extra) tau = 0.25, 2, 2.5 S, seed 0 (0.25 and 2.5 S were
    # not in the full grid's HierFAVG stage); -seeds: (extra) validation seeds 1, 2 of every tau
    seeds=0; dir=val
    case "$1" in
      hierfavg-val) scales="0.5 0.75 1.5" ;;
      hierfavg-val-extra) scales="0.25 2 2.5" ;;
      hierfavg-val-seeds) scales="0.25 0.5 0.75 1 1.5 2 2.5"; seeds=1,2; dir=val-seeds ;;
    esac
    for s in $scales; do
      et=$(python3 -c "print(f'{$s*0.3:.6g}')"); ct=$(python3 -c "print(f'{$s*0.13:.6g}')")
      for a in "${ATTACKS[@]}"; do
        mkdir -p $OUT/hierfavg/$dir/t$s
        sweep base-hierfavg-$a.yaml $OUT/hierfavg/$dir/t$s/$a --seeds $seeds \
          robust.edge.tau=$et robust.cloud.tau=$ct --grid algorithm.client_momentum=0.0,0.9
      done
    done ;;
  fedavg-test)  # fedavg-test TAU MOMENTUM: seeds 0..2 on the test split
    for a in "${ATTACKS[@]}"; do
      mkdir -p $OUT/fedavg/test
      sweep base-fedavg-$a.yaml $OUT/fedavg/test/t$2-m$3-$a eval_split=test \
        robust.cloud.tau=$2 algorithm.client_momentum=$3 --seeds 0,1,2
    done ;;
  hierfavg-test)  # hierfavg-test SCALE MOMENTUM
    et=$(python3 -c "print(f'{$2*0.3:.6g}')"); ct=$(python3 -c "print(f'{$2*0.13:.6g}')")
    for a in "${ATTACKS[@]}"; do
      mkdir -p $OUT/hierfavg/test
      sweep base-hierfavg-$a.yaml $OUT/hierfavg/test/t$2-m$3-$a eval_split=test \
        robust.edge.tau=$et robust.cloud.tau=$ct algorithm.client_momentum=$3 --seeds 0,1,2
    done ;;
  *) echo "usage: $0 check|fedavg-val|fedavg-val-t2|fedavg-val-seeds|fedavg-iters|hierfavg-val|hierfavg-val-extra|hierfavg-val-seeds|mean-val-seeds|fedavg-test T M|hierfavg-test S M"; exit 2 ;;
esac
