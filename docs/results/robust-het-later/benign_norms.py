"""cclip's S for the DNN rows of ``fedhp reproduce robust --heterogeneity``'s later rows: as
``docs/results/robust-het-sfedhp/benign_norms.py`` (the median norm of the benign updates each
level receives in the attack-free run of the mean, 2 label shards, validation, seed 0, all
rounds pooled), with the model as a third argument:

    .venv/bin/python docs/results/robust-het-later/benign_norms.py fedavg /tmp/norms-fedavg-dnn dnn
    .venv/bin/python docs/results/robust-het-later/benign_norms.py hierfavg /tmp/norms-hier-dnn dnn
    .venv/bin/python docs/results/robust-het-later/benign_norms.py sfedhp /tmp/norms-sfedhp-dnn dnn

(FedAvg: its clients' updates are the rows the cloud aggregates, the "cloud" figure; its mean
skips the uplink, so it runs as cclip with τ = 1e9, which is the mean. ``mlr`` as the third
argument checks the method: FedAvg's S = 0.4 of ``robust.LEVELS``.)"""

import statistics
import sys
from pathlib import Path

from fedhp.engine import uplink
from fedhp.experiments import robust
from fedhp.experiments.common import ReproOptions, run_config

edge: list[float] = []
cloud: list[float] = []
forge, aggregate = uplink.Uplink.forge, uplink.Uplink.aggregate


def recorded_forge(self, rows, senders, start):  # every client upload, before any attack
    if self.level == "edge":
        edge.extend((rows - start).norm(dim=1).tolist())
    return forge(self, rows, senders, start)


def recorded_aggregate(self, rows, weights, start, *args, **kw):  # every cloud aggregation
    if self.level == "cloud":
        cloud.extend((rows - start).norm(dim=1).tolist())
    return aggregate(self, rows, weights, start, *args, **kw)


uplink.Uplink.forge, uplink.Uplink.aggregate = recorded_forge, recorded_aggregate
opts = ReproOptions(dataset="mnist", threads=1, eval_every=10, model=sys.argv[3])
overrides = robust.het_overrides(opts, sys.argv[1], "shards2", robust.REFERENCE, "none", "val", 0)
if sys.argv[1] == "fedavg":  # FedAvg's mean skips the uplink: cclip with a radius no update
    # reaches is the mean (v + mean of the unclipped x_i - v) and passes its rows through it
    overrides += ["robust.cloud.name=cclip", "robust.cloud.tau=1e9"]
summary = run_config(overrides, Path(sys.argv[2]))
print(f"{sys.argv[1]}: acc {summary['final_global_acc']:.4f}; median benign-update norm")
for name, norms in (("edges", edge), ("cloud", cloud)):
    if norms:
        print(f"{name} {statistics.median(norms):.4f} ({len(norms)} rows)")
