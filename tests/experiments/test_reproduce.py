"""The reproduction runner: tables with our rows beside the paper's, mean ± std, tuning on
validation data, figures, CIFAR-10 plumbing and the ``fedhp reproduce`` command."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.engine.evaluate import evaluate_shared
from fedhp.engine.runner import evaluate_state
from fedhp.experiments import common, figures, lambda_sweep, paper, table1, tune
from fedhp.experiments.common import ReproOptions, aggregate, mean_std

TINY = ["partition.train_per_class=20", "partition.test_per_class=20"]


def opts(tmp_path: Path, **kw: Any) -> ReproOptions:
    base: dict[str, Any] = dict(
        rounds=2, eval_every=1, out=tmp_path / "out", model="mlr", extra=list(TINY), quiet=True
    )
    base.update(kw)
    return ReproOptions(**base)


def test_mean_std_is_sample_std() -> None:
    assert mean_std([0.9]) == (0.9, 0.0)
    m, s = mean_std([0.90, 0.92, 0.94])
    assert m == pytest.approx(0.92) and s == pytest.approx(0.02)
    assert all(math.isnan(v) for v in mean_std([]))


def test_aggregate_over_seeds() -> None:
    agg = aggregate(
        [
            {"final_global_acc": 0.5, "best_global_acc": 0.6},
            {"final_global_acc": 0.7, "best_global_acc": 0.8, "stopped": "x"},
        ]
    )
    assert agg["final_global_acc"]["mean"] == pytest.approx(0.6)
    assert agg["final_global_acc"]["std"] == pytest.approx(math.sqrt(0.02))
    assert agg["best_global_acc"]["values"] == [0.6, 0.8]
    assert agg["stopped"] == ["x"] and "final_personal_acc" not in agg


def test_paper_transcriptions_agree_between_tables() -> None:
    """Table I and Tables II–VII were transcribed separately: Table I's FedAvg/HierFAVG/FedProx
    GMs must equal those tables' rows, and its pFedMe/sFedHP GMs must be one λ's entry there."""
    assert set(paper.TABLE1) == set(paper.TABLES)
    for key, row in paper.TABLE1.items():
        for method in ("fedavg", "hierfavg", "fedprox"):
            assert row[method][0] == paper.TABLES[key][method], (key, method)
        for method in ("pfedme", "sfedhp"):
            lam = paper.table1_lambda(key, method)  # raises if no λ matches
            assert paper.paper_gm(key, method, lam) == row[method][0]


def test_paper_numbers_only_at_the_same_hyperparameters() -> None:
    key = ("mnist", 1)
    table1_lam = paper.table1_lambda(key, "sfedhp")
    assert paper.table1_gm_at(key, "sfedhp", {"lam": table1_lam}) == list(
        paper.TABLE1[key]["sfedhp"]
    )
    other = next(lam for lam in paper.LAMBDAS if lam != table1_lam)
    gm = paper.table1_gm_at(key, "sfedhp", {"lam": other})
    assert gm == [paper.paper_gm(key, "sfedhp", other)] and gm[0] != paper.TABLE1[key]["sfedhp"][0]
    assert paper.table1_gm_at(key, "fedprox", {"mu": 0.001}) == list(paper.TABLE1[key]["fedprox"])
    assert paper.table1_gm_at(key, "fedprox", {"mu": 0.1}) is None  # no paper number at μ = 0.1
    assert paper.table1_gm_at(key, "centralized", {}) is None


def test_table1_tiny_real_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    o = opts(tmp_path, methods=["fedavg", "sfedhp", "centralized", "local"])
    table = table1.reproduce(o)
    md = (tmp_path / "out" / "table.md").read_text()
    key = ("mnist", 1)
    lam = paper.table1_lambda(key, "sfedhp")  # without --tuned: the paper's Table I choice
    for text in ("FedAvg", "sFedHP", "Centralized", "Local only", f"lam={lam:g}", "| 100 |"):
        assert text in md
    data = json.loads((tmp_path / "out" / "table.json").read_text())
    rows = {r["method"]: r for r in data["rows"]}
    assert set(rows) == {"fedavg", "sfedhp", "centralized", "local"}
    # The paper's cells are its numbers at our hyperparameters, Table I's at Table I's λ.
    assert rows["sfedhp"]["paper_gm"] == list(paper.TABLE1[key]["sfedhp"])
    assert rows["sfedhp"]["paper_pm"] == paper.paper_pm(key, "sfedhp", lam)
    sfedhp_line = next(line for line in md.splitlines() if line.startswith("| sFedHP |"))
    assert common.paper_cell(rows["sfedhp"]["paper_gm"]) in sfedhp_line
    assert rows["local"]["final_global_acc"] is None and rows["local"]["final_personal_acc"]
    assert (
        rows["centralized"]["final_personal_acc"] is None
        and rows["centralized"]["paper_gm"] is None
    )
    assert table["rows"] == data["rows"]
    # The table reports what the run wrote (not some other run's or a rounded value).
    summary = json.loads((tmp_path / "out/runs/fedavg/seed0/summary.json").read_text())
    assert rows["fedavg"]["final_global_acc"]["values"] == [summary["final_global_acc"]]
    assert rows["fedavg"]["best_global_acc"]["values"] == [summary["best_global_acc"]]
    assert summary["rounds"] == 2 and (tmp_path / "out/runs/fedavg/seed0/nodes.json").is_file()
    # A second call reuses the finished runs.
    log: list[str] = []
    o.quiet = False
    table1.reproduce(o)
    log.append(capsys.readouterr().err)
    assert log[0].count("reused") == 4


def fake_runner(acc: dict[str, list[float]], calls: list[list[str]]) -> Any:
    """A run function whose accuracy depends on the algorithm, its λ/μ/α and the seed."""

    def run(overrides: list[str], folder: Path) -> dict[str, Any]:
        calls.append(overrides)
        kv = dict(o.split("=", 1) for o in overrides)
        name = kv["algorithm.name"]
        hp = kv.get("algorithm.lam", kv.get("algorithm.mu", kv.get("algorithm.alpha", "")))
        hp = hp or kv.get("algorithm.lr", "")
        seed = int(kv["seed"])
        value = acc.get(f"{name}{hp}", [0.5, 0.5, 0.5])[seed]
        out: dict[str, Any] = {
            "final_global_acc": value,
            "best_global_acc": value + 0.01,
            "gradient_evaluations_per_round": 100,
            "seconds": 1.0,
        }
        if name in ("sfedhp", "pfedme", "heurfedamp", "pfedgp"):
            out["final_personal_acc"] = value + 0.02
            out["best_personal_acc"] = value + 0.03
        if value < 0:
            out["stopped"] = "diverged"
        return out

    return run


def test_table_mean_std_over_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    run = fake_runner({"sfedhp20.0": [0.90, 0.92, 0.94]}, calls)
    monkeypatch.setattr(common, "run_config", run)
    o = opts(tmp_path, seeds=3, methods=["sfedhp"])
    results = common.run_jobs(table1.jobs(o), o, tmp_path / "runs", run=run)
    md = table1.build_table(o, results)["markdown"]
    # (mean ± standard error: 2.00 / √3; the std stays in table.json)
    assert "| 92.00 ± 1.15 | 93.00 ± 1.15 | 94.00 ± 1.15 | 95.00 ± 1.15 |" in md
    assert sorted(int(dict(x.split("=", 1) for x in c)["seed"]) for c in calls) == [0, 1, 2]


def test_tuned_table_shows_the_papers_numbers_at_our_hyperparameters(tmp_path: Path) -> None:
    """With tuned λ = 30 / μ = 0.1 the paper's cells are its λ = 30 entries and "—" for FedProx
    (the paper has no μ = 0.1 number), never Table I's numbers at other hyperparameters."""
    tuned = tmp_path / "tuned.json"
    choices = {"sfedhp": {"lam": 30.0}, "fedprox": {"mu": 0.1}}
    tuned.write_text(json.dumps({"mnist-s1": {"choices": choices}}))
    o = opts(tmp_path, methods=["sfedhp", "fedprox"], tuned=tuned)
    run = fake_runner({}, [])
    table = table1.build_table(o, common.run_jobs(table1.jobs(o), o, tmp_path / "r", run=run))
    rows = {r["method"]: r for r in table["rows"]}
    key = ("mnist", 1)
    assert rows["sfedhp"]["paper_gm"] == [paper.paper_gm(key, "sfedhp", 30.0)]
    assert rows["sfedhp"]["paper_pm"] == paper.paper_pm(key, "sfedhp", 30.0)
    assert rows["fedprox"]["paper_gm"] is None
    line = next(x for x in table["markdown"].splitlines() if x.startswith("| sFedHP |"))
    assert common.paper_cell(list(paper.TABLE1[key]["sfedhp"])) not in line


