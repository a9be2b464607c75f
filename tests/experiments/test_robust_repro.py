"""``fedhp reproduce robust``: every run's configuration passes the strict checks, the rows and
attack settings of the grid, and the result lines / tables / figures (runs faked)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import fedhp.experiments.robust as robust
from fedhp.build import check_components
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.experiments import REPRODUCTIONS, common
from fedhp.experiments.common import ReproOptions

LINE = re.compile(
    r"^robust (\S+) (0|0\.[123]) (fedavg|hierfavg|fedavg-iid) (\S+) acc=([0-9.]+)( diverged)?$"
)


def grid(opts: ReproOptions) -> list[tuple[robust.Row, robust.Case]]:
    return [
        (row, case)
        for a in robust.GRID_ALGORITHMS
        for row in robust.rows_of(a)
        for case in robust.cases_of(opts, a, row.iid)
    ]


def test_every_run_passes_the_strict_checks() -> None:
    opts = ReproOptions(dataset="mnist")
    runs = grid(opts)
    # FedAvg: 6 rules × 16 settings (+ the IID control: 6 × 2); HierFAVG: 11 rows × (16 + sign
    # flip 20 % concentrated)
    assert len(runs) == 6 * 16 + 6 * 2 + 11 * 17
    for row, case in runs:
        cfg = resolve_config(None, robust.run_overrides(opts, row, case, 0))
        check_components(cfg)
        assert cfg.federation.num_clients == 100 and cfg.federation.num_edges == 10
        if row.iid:
            assert cfg.partition["name"] == "quantity" and case.attack in ("none", "sign_flip")
        else:
            assert cfg.partition["name"] == "shards" and cfg.partition["shards_per_client"] == 2
        assert cfg.rounds == 50 and cfg.federation.weighting == "uniform"
        assert cfg.faults.attack.fraction == case.fraction
        cloud, edge = cfg.robust.cloud, cfg.robust.edge
        if row.algorithm == "fedavg":
            assert cloud.name == row.rule and edge.name == "mean"
        else:
            assert edge.name == row.rule
            assert cloud.name == ("mean" if row.edge_only else row.rule)
        if row.rule == "trimmed_mean":
            assert max(robust.FRACTIONS) <= robust.BETA  # trims every attacker at 30 %
    quick = grid(ReproOptions(dataset="mnist", quick=True))
    assert {c.folder for _, c in quick} == {
        "none-0",
        "sign_flip-0.2",
        "alie-0.2",
        "sign_flip-concentrated-0.2",
    }


def test_reproduce_lines_tables_and_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_run(overrides: list[str], folder: Path) -> dict[str, Any]:
        text = " ".join(overrides)
        acc = 0.9 if "attack" not in text else 0.1 if "robust.cloud.name=mean" in text else 0.85
        stopped = {"stopped": "round 3: nan"} if "concentrated" in text else {}
        return {"final_global_acc": acc, "seconds": 0.5, **stopped}

    monkeypatch.setattr(common, "run_config", fake_run)
    assert "robust" in REPRODUCTIONS
    out = tmp_path / "out"
    code = main(["reproduce", "robust", "--quick", "--out", str(out), "--seeds", "2"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 6 * 3 + 6 * 2 + 11 * 4 and all(LINE.match(x) for x in lines), lines[:3]
    assert "robust sign_flip-concentrated 0.2 hierfavg median-edge acc=0.8500 diverged" in lines
    assert "robust sign_flip 0.2 fedavg mean acc=0.1000" in lines
    assert "robust sign_flip 0.2 fedavg-iid median acc=0.8500" in lines
    table = (out / "table.md").read_text()
    assert "### sign_flip" in table and "### alie" in table and "must-show" in table
    data = json.loads((out / "table.json").read_text())
    assert data["seeds"] == 2 and len(data["results"]) == len(lines)
    for name in ("sign_flip-fedavg.png", "sign_flip-hierfavg.png"):
        assert (out / name).stat().st_size > 0


def test_unknown_method_or_dataset_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, text in (
        (["--methods", "fedprox"], "--methods"),
        (["--dataset", "cifar10"], "--dataset"),
    ):
        assert main(["reproduce", "robust", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err


# ---------------------------------------------------------------- --heterogeneity (issue 41)

HET_LINE = re.compile(
    r"^robust-het (val|test) (iid|dir0\.5|dir0\.1|shards2) (fedavg|hierfavg) (\S+) "
    r"(none|sign_flip|alie|ipm) acc=([0-9.]+)( diverged)?$"
)


def parse(overrides: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in overrides)


def fake_het_run(overrides: list[str], folder: Path) -> dict[str, Any]:
    """Accuracies made up so that FedAvg's best worst case (Multi-Krum, s = 2, β = 0.9) costs 3
    points without attackers and cclip (τ = 1·S, β = 0.9, no buckets) is chosen; HierFAVG's
    cclip at the edges wins there; the mean collapses (below the trivial baseline) under sign
    flip; one geomed run diverges."""
    o = parse(overrides)
    alg, attack = o["algorithm.name"], o.get("faults.attack.name", "none")
    rule = o.get("robust.cloud.name", o.get("robust.edge.name", "mean"))
    momentum = float(o.get("algorithm.client_momentum", 0))
    bucket = int(o.get("robust.cloud.bucket", o.get("robust.edge.bucket", 1)))
    seed = int(o["seed"])
    clean = {"mean": 0.90, "multi_krum": 0.87, "cclip": 0.89}.get(rule, 0.80)
    hit = {"mean": 0.09, "multi_krum": 0.885, "cclip": 0.88}.get(rule, 0.60)
    if rule == "multi_krum" and not (bucket == 2 and momentum):
        hit = 0.70
    if rule == "cclip":
        tau = float(o.get("robust.cloud.tau", o.get("robust.edge.tau", 0)))
        right = {"fedavg": 0.4, "hierfavg": 0.3, "sfedhp": 0.09}[alg]
        if abs(tau - right) > 1e-9 or not momentum or bucket != 1:
            hit = 0.75
        if alg == "hierfavg" and "robust.cloud.name" in o:  # cclip at the edges only wins
            hit = 0.74
    stopped = {}
    if rule == "geomed" and attack == "ipm" and bucket == 2:
        stopped = {"stopped": "round 7: non-finite loss"}
        hit = 0.95  # its last accuracy: would win if a diverged run counted
    acc = clean if attack == "none" else hit
    if o["eval_split"] == "test":
        acc += 0.002 * (seed - 1)
    return {"final_global_acc": acc, "seconds": 0.25, **stopped}


def test_heterogeneity_grid_sizes_keys_and_checks() -> None:
    opts = ReproOptions(dataset="mnist")
    fed = robust.fedavg_configs(opts)
    # mean × 2 momenta + (median, trimmed mean, Multi-Krum, geomed + cclip × 3 τ) × 2 × 2
    assert len(fed) == 2 + 7 * 4 and len(set(fed)) == len(fed)
    assert len({c.folder for c in fed}) == len(fed)
    assert robust.het_partitions(opts) == ("iid", "dir0.5", "dir0.1", "shards2")
    assert len(robust.het_partitions(opts)) * len(fed) * len(robust.HET_ATTACKS) == 480
    hier = robust.hierfavg_configs([("cclip", 1.0), ("multi_krum", None)])
    assert len(hier) == 2 + 2 * 3 * 2 * 2 and len({c.folder for c in hier}) == len(hier)
    quick = ReproOptions(dataset="mnist", quick=True)
    assert len(robust.fedavg_configs(quick)) == 2 + 5 * 4
    assert robust.het_partitions(quick) == ("shards2",)
    assert list(robust.het_test_seeds(opts)) == [0, 1, 2]
    assert list(robust.het_test_seeds(quick)) == [0]
    # f after bucketing: the attackers (20), capped by n > 2f + 2 on the bucket rows
    assert [robust.krum_f("fedavg", "cloud", s) for s in (1, 2)] == [20, 20]
    assert [robust.krum_f("hierfavg", lvl, s) for lvl in ("edge", "cloud") for s in (1, 2)] == [
        3,
        1,
        3,
        1,
    ]
    for part in robust.het_partitions(opts):
        for cfg in fed:
            for attack in robust.HET_ATTACKS:
                if part != "shards2" and attack not in ("none", "ipm"):
                    continue  # (every partition with two attacks; the rest is the same code)
                over = robust.het_overrides(opts, "fedavg", part, cfg, attack, "val", 0)
                conf = resolve_config(None, over)
                check_components(conf)
                cloud = conf.robust.cloud
                assert cloud.name == cfg.rule and cloud.bucket == cfg.bucket
                assert conf.algorithm.get("client_momentum", 0.0) == cfg.momentum
                assert conf.eval_split == "val" and conf.rounds == 50
                assert conf.partition["val_fraction"] == 0.1
                n = -(-100 // cfg.bucket)
                if cfg.rule == "multi_krum":
                    cloud.check(n)  # the f the engine will check, on the bucket rows
                    assert cloud.f == 20 and cloud.keep(n) == n - 20
                if cfg.rule == "trimmed_mean":
                    assert cloud.beta * n == pytest.approx(20)
                if cfg.rule == "cclip":
                    assert cloud.tau == pytest.approx(0.4 * (cfg.tau or 0))
                if attack != "none":
                    assert conf.faults.attack.name == attack
                    assert conf.faults.attack.fraction == 0.2
    for cfg in hier:
        over = robust.het_overrides(opts, "hierfavg", "shards2", cfg, "alie", "test", 2)
        conf = resolve_config(None, over)
        check_components(conf)
        assert conf.eval_split == "test" and conf.seed == 2
        edge, cloud = conf.robust.edge, conf.robust.cloud
        at_edge = cfg.rule != "mean" and cfg.placement in ("edge", "both")
        at_cloud = cfg.rule != "mean" and cfg.placement in ("cloud", "both")
        assert edge.name == (cfg.rule if at_edge else "mean")
        assert cloud.name == (cfg.rule if at_cloud else "mean")
        for level, on in ((edge, at_edge), (cloud, at_cloud)):
            if on:
                n = -(-10 // cfg.bucket)
                assert level.bucket == cfg.bucket
                if cfg.rule == "multi_krum":
                    level.check(n)
        if at_edge and cfg.rule == "cclip":
            assert edge.tau == pytest.approx(0.3)
        if at_cloud and cfg.rule == "cclip":
            assert cloud.tau == pytest.approx(0.13)


def entry(acc: float, stopped: bool = False) -> dict[str, Any]:
    return {"acc": acc, "std": 0.0, "stopped": ["nan"] if stopped else [], "trivial": acc <= 0.1135}


def test_selection_needs_the_clean_condition() -> None:
    """The configuration with the best worst case (and the best mean over attacks) loses 2.5
    points without attackers: not chosen; a diverged run never wins."""
    ref = robust.REFERENCE
    best = robust.Config("multi_krum", bucket=2, momentum=0.9)
    good = robust.Config("cclip", 1.0, 1, 0.9)
    broke = robust.Config("geomed")
    table = {
        ref: (0.900, 0.09, 0.85, 0.86),
        best: (0.875, 0.89, 0.89, 0.89),
        good: (0.881, 0.80, 0.82, 0.81),
        broke: (0.900, 0.95, 0.95, 0.95),
    }
    val = {
        ("fedavg", "shards2", cfg, attack): entry(acc, stopped=(cfg == broke and attack == "alie"))
        for cfg, accs in table.items()
        for attack, acc in zip(robust.HET_ATTACKS, accs, strict=True)
    }
    ranking = robust.select("fedavg", list(table), val)
    assert [r["config"] for r in ranking] == [good, ref, broke, best]
    assert ranking[0]["eligible"] and ranking[0]["worst"] == pytest.approx(0.80)
    assert not ranking[-1]["eligible"] and ranking[-1]["worst"] == pytest.approx(0.89)
    assert ranking[2]["worst"] == 0.0  # the diverged ALIE run counts as 0
    # exactly 2 points below is still within 2 points
    val[("fedavg", "shards2", best, "none")] = entry(0.880)
    assert robust.select("fedavg", list(table), val)[0]["config"] == best
    assert robust.best_families(ranking, 2) == [("cclip", 1.0), ("geomed", None)]


def record_fake_het_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], Path]]:
    """Replace every run with :func:`fake_het_run`; the list of (overrides, folder) it fills."""
    calls: list[tuple[list[str], Path]] = []

    def fake(overrides: list[str], folder: Path) -> dict[str, Any]:
        calls.append((overrides, folder))
        return fake_het_run(overrides, folder)

    monkeypatch.setattr(common, "run_config", fake)
    return calls


def het_main(args: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["reproduce", "robust", "--heterogeneity", "--out", str(out), *args]) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_heterogeneity_full_with_fake_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = record_fake_het_runs(monkeypatch)
    out = tmp_path / "out"
    lines = het_main([], out, capsys)
    # FedAvg 4 partitions × 30 × 4 attacks; HierFAVG (2 + 2 rules × 12) × 4; test 2 × 2 × 4 × 3
    assert len(calls) == 480 + 104 + 48 == len({folder for _, folder in calls})
    over = [parse(o) for o, _ in calls]
    assert sum(o["eval_split"] == "test" for o in over) == 48
    assert {o["seed"] for o in over if o["eval_split"] == "val"} == {"0"}
    hier_val = [o for o in over if o["algorithm.name"] == "hierfavg" and o["eval_split"] == "val"]
    assert len(hier_val) == 104
    # the second stage: FedAvg's two best rules (cclip with its τ, then Multi-Krum), at the
    # edges, the cloud and both
    rules = {(o.get("robust.edge.name"), o.get("robust.cloud.name")) for o in hier_val}
    assert rules == {
        (None, None),
        ("cclip", None),
        (None, "cclip"),
        ("cclip", "cclip"),
        ("multi_krum", None),
        (None, "multi_krum"),
        ("multi_krum", "multi_krum"),
    }
    assert {o.get("robust.edge.tau") for o in hier_val} == {None, "0.3"}
    assert all(o["partition.name"] == "shards" for o in hier_val)
    assert "robust-het chosen fedavg cclip-t1-s1-m0.9" in lines
    assert "robust-het chosen hierfavg cclip-t1-s1-m0.9-edge" in lines
    results = [x for x in lines if not x.startswith("robust-het chosen")]
    assert all(HET_LINE.match(x) for x in results), [x for x in results if not HET_LINE.match(x)]
    assert len(results) == (480 + 104) + 48 // 3
    assert "robust-het val shards2 fedavg geomed-s2-m0 ipm acc=0.9500 diverged" in lines
    data = json.loads((out / "table.json").read_text())
    assert data["chosen"]["fedavg"]["label"] == "cclip τ=1S β=0.9"
    assert data["test_seeds"] == 3 and data["rounds"] == 50
    assert data["must_show"]["fedavg"]["holds"] is True  # 88 % under attack, 90 % clean mean
    gaps = data["must_show"]["fedavg"]["gaps"]
    assert gaps["ipm"] == pytest.approx(-0.02) and gaps["none"] == pytest.approx(-0.01)
    assert data["levels"]["fedavg-cloud-s2"] == {"rows": 50, "f": 20, "tau": [0.1, 0.4, 1.0]}
    assert data["levels"]["hierfavg-edge-s2"]["f"] == 1
    fed_rank = data["selection"]["fedavg"]
    mk = next(r for r in fed_rank if r["config"]["label"] == "multi_krum s=2 β=0.9")
    assert mk["worst"] > fed_rank[0]["worst"] and not mk["eligible"]
    flagged = [r for r in data["results"] if r["trivial"]]
    assert {(r["config"]["rule"], r["attack"]) for r in flagged} == {
        ("mean", a) for a in ("sign_flip", "alie", "ipm")
    }
    table = (out / "table.md").read_text()
    for title in ("core grid", "the selection", "Rule parameters", "on the test set"):
        assert title in table
    assert "9.00 ▼" in table and "| **cclip τ=1S β=0.9** |" in table
    assert "95.00 †" in table
    assert (out / "heterogeneity.png").stat().st_size > 0
    # --methods fedavg: FedAvg's grid and its test runs only (no HierFAVG stage)
    calls.clear()
    het_main(["--methods", "fedavg"], tmp_path / "again", capsys)
    assert len(calls) == 480 + 2 * 4 * 3


def test_heterogeneity_quick_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []

    def fake(overrides: list[str], folder: Path) -> dict[str, Any]:
        calls.append(overrides)
        return fake_het_run(overrides, folder)

    monkeypatch.setattr(common, "run_config", fake)
    lines = het_main(["--quick"], tmp_path / "q", capsys)
    over = [parse(o) for o in calls]
    # FedAvg 22 configurations × 4 attacks on 2 shards; HierFAVG (2 + 1 rule × 12) × 4; test
    # 2 algorithms × (chosen + mean) × 4 attacks × 1 seed
    assert len(calls) == 88 + 56 + 16
    assert {o["rounds"] for o in over} == {"10"}
    assert {o["partition.name"] for o in over} == {"shards"}
    assert {o["robust.cloud.tau"] for o in over if "robust.cloud.tau" in o} <= {"0.4", "0.13"}
    assert "robust-het chosen fedavg cclip-t1-s1-m0.9" in lines


def test_heterogeneity_bad_options_are_one_line_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, text in (
        (["reproduce", "dp", "--heterogeneity"], "--heterogeneity"),
        (["reproduce", "robust", "--heterogeneity", "--methods", "hierfavg"], "--methods"),
        (["reproduce", "robust", "--heterogeneity", "--methods", "hierfavg,sfedhp"], "--methods"),
        (["reproduce", "robust", "--methods", "sfedhp"], "--methods"),
        (["reproduce", "robust", "--heterogeneity", "--dataset", "cifar10"], "--dataset"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err


def test_heterogeneity_tiny_real_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real runs through the CLI, the grid cut to the mean (± momentum) and the median on
    buckets of 2 with client momentum (2 rounds; 12 validation and at most 8 test runs)."""
    monkeypatch.setattr(robust, "HET_RULES", ("mean", "median"))
    monkeypatch.setattr(robust, "BUCKETS", (2,))
    monkeypatch.setattr(robust, "MOMENTA", (0.9,))
    out = tmp_path / "tiny"
    argv = ["--quick", "--rounds", "2", "--methods", "fedavg", "--eval-every", "2"]
    lines = het_main(argv, out, capsys)
    assert sum(x.startswith("robust-het val") for x in lines) == 12
    chosen = [x for x in lines if x.startswith("robust-het chosen fedavg")]
    assert len(chosen) == 1
    data = json.loads((out / "table.json").read_text())
    accs = [r["acc"] for r in data["results"]]
    assert len(accs) in (16, 20) and all(0.0 < a <= 1.0 for a in accs)
    summary = json.loads(
        (out / "runs/fedavg/val/shards2/median-s2-m0.9/ipm/seed0/summary.json").read_text()
    )
    config = (out / "runs/fedavg/val/shards2/median-s2-m0.9/ipm/seed0/config.yaml").read_text()
    assert summary["rounds"] == 2 and "eval_split: val" in config and "bucket: 2" in config
    assert (out / "heterogeneity.png").stat().st_size > 0


