#!/bin/bash
# The one-off validation grid of issue 43 (seed 0, the --quick scale, validation = the last 10 % of
# each role's training windows after a 40-window gap). Usage: [SEEDS=1] grid.sh METHOD
OUT=${OUT:-sweeps/leaf-quick-grid}; mkdir -p $OUT
BASE="dataset.name=shakespeare dataset.sample_fraction=0.02 dataset.min_samples=0 dataset.train_fraction=0.8 dataset.seq_len=40 dataset.speech_separator=space subsample.test=3000 subsample.train=15000 partition.name=natural federation.num_clients=17 federation.weighting=samples model.name=lstm model.embed_dim=8 model.hidden=32 model.layers=2 algorithm.batch_size=10 rounds=100 eval_every=10 eval_train=false threads=1 progress=false checkpoint_every=1000 partition.val_fraction=0.1 partition.val_tail=true partition.val_gap=40 eval_split=val"
FLAT="federation.client_fraction=0.5882352941176471"
m=$1
case $m in
fedavg) A="algorithm.name=fedavg algorithm.local_steps=20 $FLAT"; G="--grid algorithm.lr=0.8,1.6,2.4";;
pfedme) A="algorithm.name=pfedme algorithm.K=1 algorithm.R=20 algorithm.lam=1 algorithm.lr=0.8 $FLAT"; G="--grid algorithm.personal_lr=0.5,1.0,1.5";;
sfedhp) A="algorithm.name=sfedhp algorithm.K=1 algorithm.R=20 algorithm.lam=1 algorithm.global_lr=2 federation.num_edges=2 federation.edges_per_round=1"; G="--grid algorithm.lr=0.5,1.0,1.5";;
ditto) A="algorithm.name=ditto algorithm.local_steps=20 $FLAT"; G="--grid algorithm.lr=0.8,1.6";;
fedper) A="algorithm.name=fedper algorithm.local_steps=20 $FLAT"; G="--grid algorithm.lr=0.8,1.6";;
fedlps) A="algorithm.name=fedlps algorithm.local_steps=20 algorithm.rounds=100 algorithm.mu=0 algorithm.capability_levels=[1.0] algorithm.arms_low=0.5 algorithm.score_lr=0.01 $FLAT"; G="--grid algorithm.lr=0.8,1.6";;
fedlps-more) A="algorithm.name=fedlps algorithm.local_steps=20 algorithm.rounds=100 algorithm.mu=0 algorithm.capability_levels=[1.0] algorithm.arms_low=0.5 algorithm.score_lr=0.01 $FLAT"; G="--grid algorithm.lr=2.4";;
fedlps-arms) A="algorithm.name=fedlps algorithm.local_steps=20 algorithm.rounds=100 algorithm.mu=0 algorithm.capability_levels=[1.0] algorithm.score_lr=0.01 $FLAT"; G="--grid algorithm.arms_low=0.75 --grid algorithm.lr=2.4";;
fedlps-arms90) A="algorithm.name=fedlps algorithm.local_steps=20 algorithm.rounds=100 algorithm.mu=0 algorithm.capability_levels=[1.0] algorithm.score_lr=0.01 $FLAT"; G="--grid algorithm.arms_low=0.9 --grid algorithm.lr=1.6,2.4";;
fedlps-lr32) A="algorithm.name=fedlps algorithm.local_steps=20 algorithm.rounds=100 algorithm.mu=0 algorithm.capability_levels=[1.0] algorithm.arms_low=0.5 algorithm.score_lr=0.01 $FLAT"; G="--grid algorithm.lr=3.2";;
esac
fedhp sweep $BASE $A $G --seeds ${SEEDS:-0} --out $OUT/$m${SEEDS:+-seed$SEEDS}
