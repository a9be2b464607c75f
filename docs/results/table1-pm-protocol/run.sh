#!/bin/bash
# Deliver 4's experiment (issue 54): PM under the reference's best-round rule (eval every round)
# on Setting 1's 200/800 split vs Section V-B's 3/4 split; DNN-100, T = 100, seed 0, 1 thread.
cd /work/main
for split in s1 frac75; do
  extra=""; [ "$split" = frac75 ] && extra="partition.train_fraction=0.75"
  start=$(date -u +%FT%TZ)
  /usr/bin/time -v .venv/bin/fedhp reproduce sfedhp-table1 $extra --dataset mnist --setting 1 --model dnn \
     --rounds 100 --eval-every 1 --seeds 1 --methods pfedme,sfedhp --jobs 1 --threads 1 \
     --out runs/pm-protocol/$split > runs/pm-protocol/$split.out 2> runs/pm-protocol/$split.err
  echo "$split $start $(date -u +%FT%TZ) rc=$?" >> runs/pm-protocol/times.txt
done