# ---------------------------------------------------------------- sFedHP's hierarchy stage

ROBUSTNESS_DOC = Path(__file__).resolve().parents[2] / "docs" / "robustness.md"


def test_sfedhp_stage_configurations_and_overrides() -> None:
    """sFedHP's candidates (the mean, then cclip τ = 1·S and geomed at the edges, the cloud and
    both × buckets), its options and cclip's τ per level are what docs/robustness.md says, and
    every run passes the strict checks (cclip is centred at either level: sFedHP keeps it)."""
    opts = ReproOptions(dataset="mnist")
    configs = robust.sfedhp_configs(list(robust.SFEDHP_FAMILIES))
    assert len(configs) == 1 + 2 * 3 * 2 and len({c.folder for c in configs}) == len(configs)
    assert configs[0] == robust.REFERENCE and not any(c.momentum for c in configs)
    assert robust.SFEDHP_FAMILIES == (("cclip", 1.0), ("geomed", None))
    doc = ROBUSTNESS_DOC.read_text()
    options = " ".join(robust.algorithm_overrides("sfedhp"))
    assert options == (
        "algorithm.name=sfedhp algorithm.R=10 algorithm.K=1 algorithm.lam=5 "
        "algorithm.edge_lr=0.4 algorithm.beta=1"
    )
    assert f"`{options}`" in doc
    assert robust.LEVELS[("sfedhp", "edge")][1] == 0.09
    assert robust.LEVELS[("sfedhp", "cloud")][1] == 0.12
    assert "S = 0.09 at the edges" in doc and "0.12 at the cloud" in doc
    for cfg in configs:
        for attack in robust.HET_ATTACKS:
            over = robust.het_overrides(opts, "sfedhp", "shards2", cfg, attack, "val", 0)
            conf = resolve_config(None, over)
            check_components(conf)
            algo = conf.algorithm
            assert (algo["R"], algo["K"], algo["lam"], algo["edge_lr"]) == (10, 1, 5.0, 0.4)
            assert conf.partition["shards_per_client"] == 2 and conf.eval_split == "val"
            edge, cloud = conf.robust.edge, conf.robust.cloud
            at_edge = cfg.rule != "mean" and cfg.placement in ("edge", "both")
            at_cloud = cfg.rule != "mean" and cfg.placement in ("cloud", "both")
            assert edge.name == (cfg.rule if at_edge else "mean")
            assert cloud.name == (cfg.rule if at_cloud else "mean")
            if at_edge:
                assert edge.bucket == cfg.bucket
            if at_cloud:
                assert cloud.bucket == cfg.bucket
            if at_edge and cfg.rule == "cclip":
                assert edge.tau == pytest.approx(0.09)
            if at_cloud and cfg.rule == "cclip":
                assert cloud.tau == pytest.approx(0.12)
            if attack != "none":
                assert conf.faults.attack.name == attack
                assert conf.faults.attack.fraction == 0.2


