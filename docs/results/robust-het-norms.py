"""cclip's S for a method of ``fedhp reproduce robust --heterogeneity``: the median norm of the
benign updates each level receives in the attack-free run of the mean (2 label shards,
validation, seed 0), all rounds pooled. At the edges: each client upload minus the model its
edge sent it (sFedHP: phi_ij - w_i, R per round; HierFAVG: the client's model after kappa1 steps
minus the edge model); at the cloud: each edge's upload minus the global model it started from
(FedAvg: its clients' updates are the rows the cloud aggregates; its mean skips the uplink, so it
runs as cclip with τ = 1e9, which is the mean). The third argument is the model:

    .venv/bin/python docs/results/robust-het-norms.py sfedhp /tmp/norms-sfedhp mlr
    .venv/bin/python docs/results/robust-het-norms.py hierfavg /tmp/norms-hierfavg mlr
    .venv/bin/python docs/results/robust-het-norms.py fedavg /tmp/norms-fedavg-dnn dnn

(2026-11-27, MLR: sFedHP 0.0932 at the edges, 0.1231 at the cloud -> S = 0.09 / 0.12; HierFAVG
0.3066 / 0.1301, the 0.3 / 0.13 the grid uses; FedAvg 0.399, its 0.4. DNN:
robust-het-later/benign_norms.txt.)"""

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
