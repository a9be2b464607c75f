"""Issue 54: the sFedHP paper's Table I at its own model — mean ± s.e., the trivial baseline
computed from the data, the paper's orderings checked pair by pair on per-seed paired
differences, the reuse of finished runs that differ only in cosmetic options, seeding a
reproduction from a ``fedhp sweep`` folder, and a missing Fashion-MNIST said in one line.
Fast: fabricated summaries, fabricated data or runs of a few rounds."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from fedhp.cli import main
from fedhp.config import config_to_dict, resolve_config
from fedhp.experiments import common, paper, table1
from fedhp.experiments.common import METHOD_OVERRIDES, ReproOptions
from tests.experiments.test_reproduce import TINY, fake_runner, write_cifar

FIVE = ["fedavg", "hierfavg", "fedprox", "pfedme", "sfedhp"]


def opts(tmp_path: Path, **kw: Any) -> ReproOptions:
    base: dict[str, Any] = dict(
        rounds=2, eval_every=1, out=tmp_path / "out", model="mlr", extra=list(TINY), quiet=True
    )
    base.update(kw)
    return ReproOptions(**base)


# ------------------------------------------------------------------------------ spread and pairs


def independent_verdict(higher: list[float], lower: list[float]) -> tuple[float, float, str]:
    """The paired check written out again with the standard library."""
    d = [a - b for a, b in zip(higher, lower, strict=True)]
    mean = statistics.fmean(d)
    se = statistics.stdev(d) / math.sqrt(len(d))
    word = "tie" if abs(mean) <= 2 * se else ("holds" if mean > 0 else "reversed")
    return mean, se, word


def test_standard_error_and_its_cell() -> None:
    stat = {"mean": 0.92, "std": 0.02, "values": [0.90, 0.92, 0.94]}
    se = table1.with_se(stat)["se"]
    assert se == pytest.approx(statistics.stdev(stat["values"]) / math.sqrt(3))
    assert table1.pct_se(table1.with_se(stat)) == f"92.00 ± {100 * se:.2f}"
    one = table1.with_se({"mean": 0.9, "std": 0.0, "values": [0.9]})
    assert one["se"] is None and table1.pct_se(one) == "90.00"  # one seed: no spread shown
    assert table1.pct_se(None) == "—" and table1.with_se(None) is None


def test_paired_difference_against_an_independent_computation() -> None:
    rng = np.random.default_rng(54)
    for _ in range(50):
        n = int(rng.integers(2, 6))
        a = list(rng.normal(92, 0.5, n))
        b = [x - float(rng.normal(rng.choice([-1.0, 0.0, 1.0]), 0.4)) for x in a]
        pair = table1.paired_difference(a, b)
        mean, se, word = independent_verdict(a, b)
        assert pair["mean"] == pytest.approx(mean) and pair["se"] == pytest.approx(se)
        assert table1.verdict(pair["mean"], pair["se"]) == word
    with pytest.raises(ValueError):
        table1.paired_difference([1.0, 2.0], [1.0])


def test_verdict_words() -> None:
    assert table1.verdict(0.5, 0.2) == "holds"
    assert table1.verdict(-0.5, 0.2) == "reversed"
    assert table1.verdict(0.4, 0.2) == "tie"  # exactly 2 s.e.: a tie
    assert table1.verdict(0.0, 0.0) == "tie"
    assert table1.verdict(0.5, None) == "—"  # one seed


def five_results(tmp_path: Path, acc: dict[str, list[float]], **kw: Any) -> dict[str, Any]:
    o = opts(tmp_path, seeds=3, methods=FIVE, **kw)
    run = fake_runner(acc, [])
    results = common.run_jobs(table1.jobs(o), o, tmp_path / "runs", run=run)
    return table1.build_table(
        o,
        results,
        {"global": 0.1, "personal": 0.2, "samples": 80, "split": "test", "dataset_test": 0.1135},
    )


def test_orderings_pair_by_pair_against_an_independent_computation(tmp_path: Path) -> None:
    """Made-up per-seed accuracies of the five methods: every pair's Δ, s.e. and verdict equal
    the standard library's; the pairs follow the paper's Table I order (MNIST Setting 1: sFedHP
    > FedProx > HierFAVG > FedAvg > pFedMe) and say where its text claims the reverse."""
    acc = {
        "sfedhp20.0": [0.917, 0.913, 0.919],  # above HierFAVG in every seed: holds
        "hierfavg0.05": [0.915, 0.910, 0.917],
        "fedprox0.001": [0.905, 0.909, 0.911],  # below HierFAVG: the paper's FedProx > HierFAVG
        "fedavg0.05": [0.9051, 0.9089, 0.9112],  # FedProx ≈ FedAvg: tie
        "pfedme15.0": [0.930, 0.925, 0.931],  # above everyone: reversed
    }
    table = five_results(tmp_path, acc)
    checks = [c for c in table["orderings"] if c["model"] == "global"]
    order = paper.table1_order(("mnist", 1))
    assert order == ["sfedhp", "fedprox", "hierfavg", "fedavg", "pfedme"]
    assert [(c["higher"], c["lower"]) for c in checks] == [
        (order[i], order[j]) for i in range(5) for j in range(i + 1, 5)
    ]
    key_of = {  # (the fake runner's key: the method and its λ / μ, else its lr)
        "sfedhp": "sfedhp20.0",
        "fedprox": "fedprox0.001",
        "pfedme": "pfedme15.0",
        "fedavg": "fedavg0.05",
        "hierfavg": "hierfavg0.05",
    }
    for c in checks:
        a = [100 * v for v in acc[key_of[c["higher"]]]]
        b = [100 * v for v in acc[key_of[c["lower"]]]]
        mean, se, word = independent_verdict(a, b)
        assert c["final"]["mean"] == pytest.approx(mean)
        assert c["final"]["se"] == pytest.approx(se)
        assert c["final_verdict"] == word
        # (the fake's best = final + 0.01 for every method: the same differences)
        assert c["best_verdict"] == word
        assert c["text_disagrees"] == ((c["higher"], c["lower"]) == ("fedprox", "hierfavg"))
    verdicts = {(c["higher"], c["lower"]): c["final_verdict"] for c in checks}
    assert verdicts[("sfedhp", "hierfavg")] == "holds"
    assert verdicts[("fedprox", "hierfavg")] == "reversed"
    assert verdicts[("fedprox", "fedavg")] == "tie"
    assert verdicts[("sfedhp", "pfedme")] == "reversed"
    # The paper's PM pair (pFedMe 98.92 at λ = 15 > sFedHP 97.83 at λ = 20): the same check.
    pm = [c for c in table["orderings"] if c["model"] == "personal"]
    assert [(c["higher"], c["lower"], c["paper"]) for c in pm] == [
        ("pfedme", "sfedhp", [98.92, 97.83])
    ]
    md = table["markdown"]
    assert "## The paper's orderings" in md
    assert "| GM | FedProx 93.43 > HierFAVG 93.22 (text: the reverse) | +0.21 |" in md
    assert "Trivial (majority class)" in md and "**10.00 %**" in md


def test_table_cells_are_mean_and_standard_error(tmp_path: Path) -> None:
    table = five_results(tmp_path, {"sfedhp20.0": [0.90, 0.92, 0.94]})
    se = 2 / math.sqrt(3)
    line = next(x for x in table["markdown"].splitlines() if x.startswith("| sFedHP |"))
    assert f"| 92.00 ± {se:.2f} | 93.00 ± {se:.2f} | 94.00 ± {se:.2f} | 95.00 ± {se:.2f} |" in line
    row = next(r for r in table["rows"] if r["method"] == "sfedhp")
    assert row["final_global_acc"]["std"] == pytest.approx(0.02)  # the std stays in table.json
    assert row["final_global_acc"]["se"] == pytest.approx(0.02 / math.sqrt(3))


def test_one_seed_gives_no_verdict(tmp_path: Path) -> None:
    o = opts(tmp_path, seeds=1, methods=["sfedhp", "hierfavg"])
    results = common.run_jobs(table1.jobs(o), o, tmp_path / "r", run=fake_runner({}, []))
    checks = table1.build_table(o, results)["orderings"]
    assert [c["final_verdict"] for c in checks] == ["—"]


def test_fmnist_orderings_come_from_its_table_i() -> None:
    assert paper.table1_order(("fmnist", 1)) == [
        "sfedhp",
        "hierfavg",
        "pfedme",
        "fedavg",
        "fedprox",
    ]
    # Table I's FMNIST pFedMe (80.57) is Table IV's λ = 30 entry, so the reproduction runs λ = 30.
    assert paper.table1_lambda(("fmnist", 1), "pfedme") == 30.0
    assert paper.paper_pm(("fmnist", 1), "pfedme", 30.0) == 98.94
    assert paper.paper_pm(("fmnist", 1), "sfedhp", 20.0) == 98.42


# ------------------------------------------------------------------------------ trivial baseline


def test_majority_shares_of_made_up_labels() -> None:
    clients = [np.array([0, 0, 0, 1]), np.array([1, 1, 2]), np.array([], dtype=np.int64)]
    gm, pm, n = table1.majority_shares(clients, 3)
    assert n == 7
    assert gm == pytest.approx(3 / 7)  # class 0 and class 1 both 3 of 7
    assert pm == pytest.approx((3 + 2) / 7)
    assert table1.majority_shares([np.array([], dtype=np.int64)], 3) == (None, None, 0)


def test_trivial_baseline_is_computed_from_the_data(tmp_path: Path) -> None:
    """Fabricated CIFAR-10 batches with an uneven test split: the baseline follows the data
    (the union's majority class, each client's own), not a constant."""
    root = tmp_path / "cifar"
    write_cifar(root, per_class=12)
    o = opts(tmp_path, dataset="cifar10", setting=2, model="mlr", data_dir=str(root))
    o.extra = ["partition.train_per_class=4", "partition.test_per_class=8"]
    trivial = table1.trivial_baseline(o)
    cfg = resolve_config(None, table1.trivial_options(o), refuse_unread=False)
    from fedhp.build import partition_data

    _, clients, _ = partition_data(cfg)
    ys = torch.cat([c.test_y for c in clients])
    assert trivial["samples"] == len(ys) == 80
    assert trivial["global"] == pytest.approx(torch.bincount(ys).max().item() / len(ys))
    own = sum(int(torch.bincount(c.test_y).max()) for c in clients if len(c.test_y)) / len(ys)
    assert trivial["personal"] == pytest.approx(own)
    assert trivial["personal"] > trivial["global"]  # 5 labels per client
    assert trivial["dataset_test"] == pytest.approx(0.1)  # 12 test images of each class


def test_a_missing_fashion_mnist_is_one_line_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedhp.data import sources

    monkeypatch.setattr(sources, "FMNIST_DEFAULT_DIR", str(tmp_path / "no-such-dir"))
    monkeypatch.delenv(sources.ENV_DATA_DIR, raising=False)
    out = tmp_path / "t1"
    argv = ["reproduce", "sfedhp-table1", "--dataset", "fmnist", "--setting", "1"]
    code = main([*argv, "--rounds", "1", "--methods", "fedavg", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1, err
    assert "Fashion-MNIST not found" in err[0] and "no run started" in err[0]
    assert "apt-get install dataset-fashion-mnist" in err[0]
    assert not (out / "runs").exists()


# ------------------------------------------------------------------------------ cosmetic reuse

RUN_BASE = [
    "dataset.name=mnist",
    "partition.name=labels",
    "partition.labels_per_client=5",
    *TINY,
    "federation.num_clients=20",
    "federation.num_edges=4",
    "algorithm.batch_size=20",
    "algorithm.lr=0.05",
    "model.name=dnn",
    "model.hidden=[8]",
    "rounds=3",
    "eval_every=1",
    "threads=1",
]
PARAMS = {"fedprox": ["algorithm.mu=0.001"], "pfedme": ["algorithm.lam=15.0"]}


def digest(folder: Path) -> str:
    """metrics.csv and per_client.csv without their time columns, and the final state."""
    h = hashlib.sha256()
    for name in ("metrics.csv", "per_client.csv"):
        with open(folder / name) as fh:
            for r in csv.DictReader(fh):
                h.update(repr(sorted((k, v) for k, v in r.items() if "second" not in k)).encode())
    state = torch.load(folder / "final_state.pt", weights_only=False)
    state = state.get("state", state)
    for k in sorted(state):
        if isinstance(state[k], torch.Tensor):
            h.update(k.encode() + state[k].contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("method", FIVE)
def test_checkpoint_every_and_progress_change_no_result(tmp_path: Path, method: str) -> None:
    """Why they are cosmetic (common.COSMETIC_OPTIONS): the same run with checkpoints every
    round or none, progress on or off, is byte-identical."""
    from fedhp.api import prepare, run_built

    seen = set()
    for every, progress in ((0, "false"), (1, "true")):
        own = [*METHOD_OVERRIDES[method], *PARAMS.get(method, [])]
        ov = [*RUN_BASE, *own, f"checkpoint_every={every}", f"progress={progress}"]
        folder = tmp_path / f"ck{every}"
        run_built(prepare(resolve_config(None, ov)), folder, progress=False)
        seen.add(digest(folder))
    assert len(seen) == 1


def fake_finished(folder: Path, overrides: list[str], summary: dict[str, Any]) -> None:
    """A finished run's folder as ``fedhp sweep``/``fedhp run`` leave it (config.yaml as
    written, summary.json)."""
    folder.mkdir(parents=True)
    config = config_to_dict(resolve_config(None, overrides))
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (folder / "summary.json").write_text(json.dumps(summary))


def test_same_run_sets_only_cosmetic_options_aside() -> None:
    base = [*RUN_BASE, "algorithm.name=fedavg", "algorithm.local_steps=100"]
    ours = config_to_dict(resolve_config(None, [*base, "checkpoint_every=100", "progress=false"]))
    for other, same in (
        (["checkpoint_every=50", "progress=true"], True),
        (["checkpoint_every=0"], True),
        (["threads=2"], False),  # may change the order of float sums
        (["eval_every=2"], False),  # changes what the best round sees
        (["seed=1"], False),
    ):
        saved = config_to_dict(resolve_config(None, [*base, *other]))
        assert common.same_run(saved, ours) is same, other
    assert set(common.COSMETIC_OPTIONS) == {"progress", "checkpoint_every"}


def test_a_finished_run_differing_in_cosmetic_options_is_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed sFedHP/HierFAVG rows were made by ``fedhp sweep`` with checkpoint_every=50
    and progress on; the reproduction (checkpoint_every=100, progress=false) reuses such runs
    without running anything: sequentially (through the sweep's batches) and in the function
    the ``--jobs N`` workers call (run_config)."""
    o = opts(tmp_path, seeds=2, methods=["hierfavg"], quiet=False)
    tasks = common.job_tasks(table1.jobs(o), o, o.runs_dir(table1.NAME))
    for _, seed, overrides, folder in tasks:
        sweep_like = [x for x in overrides if not x.startswith(("checkpoint_every", "progress"))]
        summary = {"final_global_acc": 0.5 + seed / 10, "best_global_acc": 0.6, "seconds": 1.0}
        fake_finished(folder, [*sweep_like, "checkpoint_every=50", "progress=true"], summary)
    results = common.run_jobs(table1.jobs(o), o, o.runs_dir(table1.NAME))
    assert results["hierfavg"]["final_global_acc"]["values"] == [0.5, 0.6]
    assert capsys.readouterr().err.count("reused") == 2
    for _, seed, overrides, folder in tasks:
        assert common.run_config(overrides, folder)["final_global_acc"] == 0.5 + seed / 10
        # nothing ran: no metrics.csv, config.yaml as the sweep wrote it
        assert not (folder / "metrics.csv").exists()
        assert "checkpoint_every: 50" in (folder / "config.yaml").read_text()
    # A run that differs in more than that is not reused.
    _, _, overrides, folder = tasks[0]
    assert common.finished_summary(overrides, folder) is not None
    assert common.finished_summary([*overrides, "threads=2"], folder) is None