def test_sfedhp_stage_alone_and_with_the_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--methods sfedhp``: sFedHP's stage alone (13 candidates × 4 attacks on validation, the
    chosen one and the mean × 4 × 3 seeds on test) in its own folder; with FedAvg's grid, its
    candidates are FedAvg's best rules (as HierFAVG's), and FedAvg's and HierFAVG's runs are
    those without it."""
    calls: list[list[str]] = []

    def fake(overrides: list[str], folder: Path) -> dict[str, Any]:
        calls.append(overrides)
        return fake_het_run(overrides, folder)

    monkeypatch.setattr(common, "run_config", fake)
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "robust", "--heterogeneity", "--methods", "sfedhp"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(calls) == 13 * 4 + 2 * 4 * 3
    over = [parse(o) for o in calls]
    assert {o["algorithm.name"] for o in over} == {"sfedhp"}
    rules = {(o.get("robust.edge.name"), o.get("robust.cloud.name")) for o in over}
    assert rules == {
        (None, None),
        *((r, None) for r in ("cclip", "geomed")),
        *((None, r) for r in ("cclip", "geomed")),
        *((r, r) for r in ("cclip", "geomed")),
    }
    assert {o.get("robust.edge.tau") for o in over} == {None, "0.09"}
    assert {o.get("robust.cloud.tau") for o in over} == {None, "0.12"}
    assert not any("algorithm.client_momentum" in o for o in over)
    assert "robust-het chosen sfedhp cclip-t1-s1-m0-edge" in lines
    out = tmp_path / "runs/reproduce/robust-heterogeneity-sfedhp-mnist-full"
    data = json.loads((out / "table.json").read_text())
    assert list(data["chosen"]) == ["sfedhp"] and data["test_seeds"] == 3
    level = data["levels"]["sfedhp-edge-s1"]
    assert level["rows"] == 10 and level["f"] == 3
    assert level["tau"] == pytest.approx([0.0225, 0.09, 0.225])
    table = (out / "table.md").read_text()
    assert "### sFedHP: the selection" in table and "core grid" not in table
    assert "R = 10 local rounds of K = 1" in table and "9.00 ▼" in table
    assert not (out / "heterogeneity.png").exists()  # (its left panel is FedAvg's grid)
    # with FedAvg's grid and HierFAVG: the same FedAvg / HierFAVG runs, sFedHP's from the ranking
    calls.clear()
    het_main(["--methods", "sfedhp,fedavg,hierfavg"], tmp_path / "all", capsys)
    assert len(calls) == 480 + 104 + 52 + 3 * 2 * 4 * 3
    sf = [parse(o) for o in calls if "algorithm.name=sfedhp" in o]
    assert {o.get("robust.edge.name") for o in sf} == {None, "cclip", "multi_krum"}
    data = json.loads((tmp_path / "all" / "table.json").read_text())
    assert list(data["chosen"]) == ["fedavg", "hierfavg", "sfedhp"]
    assert data["chosen"]["hierfavg"]["label"] == "cclip τ=1S β=0.9 @edge"


SFEDHP_TINY = [
    "algorithm.name=sfedhp",
    "algorithm.R=2",
    "algorithm.K=1",
    "algorithm.lam=5",
    "algorithm.edge_lr=0.4",
    "federation.num_edges=2",
    "rounds=2",
]


def sfedhp_run(out: Path, *overrides: str) -> dict[str, torch.Tensor]:
    from fedhp.build import build_experiment
    from fedhp.engine.runner import run_experiment
    from fedhp.unread import read_overrides
    from tests.engine.test_robust_runs import TINY

    given = [*read_overrides(TINY, [*SFEDHP_TINY, *overrides]), *SFEDHP_TINY, *overrides]
    run_experiment(build_experiment(resolve_config(None, given)), out)
    state: dict[str, torch.Tensor] = torch.load(out / "final_state.pt", weights_only=True)["state"]
    return state


def test_sfedhp_rules_change_the_aggregate(tmp_path: Path) -> None:
    """Real tiny sFedHP runs (2 edges, 2 rounds of R = 2): cclip with a tiny τ at the edges or
    at the cloud changes the global model, and bounds the steps it aggregates: each aggregate
    moves at most L·τ past the previous one's update (its centre, kept in the state), so the
    edges' last centres are within 2·2·3·τ (4 aggregations) and the cloud's within 2·3·τ, and
    beyond 3·τ (the centre is used)."""
    from fedhp.engine.uplink import CENTRE_KEYS

    tau = 1e-3
    mean = sfedhp_run(tmp_path / "mean")
    assert not any(k in mean for k in CENTRE_KEYS.values())  # no centres without cclip
    edge = sfedhp_run(tmp_path / "edge", "robust.edge.name=cclip", f"robust.edge.tau={tau}")
    cloud = sfedhp_run(tmp_path / "cloud", "robust.cloud.name=cclip", f"robust.cloud.tau={tau}")
    geomed = sfedhp_run(tmp_path / "geomed", "robust.edge.name=geomed")
    for other in (edge, cloud, geomed):
        assert (other["global"] - mean["global"]).norm() > 10 * tau
    centres = edge[CENTRE_KEYS["edge"]]
    assert centres.shape == (2, mean["global"].numel()) and CENTRE_KEYS["cloud"] not in edge
    # beyond L·τ = 3τ: each aggregate starts from the previous one's update (a rule measuring
    # from 0, or a centre not kept, stays within 3τ)
    norms = centres.norm(dim=1)
    assert bool((norms > 3 * tau * 1.01).all()) and bool((norms <= 4 * 3 * tau * 1.0001).all())
    moved = cloud[CENTRE_KEYS["cloud"]].norm()
    assert 3 * tau * 1.01 < moved <= 2 * 3 * tau * 1.0001 and CENTRE_KEYS["edge"] not in cloud


def test_sfedhp_centres_resume_bit_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sFedHP under IPM with cclip at both levels, killed before round 3 and resumed: the same
    results and checkpoint as the run that was never stopped (the centres are state)."""
    from fedhp.build import build_experiment
    from fedhp.unread import read_overrides
    from tests.engine.test_checkpoint import FAST, kill_before_round, same_results
    from tests.engine.test_checkpoint import run as checkpoint_run

    args = [
        *SFEDHP_TINY[:-1],  # (FAST's 6 rounds, a checkpoint every 2)
        "faults.attack.name=ipm",
        "faults.attack.fraction=0.2",
        "robust.edge.name=cclip",
        "robust.edge.tau=0.05",
        "robust.cloud.name=cclip",
        "robust.cloud.tau=0.05",
        "threads=1",
    ]
    ref = tmp_path / "ref"
    checkpoint_run(ref, *args)
    out = tmp_path / "killed"
    exp = build_experiment(resolve_config(None, [*read_overrides(FAST, args), *args]))
    kill_before_round(exp, out, 3, monkeypatch)
    torch.manual_seed(12345)
    checkpoint_run(out, *args, resume=True)
    same_results(ref, out)


