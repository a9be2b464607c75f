"""The 5-round regression runs of every algorithm (docs/engine.md, "Same results as before"):
``fedhp run progress=false threads=1 rounds=5 eval_every=1 checkpoint_every=0
algorithm.local_steps=5 algorithm.name=<alg>`` (FNR-FL with ``public.per_class=10``; no
``local_steps`` where the method does not read it: sfedhp, hierfavg, pfedme, pfedgp), each in its
own subprocess, its ``metrics.csv`` copied to ``<out>/<alg>.csv``. Run it on two checkouts
(``PYTHONPATH=<checkout>/src``) and compare the folders with ``--compare A B``: byte-identical
files are listed as such, others with their largest relative difference of any value.

``--variant NAME ...`` runs, instead of the default set, the named variants of :data:`VARIANTS`
(the paths a refactor of the uplink, the faults or the BatchNorm statistics can reach: robust
rules at the cloud and the edge, an update attack, DP at the cloud and the edge and with Poisson
sampling, dropouts and stragglers, a BatchNorm VGG with averaged and local statistics), each into
``OUT/<name>/``; ``--compare`` compares the subfolders of OLD with NEW's in turn.

Usage: python benchmarks/regression_runs.py OUT [--only ALG ...] [--extra key=value ...]
       python benchmarks/regression_runs.py OUT --variant all | NAME ...
       python benchmarks/regression_runs.py --compare OLD NEW
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BASE = [
    "progress=false",
    "threads=1",
    "rounds=5",
    "eval_every=1",
    "checkpoint_every=0",
    "algorithm.local_steps=5",
]
EXTRA = {"fnrfl": ["public.per_class=10"], "diht": ["algorithm.local_steps=1"]}
ROBUST_METHODS = [
    "fedavg",
    "fedht",
    "fedper",
    "hierfavg",
    "perfedavg",
    "pfedme",
    "scaffold",
    "sfedhp",
]
TINY_BN = ["model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"]
VARIANTS: dict[str, tuple[list[str], list[str]]] = {
    "robust": (ROBUST_METHODS, ["robust.cloud.name=median"]),
    "attack": (
        ROBUST_METHODS,
        [
            "faults.attack.name=sign_flip",
            "faults.attack.fraction=0.2",
            "robust.cloud.name=trimmed_mean",
        ],
    ),
    "robustedge": (["hierfavg", "sfedhp"], ["robust.edge.name=median"]),
    "dp": (["fedavg", "fedprox"], ["privacy.enabled=true"]),
    "dpedge": (["hierfavg"], ["privacy.enabled=true", "privacy.where=edge"]),
    "dppoisson": (
        ["fedavg"],
        ["privacy.enabled=true", "privacy.sampling=poisson", "federation.client_fraction=0.5"],
    ),
    "faults": (
        [
            "fedavg",
            "scaffold",
            "sfedhp",
            "pfedme",
            "hierfavg",
            "fedlps",
            "ditto",
            "fedper",
            "moon",
            "fednova",
            "heterofl",
        ],
        ["faults.client_dropout=0.2", "faults.straggler=0.1"],
    ),
    "bn": (["fedavg", "fedprox", "hierfavg", "local", "centralized"], TINY_BN),
    # (local keeps each client's statistics anyway and does not read algorithm.buffers)
    "bnlocal": (["fedavg", "fedprox", "hierfavg"], [*TINY_BN, "algorithm.buffers=local"]),
}
"""name -> (algorithms, overrides added to each of their runs)."""


def algorithms() -> list[str]:
    """Every registered algorithm (of the checkout on ``PYTHONPATH``)."""
    from fedhp.algorithms import ALGORITHMS

    return sorted(ALGORITHMS.names())


def base_for(name: str) -> list[str]:
    """:data:`BASE` less the options algorithm ``name`` does not read (``local_steps`` of the
    methods that derive their local work, e.g. sfedhp's R and K), which ``fedhp run`` refuses
    (issue 42); all of BASE on a checkout from before that refusal."""
    try:
        from fedhp.unread import read_overrides
    except ImportError:
        return BASE
    return read_overrides(BASE, [f"algorithm.name={name}"])


def run_all(out: Path, names: list[str], extra: list[str]) -> None:
    """Run every algorithm in ``names`` and copy its metrics.csv to ``out/<name>.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as run:
            args = [*base_for(name), f"algorithm.name={name}", *EXTRA.get(name, []), *extra]
            cmd = [sys.executable, "-m", "fedhp.cli", "run", *args, "--out", run]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["?"])[-1]
                print(f"{name}: failed: {tail}", flush=True)
                continue
            shutil.copy(Path(run) / "metrics.csv", out / f"{name}.csv")
            print(f"{name}: ok", flush=True)


def max_relative_difference(a: Path, b: Path) -> float:
    """Largest relative difference of any numeric value of two metrics.csv files (inf if their
    shapes or non-numeric cells differ)."""
    rows_a, rows_b = list(csv.reader(a.open())), list(csv.reader(b.open()))
    if len(rows_a) != len(rows_b):
        return float("inf")
    worst = 0.0
    for ra, rb in zip(rows_a, rows_b, strict=True):
        if len(ra) != len(rb):
            return float("inf")
        for x, y in zip(ra, rb, strict=True):
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                return float("inf")
            worst = max(worst, abs(fx - fy) / max(abs(fx), abs(fy), 1e-30))
    return worst


def compare(old: Path, new: Path) -> bool:
    """Print one line per algorithm (per variant subfolder: a header line first); True if every
    file is byte-identical."""
    same = True
    for sub in sorted(d for d in old.iterdir() if d.is_dir()):
        print(f"## {sub.name}")
        same = compare(sub, new / sub.name) and same
    for a in sorted(old.glob("*.csv")):
        b = new / a.name
        if not b.exists():
            print(f"{a.stem}: missing in {new}")
            same = False
        elif a.read_bytes() == b.read_bytes():
            print(f"{a.stem}: byte-identical")
        else:
            print(
                f"{a.stem}: differs (max relative difference {max_relative_difference(a, b):.2e})"
            )
            same = False
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--extra", nargs="*", default=[], help="more key=value overrides")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    parser.add_argument("--variant", nargs="+", choices=["all", *VARIANTS], help="variant sets")
    args = parser.parse_args()
    if args.compare:
        sys.exit(0 if compare(*args.compare) else 1)
    if args.out is None:
        parser.error("OUT is required (or --compare OLD NEW)")
    if args.variant:
        names = list(VARIANTS) if "all" in args.variant else args.variant
        for name in names:
            methods, overrides = VARIANTS[name]
            print(f"## {name}", flush=True)
            run_all(args.out / name, args.only or methods, [*overrides, *args.extra])
        return
    run_all(args.out, args.only or algorithms(), args.extra)


if __name__ == "__main__":
    main()
