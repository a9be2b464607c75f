# second GPU call of 2026-11-26 (issue 33 follow-up): run from the repo root after `. .gpu/env.sh`
set -u
export PYTHONFAULTHANDLER=1
ROOT=$PWD
t0=$(date +%s)
stamp() { echo "## $1 at $(( $(date +%s) - t0 )) s"; }
# 1. the resnet18 accuracy test on the pre-refactor tree (b71838e) and again on this tree
stamp old-resnet18-test
(cd .gpu/old && PYTHONPATH=$PWD/src:$PWD:/tmp/site:$ROOT/.gpu/pylib timeout -s ABRT 50 python3 -m pytest -p no:cacheprovider --tb=line -rfE tests/engine/test_gpu.py -k "resnet18" 2>&1 | grep -v "^  " | tail -6)
stamp new-resnet18-test
timeout -s ABRT 50 python3 -m pytest -p no:cacheprovider --tb=line -rfE tests/engine/test_gpu.py -k "resnet18" 2>&1 | grep -v "^  " | tail -6
# 2. FedAvg DNN-100 10k clients, old tree then this tree (harness fix: init on the device)
for tree in .gpu/old .; do
  stamp "fedavg-10k $tree"
  PYTHONPATH=$tree/src:$tree/benchmarks:$PYTHONPATH timeout -s ABRT 40 python3 $tree/benchmarks/bench_engine.py --device cuda --rows fedavg-dnn100-10k --table --table-repeats 3 2>&1 | grep -E "^device|^#|Error|File" | tail -8
done
# 3. the local-training rows and the end-to-end run, this tree, each in its own time box
for row in cnn2-10 dnn100-1k vgg11-bn-10 resnet18-10; do
  stamp "row $row"
  timeout -s ABRT 50 python3 benchmarks/bench_engine.py --device cuda --rows $row --table --table-repeats 1 2>&1 | grep -E "^device|^#|Error|File|line [0-9]" | tail -14
done
stamp run
timeout -s ABRT 50 python3 -m fedhp.cli run device=cuda progress=false checkpoint_every=0 --out /tmp/run1 2>&1 | tail -3
python3 -c "import json; print('run summary seconds', json.load(open('/tmp/run1/summary.json'))['seconds'])"
stamp done