# ------------------------------------------- --heterogeneity --later-rows (issue 41, deliverable 4)

CHOSEN = {
    "fedavg": robust.Config("cclip", 1.0, 1, 0.9),
    "hierfavg": robust.Config("cclip", 1.0, 1, 0.0, "both"),
    "sfedhp": robust.Config("cclip", 1.0, 1, 0.0, "both"),
}


def test_later_rows_cells_and_overrides() -> None:
    """The later rows as the docs say: label flip at 20 %, the core attacks at 10 %, the chosen
    configuration with buckets of 5 (not the mean), the DNN with its own S; every run passes the
    strict checks."""
    opts = ReproOptions(dataset="mnist")
    groups = robust.later_groups(opts)
    assert [(g.name, g.attacks, g.fraction, g.bucket, g.model) for g in groups] == [
        ("label_flip", ("label_flip",), 0.2, None, None),
        ("f0.1", ("sign_flip", "alie", "ipm"), 0.1, None, None),
        ("s5", robust.HET_ATTACKS, 0.2, 5, None),
        ("dnn", robust.HET_ATTACKS, 0.2, None, "dnn"),
    ]
    # --model dnn: the DNN group would repeat the run's own model
    assert [g.name for g in robust.later_groups(ReproOptions(model="dnn"))][-1] == "s5"
    algs = list(CHOSEN)
    sizes = {g.name: len(robust.later_cells(g, algs, CHOSEN)) for g in groups}
    assert sizes == {"label_flip": 6, "f0.1": 6, "s5": 3, "dnn": 6}
    s5 = robust.later_cells(groups[2], algs, CHOSEN)
    assert all(c.bucket == 5 and c.rule == "cclip" for _, _, c in s5)
    # the mean chosen: no bucketed rerun (buckets of equal size average to the mean)
    assert robust.later_cells(groups[2], ["fedavg"], {"fedavg": robust.REFERENCE}) == []
    for group in groups:
        seen = robust.later_opts(opts, group)
        for alg, part, cfg in robust.later_cells(group, algs, CHOSEN):
            for attack in group.attacks:
                over = robust.het_overrides(seen, alg, part, cfg, attack, "test", 1, group.fraction)
                conf = resolve_config(None, over)
                check_components(conf)
                assert conf.eval_split == "test" and conf.seed == 1 and conf.rounds == 50
                assert conf.partition["name"] == "shards"
                assert conf.model["name"] == ("dnn" if group.model else "mlr")
                if attack == "none":
                    assert conf.faults.attack.name == "none"
                else:
                    assert conf.faults.attack.name == attack
                    assert conf.faults.attack.fraction == group.fraction
                for level in cfg.levels(alg) if cfg.rule != "mean" else []:
                    rule = getattr(conf.robust, level)
                    assert rule.name == "cclip" and rule.bucket == (group.bucket or 1)
                    s = (
                        robust.DNN_S if group.model else {k: v[1] for k, v in robust.LEVELS.items()}
                    )[(alg, level)]
                    assert rule.tau == pytest.approx(s)
    assert robust.DNN_S[("hierfavg", "edge")] != robust.LEVELS[("hierfavg", "edge")][1]


