"""LibSVM files kept sparse: equal to the dense reading, a sparse-feature federation, and a
100,000-feature run within 1 GB of memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

from fedhp.data import load_dataset, split_dataset
from fedhp.engine.federation import Federation


def write_libsvm(
    path: Path, rows: int, features: int, nnz: int, seed: int, regression: bool, topics: int = 1
) -> None:
    """Random rows; with ``topics`` > 1, row r uses only the features of topic r mod topics, half
    of them from the topic's 40 common ones (a clustered, text-like layout K-means recovers)."""
    rng = np.random.default_rng(seed)
    lines = []
    width = features // topics
    for r in range(rows):
        lo = (r % topics) * width
        if topics > 1:
            common = rng.choice(40, nnz // 2, replace=False)
            rare = 40 + rng.choice(width - 40, nnz - nnz // 2, replace=False)
            idx = np.sort(lo + np.concatenate((common, rare))) + 1
        else:
            idx = np.sort(lo + rng.choice(width, nnz, replace=False)) + 1
        label = f"{rng.normal():.4f}" if regression else str(int(rng.choice([-1, 1])))
        lines.append(label + " " + " ".join(f"{i}:{rng.random():.4f}" for i in idx))
    path.write_text("\n".join(lines) + "\n")


def test_sparse_reading_equals_dense(tmp_path: Path) -> None:
    path = tmp_path / "small.svm"
    write_libsvm(path, 40, 25, 4, seed=0, regression=False)
    cfg = {"name": "libsvm", "path": str(path), "test_fraction": 0.25, "seed": 2}
    dense = load_dataset(cfg)
    sparse = load_dataset({**cfg, "sparse": True})
    assert sparse.train_x.is_sparse and sparse.train_x.shape == dense.train_x.shape
    assert torch.equal(sparse.train_x.to_dense(), dense.train_x)
    assert torch.equal(sparse.test_x.to_dense(), dense.test_x)
    assert torch.equal(sparse.train_y, dense.train_y) and sparse.num_classes == 2  # ±1 → 0/1
    clients = split_dataset(
        sparse, {"name": "categories", "category": "kmeans", "num_categories": 2}, 4, seed=0
    )
    fed = Federation.from_clients(clients, 2)
    assert fed.train.x.is_sparse and int(fed.train.counts.sum()) == 30
    x, y = fed.train.gather(torch.tensor([0, 2]), torch.zeros(2, 3, dtype=torch.long))
    assert x.is_sparse and x.shape == (2, 3, 25) and y.shape == (2, 3)


MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    torch.set_num_threads(1)
    from fedhp.config import resolve_config
    from fedhp.build import build_experiment
    from fedhp.engine.runner import run_experiment
    cfg = resolve_config(None, [
        "dataset.name=libsvm", f"dataset.path={sys.argv[1]}", "dataset.sparse=true",
        "dataset.task=regression", "dataset.test_fraction=0.1", "dataset.num_features=100000",
        "partition.name=categories", "partition.category=kmeans", "partition.kmeans_iters=5",
        "federation.num_clients=100", "federation.num_edges=1", "model.name=linreg",
        "algorithm.name=fediterht", "algorithm.tau=200", "algorithm.lr=0.01",
        "algorithm.local_steps=3", "rounds=2", "eval_every=1", "progress=false",
        "checkpoint_every=0",
    ])
    exp = build_experiment(cfg)
    assert exp.ctx.fed.train.x.is_sparse and exp.model.num_params == 100_000
    summary = run_experiment(exp, None)
    # VmHWM: this process image's own peak (ru_maxrss would include the forking parent's,
    # which Linux carries across execve: the whole pytest process when run in the suite)
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    peak_kb = int(status.split()[0])
    print(json.dumps({"peak_mb": peak_kb / 1024, "rounds": summary["rounds"]}))
    """
)


def test_hundred_thousand_features_stay_within_one_gigabyte(tmp_path: Path) -> None:
    path = tmp_path / "wide.svm"
    write_libsvm(path, 2000, 100_000, 30, seed=1, regression=True, topics=10)
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rounds"] == 2
    assert result["peak_mb"] < 1024, result  # dense 2,000 × 100,000 floats alone would be 800 MB