def test_tune_picks_by_validation_accuracy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acc = {
        "sfedhp5.0": [0.8] * 3,
        "sfedhp25.0": [0.95] * 3,
        "sfedhp30.0": [-1.0] * 3,
        "fedprox0.01": [0.7] * 3,
        "heurfedamp0.5": [0.9] * 3,
        "pfedgp0.1": [0.8] * 3,
    }
    calls: list[list[str]] = []
    monkeypatch.setattr(common, "run_config", fake_runner(acc, calls))
    monkeypatch.setattr(
        tune, "run_jobs", lambda j, o, d: common.run_jobs(j, o, d, run=fake_runner(acc, calls))
    )
    o = opts(tmp_path, methods=["sfedhp", "fedprox", "heurfedamp", "pfedgp"])
    entry = tune.reproduce(o)
    assert entry["choices"] == {
        "fedprox": {"mu": 0.01},
        "sfedhp": {"lam": 25.0},
        "heurfedamp": {"alpha": 0.5},
        "pfedgp": {"lr": 0.1},
    }
    assert all("eval_split=val" in c and "partition.val_per_class=200" in c for c in calls)
    tuned = tmp_path / "out" / "tuned.json"
    assert json.loads(tuned.read_text())["mnist-s1"]["choices"]["sfedhp"] == {"lam": 25.0}
    md = (tmp_path / "out" / "tune.md").read_text()
    # FedProx has no personalized model: "—", not "diverged"; the diverged λ = 30 run says so.
    assert "| fedprox | mu=0.01 | global | 70.00 ← | 70.00 | — |" in md
    assert "| sfedhp | lam=30 | global | diverged | diverged | diverged |" in md
    chosen = table1.choose(opts(tmp_path, tuned=tuned))
    assert chosen["sfedhp"] == {"lam": 25.0} and chosen["pfedme"] == {"lam": 15.0}
    assert chosen["pfedgp"] == {"lr": 0.1}