def test_later_rows_fraction_sets_krum_f_and_trimming() -> None:
    """At 10 % Multi-Krum's f and the trimmed mean's share follow the 10 attackers (FedAvg), the
    cap n > 2f + 2 still binds at HierFAVG's 10 rows; buckets of 5 leave 2 rows at an edge, too
    few for Multi-Krum: a one-line ConfigError, not a run."""
    assert [robust.krum_f("fedavg", "cloud", s, 0.1) for s in (1, 2, 5)] == [10, 10, 8]
    assert [robust.krum_f("fedavg", "cloud", s) for s in (1, 2, 5)] == [20, 20, 8]
    assert [robust.krum_f("hierfavg", "edge", s, 0.1) for s in (1, 2)] == [3, 1]
    opts = ReproOptions(dataset="mnist")
    for rule in ("multi_krum", "trimmed_mean"):
        over = robust.het_overrides(
            opts, "fedavg", "shards2", robust.Config(rule), "ipm", "test", 0, 0.1
        )
        conf = resolve_config(None, over)
        check_components(conf)
        if rule == "multi_krum":
            assert conf.robust.cloud.f == 10 and conf.robust.cloud.keep(100) == 90
        else:
            assert conf.robust.cloud.beta == pytest.approx(0.1)
    assert (
        parse(
            robust.het_overrides(
                opts, "fedavg", "shards2", robust.Config("multi_krum"), "ipm", "test", 0
            )
        )["robust.cloud.f"]
        == "20"
    )
    bad = robust.Config("multi_krum", bucket=5, placement="both")
    with pytest.raises(robust.ConfigError, match="buckets of 5") as err:
        robust.het_overrides(opts, "hierfavg", "shards2", bad, "none", "test", 0, 0.1)
    assert "\n" not in str(err.value)