@pytest.mark.filterwarnings("ignore:algorithm.global_lr is the old name")
def test_seeding_a_reproduction_from_a_sweep_folder(tmp_path: Path) -> None:
    """benchmarks/seed_table1_runs.py's work: a sweep's runs land in the job folders whose
    configuration they computed; a run of another configuration is not copied; a destination
    holding a run is left alone."""
    o = opts(tmp_path, seeds=2, methods=["sfedhp", "hierfavg"])
    tasks = common.job_tasks(table1.jobs(o), o, o.runs_dir(table1.NAME))
    sweep = tmp_path / "sweep"
    runs = []
    for key, seed, overrides, _ in tasks:
        if key != "sfedhp-lam20.0":
            continue
        # (as `fedhp sweep` writes it: its own checkpoint_every, progress on, the old name
        # of edge_lr)
        typed = [x.replace("algorithm.edge_lr", "algorithm.global_lr") for x in overrides]
        typed = [x for x in typed if not x.startswith(("checkpoint_every", "progress"))]
        out_dir = f"runs/base/seed{seed}"
        fake_finished(sweep / out_dir, [*typed, "checkpoint_every=50"], {"final_global_acc": 0.9})
        runs.append({"seed": seed, "out_dir": out_dir})
    other = "runs/other/seed0"
    sfedhp0 = next(ov for key, _, ov, _ in tasks if key == "sfedhp-lam20.0")
    fake_finished(sweep / other, [*sfedhp0, "algorithm.lam=30.0"], {"final_global_acc": 0.1})
    runs.append({"seed": 0, "out_dir": other})
    (sweep / "sweep.json").write_text(json.dumps({"runs": runs}))
    report = table1.seed_from_sweep(o, sweep)
    assert [(d, what) for _, d, what in report] == [
        (o.runs_dir(table1.NAME) / "sfedhp-lam20.0/seed0", "copied"),
        (o.runs_dir(table1.NAME) / "sfedhp-lam20.0/seed1", "copied"),
        (None, "computes no run of this reproduction"),
    ]
    for key, seed, overrides, folder in tasks:
        assert (common.finished_summary(overrides, folder) is not None) == (
            key == "sfedhp-lam20.0"
        ), (key, seed)
    again = table1.seed_from_sweep(o, sweep)
    assert [what for _, _, what in again][:2] == ["destination holds a run already; left alone"] * 2
