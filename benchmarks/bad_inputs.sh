#!/bin/bash
# The inputs of issue 42's "Why" (a new user's bad or odd inputs), each run as such a user would:
# one markdown row per input with its exit code, whether a traceback was printed, and the first
# error/warning line (else the last line). Usage: bash benchmarks/bad_inputs.sh > docs/results/issue42-inputs.md
cd "$(dirname "$0")/.."
F=.venv/bin/fedhp
T=$(mktemp -d)
run() {
  local label="$1"; shift
  rm -rf "$T/out"
  out=$("$@" 2>&1 >/dev/null); rc=$?
  last=$(printf "%s\n" "$out" | grep -m1 -E "error|warning" || printf "%s\n" "$out" | tail -1)
  lines=$(printf '%s\n' "$out" | grep -c 'Traceback')
  printf '| %s | %s | %s | %s |\n' "$label" "$rc" "$([ "$lines" -gt 0 ] && echo TRACEBACK || echo no)" "${last//|/\\|}"
}
echo "| input | exit | traceback | what it says (first error or warning line) |"
echo "|---|---|---|---|"
run "sfedhp algorithm.local_steps=3" $F run algorithm.name=sfedhp algorithm.local_steps=3 rounds=1 --out $T/out
run "hierfavg algorithm.local_steps=3" $F run algorithm.name=hierfavg algorithm.local_steps=3 rounds=1 --out $T/out
run "hierfavg federation.client_fraction=0.5" $F run algorithm.name=hierfavg federation.client_fraction=0.5 rounds=1 --out $T/out
run "faults.attack.fraction=0.2 (no attack)" $F run faults.attack.fraction=0.2 rounds=1 --out $T/out
run "model.hidden=[]" $F run model.name=dnn "model.hidden=[]" rounds=1 --out $T/out
run "rounds=true" $F run rounds=true --out $T/out
run "compare --out x.txt" $F compare runs/default --out $T/x.txt
run "--out ''" $F run rounds=1 --out ""
run "FEDHP_DATA_DIR=/nonexistent" env FEDHP_DATA_DIR=/nonexistent $F run rounds=1 --out $T/out
run "fedht model.name=dnn" $F run algorithm.name=fedht model.name=dnn rounds=1 progress=false --out $T/out
run "shakespeare model.name=dnn" $F run dataset.name=shakespeare model.name=dnn rounds=1 --out $T/out
run "shakespeare model.name=mlr" $F run dataset.name=shakespeare model.name=mlr rounds=1 --out $T/out
run "dataset.name=synthetic" $F run dataset.name=synthetic rounds=1 --out $T/out
run "heterofl model.name=mlr" $F run algorithm.name=heterofl model.name=mlr rounds=1 --out $T/out
run "robust.cloud.beta=0.2 (mean)" $F run algorithm.name=fedavg robust.cloud.beta=0.2 rounds=1 --out $T/out
run "flower.nodes=2 (inprocess)" $F run flower.nodes=2 rounds=1 --out $T/out
run "privacy.clip_norm=1 (privacy off)" $F run privacy.clip_norm=1 rounds=1 --out $T/out
run "faults.straggler_work=partial (fedavg)" $F run algorithm.name=fedavg faults.straggler=0.3 faults.straggler_work=partial rounds=1 --out $T/out
rm -rf "$T"
R=$(mktemp -d)
$F run rounds=2 progress=false checkpoint_every=1 --out $R/run >/dev/null 2>&1
.venv/bin/python - "$R/run/checkpoint.pt" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
for i in range(1000, 1200): b[i] ^= 0xFF
open(p, "wb").write(bytes(b))
PY
T=$R
run "--resume, 200 bytes of checkpoint.pt flipped" $F run --resume $R/run rounds=3
rm -f $R/run/checkpoint.pt $R/run/checkpoint.prev.pt
run "--resume, checkpoint.pt deleted" $F run --resume $R/run rounds=3
rm -rf $R