def test_later_rows_bad_option_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "robust", "--later-rows"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--later-rows" in err


LATER_LINE = re.compile(
    r"^robust-het test shards2(-dnn)? (fedavg|hierfavg) (\S+) "
    r"(none|sign_flip|alie|ipm|label_flip)(-f0\.1)? acc=([0-9.]+)( diverged)?$"
)


def test_later_rows_with_fake_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = record_fake_het_runs(monkeypatch)
    out = tmp_path / "out"
    lines = het_main(["--later-rows"], out, capsys)
    # label flip 2 × 2 × 3 seeds; 10 %: 2 × 2 × 3 attacks × 3; s = 5: 2 × 4 × 3; DNN 2 × 2 × 4 × 3
    later = 12 + 36 + 24 + 48
    assert len(calls) == 480 + 104 + 48 + later == len({folder for _, folder in calls})
    over = [parse(o) for o, _ in calls[-later:]]
    assert all(o["eval_split"] == "test" for o in over)
    assert sum(o.get("faults.attack.fraction") == "0.1" for o in over) == 36
    assert sum(o.get("faults.attack.name") == "label_flip" for o in over) == 12
    # (HierFAVG's chosen here: cclip at the edges)
    assert sum(o.get("robust.cloud.bucket", o.get("robust.edge.bucket")) == "5" for o in over) == 24
    dnn = [o for o in over if o["model.name"] == "dnn"]
    assert len(dnn) == 48 and {o.get("robust.edge.tau") for o in dnn} == {None, "0.31"}
    later_lines = [x for x in lines if x.startswith("robust-het test") and LATER_LINE.match(x)]
    assert "robust-het test shards2 fedavg cclip-t1-s1-m0.9 ipm-f0.1 acc=0.8800" in lines
    assert "robust-het test shards2-dnn fedavg mean-s1-m0 sign_flip acc=0.0900" in lines
    assert len(later_lines) >= later // 3
    data = json.loads((out / "table.json").read_text())
    rows = data["later"]
    assert len(rows) == later // 3 and data["later_seconds"] == pytest.approx(later * 0.25)
    assert {(r["group"], r["fraction"], r["model"]) for r in rows} == {
        ("label_flip", 0.2, "mlr"),
        ("f0.1", 0.1, "mlr"),
        ("s5", 0.2, "mlr"),
        ("dnn", 0.2, "dnn"),
    }
    flagged = {(r["group"], r["config"]["rule"], r["attack"]) for r in rows if r["trivial"]}
    assert ("dnn", "mean", "sign_flip") in flagged and ("f0.1", "mean", "alie") in flagged
    table = (out / "table.md").read_text()
    assert "### FedAvg: the later rows" in table and "### HierFAVG: the later rows" in table
    # chosen 88 % under label flip: 1 point below its own attack-free 89 %, 2 below the mean's 90
    assert re.search(
        r"\| label flip 20 % \| 88\.00 ± 0\.\d\d \| 9\.00 ± 0\.\d\d ▼ \| -1\.00 \| -2\.00 \|", table
    )
    # s = 5: the mean's column is the test stage's plain mean (the same runs)
    assert re.search(r"\| s = 5: sign flip 20 % \| 75\.00 ± 0\.\d\d \| 9\.00 ± 0\.\d\d ▼ \|", table)
    assert "DNN 784-100-10: attack-free" in table
    # without --later-rows the stage does not run
    calls.clear()
    het_main([], tmp_path / "again", capsys)
    assert len(calls) == 480 + 104 + 48
    assert "later" not in json.loads((tmp_path / "again" / "table.json").read_text())