def test_tuning_a_subset_keeps_the_other_methods_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--methods pfedgp`` adds pFedGP's choice to the entry; the earlier choices stay, unless
    the settings differ (then the old entry is replaced, not mixed)."""
    acc = {"sfedhp25.0": [0.95] * 3, "pfedgp0.01": [0.9] * 3}
    monkeypatch.setattr(
        tune, "run_jobs", lambda j, o, d: common.run_jobs(j, o, d, run=fake_runner(acc, []))
    )
    tuned = tmp_path / "out" / "tuned.json"
    tune.reproduce(opts(tmp_path, methods=["sfedhp"]))
    tune.reproduce(opts(tmp_path, methods=["pfedgp"], runs=tmp_path / "r2"))
    entry = json.loads(tuned.read_text())["mnist-s1"]
    assert entry["choices"] == {"sfedhp": {"lam": 25.0}, "pfedgp": {"lr": 0.01}}
    assert set(entry["scores"]) == {"sfedhp", "pfedgp"}
    tune.reproduce(opts(tmp_path, methods=["pfedgp"], rounds=3, runs=tmp_path / "r3"))
    assert json.loads(tuned.read_text())["mnist-s1"]["choices"] == {"pfedgp": {"lr": 0.01}}


def test_eval_split_val_evaluates_validation_samples() -> None:
    cfg = resolve_config(
        None,
        ["progress=false", "model.name=mlr", *TINY, "partition.val_per_class=10", "eval_split=val"],
    )
    exp = build_experiment(cfg)
    state = exp.algorithm.init_state(exp.model.init_params(0))
    row, _ = evaluate_state(exp, state)
    fed = exp.ctx.fed
    assert int(fed.val.counts.sum()) == 100
    assert row["global_acc"] == evaluate_shared(exp.model, state["global"], fed.val).accuracy


def test_lambda_sweep_table(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    o = opts(tmp_path, methods=["pfedme", "perfedavg", "pfedgp", "centralized", "local"])
    results = common.run_jobs(
        lambda_sweep.jobs(o), o, tmp_path / "r", run=fake_runner({"pfedme30.0": [0.1] * 3}, calls)
    )
    md = lambda_sweep.build_table(o, results)["markdown"]
    assert "Table II" in md and "| 52.07 | 10.41 |" in md and "56.50" in md
    assert "| Centralized (union of data) |" in md and "| Local only |" in md
    pfedgp = next(line for line in md.splitlines() if line.startswith("| pFedGP |"))
    assert "| 98.12 |" in pfedgp and "| 52.00 ± 0.00 |" in pfedgp  # paper PM and its PM
    assert len(calls) == 9


def test_figures_write_pngs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(overrides: list[str], folder: Path) -> dict[str, Any]:
        folder.mkdir(parents=True, exist_ok=True)
        hier = any(o in overrides for o in ("algorithm.name=sfedhp", "algorithm.name=hierfavg"))
        link = "edge_cloud" if hier else "client_cloud"
        lines = [
            f"round,global_acc,personal_acc,density_global,cum_bytes_{link},cum_remark1_bits_{link}"
        ]
        lines += [f"{r},0.{r},0.{r + 1},0.5,{1000 * r},{8000 * r}" for r in range(1, 4)]
        (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
        (folder / "nodes.json").write_text(json.dumps({link: {"0": {"bytes": 750}}}))
        return {"final_global_acc": 0.3}

    monkeypatch.setattr(figures, "run_jobs", lambda j, o, d: common.run_jobs(j, o, d, run=run))
    report = figures.reproduce(opts(tmp_path, methods=["fig3", "fig5"]))
    assert set(report["figures"]) == {"fig3", "fig5"}
    for fig in report["figures"].values():
        for f in fig["files"]:
            assert Path(f).stat().st_size > 1000
    runs = {r["label"]: r for r in report["figures"]["fig3"]["runs"]}
    assert runs["HierFAVG"]["node_bytes_avg"] == 750  # 3000 bytes over 4 edges
    assert runs["pFedMe"]["node_bytes_avg"] == 150  # 3000 bytes over 20 clients
    assert (tmp_path / "out" / "figures.json").is_file()


def write_cifar(root: Path, per_class: int = 10) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = np.repeat(np.arange(10), per_class).tolist()
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        (root / name).write_bytes(pickle.dumps({"data": data, "labels": labels}))


def test_cifar10_plumbing_with_fabricated_batches(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar")
    code = main(
        [
            "reproduce",
            "sfedhp-table1",
            "partition.train_per_class=10",
            "partition.test_per_class=10",
            "algorithm.local_steps=1",
            "algorithm.batch_size=2",
            "--dataset",
            "cifar10",
            "--setting",
            "2",
            "--rounds",
            "1",
            "--methods",
            "fedavg,local",
            "--data-dir",
            str(tmp_path / "cifar"),
            "--out",
            str(tmp_path / "c"),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "c" / "table.json").read_text())
    assert data["model"] == "vgg" and [r["method"] for r in data["rows"]] == ["fedavg", "local"]
    assert data["rows"][0]["paper_gm"] == [81.74, 0.17]
    config = (tmp_path / "c/runs/fedavg/seed0/config.yaml").read_text()
    assert "name: vgg" in config and "name: cifar10" in config


def test_cli_reproduce_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "nope"]) != 0
    assert "sfedhp-table1" in capsys.readouterr().err


def test_figures_report_the_zero_threshold_the_runs_use(tmp_path: Path) -> None:
    assert figures.zero_threshold(opts(tmp_path)) == figures.EPS
    o = opts(tmp_path, extra=["comm.zero_threshold=5e-4"])
    assert figures.zero_threshold(o) == 5e-4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killing_a_parallel_reproduction_leaves_no_orphan_runs(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path\n"
        "from fedhp.experiments.common import map_runs\n"
        "from tests.experiments.sleepy_run import sleepy\n"
        f"root = Path({str(tmp_path)!r})\n"
        "tasks = [(['60'], root / 'a'), (['60'], root / 'b')]\n"
        "for _ in map_runs(tasks, 2, sleepy): pass\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[2])
    pids_files = [tmp_path / "a" / "pid", tmp_path / "b" / "pid"]
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pids_files):
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in pids_files]
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    for pid in alive:
        os.kill(pid, 9)
    assert not alive, "workers outlived their killed parent"


def test_table_header_states_the_input_normalization(tmp_path: Path) -> None:
    """Every table header says which ``dataset.normalize`` its runs used (the last override)."""
    assert common.normalization_of("mnist", []) == "global"
    extra = ["dataset.normalize=unit", "dataset.normalize=per_pixel"]
    assert common.normalization_of("fmnist", extra) == "per_pixel"
    assert common.normalization_of("synthetic", extra) is None
    run = fake_runner({}, [])
    for mode in ("global", "per_pixel"):
        o = opts(tmp_path, methods=["fedavg"])
        o.extra = [f"dataset.normalize={mode}"]
        table = table1.build_table(o, common.run_jobs(table1.jobs(o), o, tmp_path / mode, run=run))
        assert f"`dataset.normalize={mode}`" in table["markdown"].split("| Method |")[0]
        assert table["normalize"] == mode


def test_table1_runs_per_fedavg_only_when_asked(tmp_path: Path) -> None:
    """Per-FedAvg is not a Table I method: the default table is unchanged; ``--methods
    perfedavg`` adds it with α = β = 0.05."""
    assert "perfedavg" not in [j.method for j in table1.jobs(opts(tmp_path))]
    jobs = table1.jobs(opts(tmp_path, methods=["perfedavg", "pfedme"]))
    assert [(j.method, j.params.get("beta")) for j in jobs] == [
        ("pfedme", None),
        ("perfedavg", 0.05),
    ]
    assert {"algorithm.alpha=0.05", "algorithm.beta=0.05"} <= set(jobs[1].overrides)


def test_an_override_of_some_methods_applies_to_those_that_read_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's ``key=value`` overrides of a reproduction go to the methods that read them
    (FedProx's μ to FedProx, not FedAvg; a run-wide option to every method), with one line
    naming the methods left out; one no method reads stays with every run, which refuses it."""
    jobs = [
        common.Job("fedavg", "fedavg", ["algorithm.name=fedavg"]),
        common.Job("fedprox", "fedprox", ["algorithm.name=fedprox"]),
    ]
    extra = ["algorithm.mu=0.5", "eval_train=false", "state_dir=/tmp/nowhere"]
    out = common.user_overrides_read(jobs, opts(tmp_path, extra=extra, quiet=False))
    assert out["fedprox"] == extra
    assert out["fedavg"] == ["eval_train=false", "state_dir=/tmp/nowhere"]
    assert "algorithm.mu is not read by fedavg; applied to the other methods" in (
        capsys.readouterr().err
    )
    sfedhp = common.Job("sfedhp", "sfedhp", ["algorithm.name=sfedhp"])
    graphs = ["device=cuda", "engine.cuda_graphs=true"]  # read where the other one is given
    out = common.user_overrides_read([*jobs, sfedhp], opts(tmp_path, extra=graphs))
    assert out == {"fedavg": ["device=cuda"], "fedprox": ["device=cuda"], "sfedhp": graphs}
