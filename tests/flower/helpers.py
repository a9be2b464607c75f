"""Run a configuration in-process and through the Flower round driver (in-process nodes)."""

from __future__ import annotations

import csv
from pathlib import Path

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.runner import Row, run_experiment
from fedhp.flower.cloud import FlowerDriver
from fedhp.flower.local import Fault, LocalTransport
from fedhp.flower.shards import make_shards, node_count
from tests.conftest import require_module

require_module("flwr")

BASE = ("progress=false", "eval_every=1", "checkpoint_every=0", "threads=1", "model.name=mlr")
# Few local steps keep each round cheap; the split and the messages are what is tested.
FAST = {
    "fedavg": ("algorithm.local_steps=3",),
    "fedprox": ("algorithm.local_steps=3",),
    "scaffold": ("algorithm.local_steps=3",),
    "moon": ("algorithm.local_steps=3",),
    "ditto": ("algorithm.local_steps=3",),
    "fedper": ("algorithm.local_steps=3",),
    "heterofl": ("algorithm.local_steps=3", "model.name=dnn", "model.hidden=[8]"),
    "fedrolex": ("algorithm.local_steps=3", "model.name=dnn", "model.hidden=[8]"),
    "lotteryfl": ("algorithm.local_steps=3", "model.name=dnn", "model.hidden=[8]"),
    "fedlps": ("algorithm.local_steps=3", "model.name=dnn", "model.hidden=[8]"),
    "fnrfl": ("algorithm.local_steps=3", "public.per_class=5", "algorithm.p=0.25"),
    "hierfavg": ("algorithm.kappa1=2", "algorithm.kappa2=2"),
    "sfedhp": ("algorithm.R=3", "algorithm.K=2"),
    "pfedme": ("algorithm.R=3", "algorithm.K=2"),
    "perfedavg": ("algorithm.local_steps=2",),
    "heurfedamp": ("algorithm.local_steps=3",),
    "local": ("algorithm.local_steps=3",),
}


def config_args(name: str, *overrides: str) -> list[str]:
    return [*BASE, f"algorithm.name={name}", *FAST.get(name, ()), *overrides]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def run_inprocess(out: Path, args: list[str]) -> Row:
    """The run in-process (the ``flower.*`` options, which it does not read, left out)."""
    given = [a for a in args if not a.startswith("flower.")]
    return run_experiment(build_experiment(resolve_config(None, given)), out)


def run_flower_local(
    out: Path, args: list[str], fault: Fault | None = None, resume: bool = False
) -> tuple[Row, FlowerDriver]:
    """The run through the Flower driver with fresh in-process nodes (no state of earlier
    runs: a resumed run's nodes start from scratch, as restarted SuperNodes would)."""
    exp = build_experiment(resolve_config(None, args, on_flower=True))  # (flower.* read)
    hier = exp.options.hierarchical
    shards = make_shards(exp.ctx.topology, node_count(exp.cfg, hier), hier)
    driver = FlowerDriver(exp, LocalTransport(fault), shards, out, log=lambda _: None)
    return run_experiment(exp, out, resume=resume, driver=driver), driver


def assert_same_metrics(a: Path, b: Path, tol: float = 1e-5) -> None:
    """Same columns; every numeric cell within ``tol`` (accuracies, losses, bytes, densities)."""
    for name in ("metrics.csv", "per_client.csv"):
        rows_a, rows_b = read_csv(a / name), read_csv(b / name)
        assert len(rows_a) == len(rows_b), name
        assert list(rows_a[0]) == list(rows_b[0]), name
        for ra, rb in zip(rows_a, rows_b, strict=True):
            for key, va in ra.items():
                vb = rb[key]
                if va == vb:
                    continue
                assert abs(float(va) - float(vb)) <= tol, (name, ra["round"], key, va, vb)