def test_later_rows_run_that_diverged_before_evaluating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped on non-finite values returns a summary without an accuracy: the one left
    in its folder is read (seed 0); one that never evaluated (seed 1) makes the cell n/a, flagged
    ▼ † (its non-finite model predicts one class), never a crash."""

    def fake(overrides: list[str], folder: Path) -> dict[str, Any]:
        folder.mkdir(parents=True, exist_ok=True)
        stopped = {"stopped": "round 8: sfedhp diverged", "seconds": 1.0}
        if parse(overrides)["seed"] == "0":
            (folder / "summary.json").write_text(json.dumps({**stopped, "final_global_acc": 0.2}))
        return stopped

    monkeypatch.setattr(common, "run_config", fake)
    cells = [("sfedhp", "shards2", robust.REFERENCE)]
    key = ("sfedhp", "shards2", robust.REFERENCE, "sign_flip")
    opts = ReproOptions(dataset="mnist")
    one = robust.run_cells(opts, tmp_path, cells, "test", range(1), ("sign_flip",))[key]
    assert one["acc"] == pytest.approx(0.2) and not one["trivial"] and one["stopped"]
    assert robust.cell(one) == "20.00 †"
    two = robust.run_cells(opts, tmp_path, cells, "test", range(2), ("sign_flip",))[key]
    assert two["trivial"] and robust.cell(two, spread=True) == "n/a ▼ †"
    assert robust.gap(two, one) == "—" and robust.gap(one, one) == "+0.00"
