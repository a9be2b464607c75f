"""cclip's S for a method of ``fedhp reproduce robust --heterogeneity``: the median norm of the
benign updates each level receives in the attack-free run of the mean (2 label shards,
validation, seed 0), all rounds pooled. At the edges: each client upload minus the model its
edge sent it (sFedHP: phi_ij - w_i, R per round; HierFAVG: the client's model after kappa1 steps
minus the edge model); at the cloud: each edge's upload minus the global model it started from.

    .venv/bin/python docs/results/robust-het-sfedhp/benign_norms.py sfedhp /tmp/norms-sfedhp
    .venv/bin/python docs/results/robust-het-sfedhp/benign_norms.py hierfavg /tmp/norms-hierfavg

(2026-11-27: sFedHP 0.0932 at the edges, 0.1231 at the cloud -> S = 0.09 / 0.12; HierFAVG
0.3066 / 0.1301, the 0.3 / 0.13 the grid uses, so the measurement is the one it was set by.)"""

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
opts = ReproOptions(dataset="mnist", threads=1, eval_every=10)
overrides = robust.het_overrides(opts, sys.argv[1], "shards2", robust.REFERENCE, "none", "val", 0)
summary = run_config(overrides, Path(sys.argv[2]))
print(f"{sys.argv[1]}: acc {summary['final_global_acc']:.4f}; median benign-update norm")
print(
    f"edges {statistics.median(edge):.4f} ({len(edge)} rows), cloud "
    f"{statistics.median(cloud):.4f} ({len(cloud)} rows)"
)
