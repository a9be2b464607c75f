"""``fedhp reproduce fedlps-table1`` / ``fedlps-ablation``: every row's configuration, the result
lines, the FLOPs of dense and sparse rows and the table, end to end on an MNIST subset (one
round)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.experiments import fedlps
from fedhp.experiments.common import ReproOptions

LINE = re.compile(r"^fedlps (\S+) (\S+) acc=([0-9.]+) flops=(\S+) sim_time_s=(\S+)$")
CNN_FORWARD_FLOPS = 2 * (10 * 25 * 24 * 24 + 20 * 10 * 25 * 8 * 8 + 320 * 50 + 50 * 10)


def test_every_row_resolves_to_the_paper_setup() -> None:
    opts = ReproOptions(dataset="mnist")
    for method in (*fedlps.TABLE1, *fedlps.TABLE1_EXTRA, *fedlps.ABLATION):
        cfg = resolve_config(None, fedlps.run_overrides(opts, method, 0))
        algo = cfg.algorithm
        assert cfg.federation.num_clients == 100 and cfg.federation.client_fraction == 0.1
        assert cfg.rounds == 100 and cfg.partition["name"] == "shards"
        assert cfg.subsample.train == 20_000  # 100 clients × 2 shards of 100 images
        assert algo.get("lr", 0.1) == 0.1 and algo["batch_size"] == 20  # (perfedavg: no lr)
        assert ("lr" in algo) == (method != "perfedavg")  # (its steps: alpha and beta)
        if method == "perfedavg":
            assert algo["local_steps"] == 5 * 9  # 5 epochs of 180 samples in batches of 20
        else:
            assert algo["local_epochs"] == 5
        if method in fedlps.DENSE:  # FedLPS's device model on the dense rows too (Dyn)
            assert algo["capabilities"] == "dyn"
    assert resolve_config(None, fedlps.run_overrides(opts, "fedlps-mu0", 0)).algorithm["mu"] == 0
    code = resolve_config(None, fedlps.run_overrides(opts, "fedlps-code", 0)).algorithm
    assert code["mu"] == 0 and code["score_init"] == "ordered" and code["ste"] is False
    assert not code.get("score_reset", False)
    reset = resolve_config(None, fedlps.run_overrides(opts, "fedlps-code-reset", 0)).algorithm
    assert {k: reset[k] for k in ("mu", "score_init", "ste", "score_reset")} == {
        "mu": 0,
        "score_init": "ordered",
        "ste": False,
        "score_reset": True,
    }
    authors = resolve_config(None, fedlps.run_overrides(opts, "fedlps-authors", 0)).algorithm
    assert {k: authors[k] for k in ("mu", "ste", "arms_low", "personal_keep_above")} == {
        "mu": 0,
        "ste": False,
        "arms_low": 0.5,
        "personal_keep_above": 0.25,
    }
    flst = resolve_config(None, fedlps.run_overrides(opts, "flst", 0)).algorithm
    assert flst["ratio"] == "fixed" and flst["fixed_ratio"] == 0.5


def test_end_to_end_lines_flops_and_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # 20,000 training images: 200 per client, 180 after the validation carve-out (9 batches)
    code = main(
        [
            "reproduce",
            "fedlps-table1",
            "subsample.test=2000",
            "--quick",
            "--rounds",
            "1",
            "--methods",
            "fedavg,ditto,heterofl",
            "--out",
            str(tmp_path / "t1"),
        ]
    )
    assert code == 0
    lines = [LINE.match(x) for x in capsys.readouterr().out.splitlines() if x.startswith("fedlps")]
    rows = {m.group(2): m for m in lines if m}
    assert set(rows) == {"fedavg", "ditto", "heterofl"}
    assert all(float(rows[m].group(5)) > 0 for m in rows)  # every row: simulated time
    table = json.loads((tmp_path / "t1" / "table.json").read_text())
    flops = {r["method"]: r["flops"]["mean"] for r in table["rows"]}
    assert float(rows["fedavg"].group(4)) == pytest.approx(flops["fedavg"], rel=1e-3)
    samples = 10 * 180  # ten clients, one epoch
    assert flops["fedavg"] == 3 * CNN_FORWARD_FLOPS * samples  # from fedavg's metrics.csv
    assert flops["ditto"] == 2 * flops["fedavg"]
    fedavg = next(r for r in table["rows"] if r["method"] == "fedavg")
    last = fedlps.read_metrics(Path(fedavg["folders"][0]))[-1]
    assert fedavg["sim_time_s"]["mean"] == float(last["sim_time_s"]) > 0
    assert fedlps.time_to_accuracy(Path(fedavg["folders"][0]), 0.0) == float(last["sim_time_s"])
    assert 0 < flops["heterofl"] < flops["fedavg"]  # sub-models of width z ≤ 1
    heterofl = next(r for r in table["rows"] if r["method"] == "heterofl")
    assert heterofl["paper_acc"] == pytest.approx(0.9076) and heterofl[
        "paper_flops"
    ] == pytest.approx(1.1e12)
    curve = fedlps.personal_curve(Path(heterofl["folders"][0]))
    assert heterofl["acc"]["mean"] == curve[-1][1]
    assert "| HeteroFL |" in (tmp_path / "t1" / "table.md").read_text()
    assert (tmp_path / "t1" / "acc.png").stat().st_size > 0


def test_unknown_method_is_one_line(capsys: pytest.CaptureFixture) -> None:
    assert main(["reproduce", "fedlps-ablation", "--methods", "fedavg"]) == 2
    assert "--methods: unknown 'fedavg'" in capsys.readouterr().err


def test_cifar10_rows_use_the_papers_cifar_setup_and_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """CIFAR-10: 50 clients, VGG-11 (no BatchNorm), the paper's CIFAR-10 column beside the rows,
    a 70 % TTA target; end to end on fabricated python batches with a narrow VGG."""
    from tests.experiments.test_reproduce import write_cifar

    cfg = resolve_config(None, fedlps.run_overrides(ReproOptions(dataset="cifar10"), "fedavg", 0))
    assert cfg.federation.num_clients == 50 and cfg.federation.client_fraction == 0.2
    assert cfg.model["name"] == "vgg" and cfg.model["cfg"] == "vgg11"
    assert cfg.subsample.train == 50_000  # 50 clients × 2 shards of 500: the whole training set

    write_cifar(tmp_path / "cifar", per_class=20)  # 1,000 training and 200 test images
    code = main(
        [
            "reproduce",
            "fedlps-table1",
            "subsample.train=1000",
            "model.cfg=[4,M,8,M]",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path / "cifar"),
            "--quick",
            "--rounds",
            "1",
            "--methods",
            "fedavg,fedlps",
            "--out",
            str(tmp_path / "c"),
        ]
    )
    assert code == 0
    lines = [LINE.match(x) for x in capsys.readouterr().out.splitlines() if x.startswith("fedlps")]
    assert {m.group(2) for m in lines if m} == {"fedavg", "fedlps"}
    table = json.loads((tmp_path / "c" / "table.json").read_text())
    rows = {r["method"]: r for r in table["rows"]}
    assert rows["fedlps"]["paper_acc"] == pytest.approx(0.8743)
    assert rows["fedavg"]["paper_flops"] == pytest.approx(825.4e12)
    assert rows["fedavg"]["flops"]["mean"] > 0 and rows["fedlps"]["flops"]["mean"] > 0
    assert "TTA 70% s" in (tmp_path / "c" / "table.md").read_text()
    assert "50 clients" in table["description"]


def test_a_dataset_without_paper_numbers_shows_none() -> None:
    """Fashion-MNIST runs the MNIST setup; the paper has no Fashion-MNIST column."""
    opts = ReproOptions(dataset="fmnist")
    assert resolve_config(None, fedlps.run_overrides(opts, "fedavg", 0)).model["name"] == "cnn2"
    assert fedlps.PAPER.get("fmnist") is None


def test_density_breakdown_groups_clients_by_their_personal_models_density(
    tmp_path: Path,
) -> None:
    """Client 0: 1 of 10 entries non-zero (0.1), client 1: 5 (0.5), client 2: 10 (1.0); the
    final round's accuracies are averaged within each density bin."""
    import torch

    personal = torch.zeros(3, 10)
    personal[0, :1], personal[1, :5], personal[2] = 1.0, 2.0, 3.0
    torch.save({"state": {"personal": personal}}, tmp_path / "final_state.pt")
    (tmp_path / "per_client.csv").write_text(
        "round,client,edge,global_acc,personal_acc\n"
        "1,0,0,0.1,0.1\n1,1,0,0.1,0.1\n1,2,0,0.1,0.1\n"
        "2,0,0,0.5,0.6\n2,1,0,0.5,0.7\n2,2,0,0.5,0.9\n"
    )
    bins = fedlps.density_breakdown(tmp_path)
    assert bins == [
        {"low": 0.1, "high": 0.2, "clients": 1, "acc": 0.6},
        {"low": 0.35, "high": 0.6, "clients": 1, "acc": 0.7},
        {"low": 0.6, "high": 1.0, "clients": 1, "acc": 0.9},
    ]
    rows = [{"label": "FedLPS", "density": bins}]
    assert "| FedLPS | [0.60, 1.00] | 1 | 0.9000 |" in fedlps.density_markdown(rows)
    # under personal_keep_above, a client holding no personal model counts with the global one
    has = torch.tensor([[1.0], [0.0], [1.0]])
    state = {"personal": personal, "has_personal": has, "global": torch.ones(10)}
    torch.save({"state": state}, tmp_path / "final_state.pt")
    assert fedlps.density_breakdown(tmp_path) == [
        {"low": 0.1, "high": 0.2, "clients": 1, "acc": 0.6},
        {"low": 0.6, "high": 1.0, "clients": 2, "acc": 0.8},
    ]
    torch.save({"state": {"global": personal[0]}}, tmp_path / "final_state.pt")
    assert fedlps.density_breakdown(tmp_path) is None
