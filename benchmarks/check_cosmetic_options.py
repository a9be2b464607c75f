"""Check that ``checkpoint_every`` and ``progress`` change no result (issue 54): every Table I
method (FedAvg, FedProx μ = 0.001, HierFAVG, pFedMe λ = 15, sFedHP λ = 20) on a small MNIST
Setting-1-like partition, run with ``checkpoint_every`` 0, 1 and 3 and ``progress`` off and on;
metrics.csv and per_client.csv (less their time columns) and the final state compared.

That is why ``fedhp.experiments.common.COSMETIC_OPTIONS`` lets a reproduction reuse a finished
run that differs only in them. Usage: python benchmarks/check_cosmetic_options.py
[--hidden 500,200] [--rounds 4] [--per-class 20]; prints one line per method and exits 1 if any
differ.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
import tempfile
from pathlib import Path

TIME_COLUMNS = ("second", "time", "wall")


def digest(folder: Path) -> str:
    import torch

    h = hashlib.sha256()
    for name in ("metrics.csv", "per_client.csv"):
        with open(folder / name) as fh:
            for row in csv.DictReader(fh):
                kept = sorted(
                    (k, v) for k, v in row.items() if not any(t in k for t in TIME_COLUMNS)
                )
                h.update(repr(kept).encode())
    state = torch.load(folder / "final_state.pt", weights_only=False)
    state = state.get("state", state)
    for key in sorted(state):
        if isinstance(state[key], torch.Tensor):
            h.update(key.encode() + state[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    from fedhp.api import prepare, run_built
    from fedhp.config import resolve_config
    from fedhp.experiments.common import METHOD_OVERRIDES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", default="500,200")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=20)
    args = ap.parse_args(argv)
    base = [
        "dataset.name=mnist",
        "partition.name=labels",
        "partition.labels_per_client=5",
        f"partition.train_per_class={args.per_class}",
        f"partition.test_per_class={args.per_class}",
        "federation.num_clients=20",
        "federation.num_edges=4",
        "algorithm.batch_size=20",
        "algorithm.lr=0.05",
        "model.name=dnn",
        f"model.hidden=[{args.hidden}]",
        f"rounds={args.rounds}",
        "eval_every=1",
        "threads=1",
    ]
    params = {
        "fedprox": ["algorithm.mu=0.001"],
        "pfedme": ["algorithm.lam=15.0"],
        "sfedhp": ["algorithm.lam=20.0"],
    }
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("fedavg", "fedprox", "hierfavg", "pfedme", "sfedhp"):
            seen = {}
            for every, progress in ((0, "false"), (1, "false"), (3, "true")):
                overrides = [
                    *base,
                    *METHOD_OVERRIDES[method],
                    *params.get(method, []),
                    f"checkpoint_every={every}",
                    f"progress={progress}",
                ]
                folder = Path(tmp) / f"{method}-{every}"
                run_built(prepare(resolve_config(None, overrides)), folder, progress=False)
                seen[f"checkpoint_every={every},progress={progress}"] = digest(folder)
            same = len(set(seen.values())) == 1
            ok &= same
            print(method, "identical" if same else "DIFFERENT", seen, flush=True)
    print("all identical" if ok else "SOME DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
