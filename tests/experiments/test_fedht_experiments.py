"""The fedht-* reproductions: γ/K choice, rounds and simulated time to target, the printed lines
and figures (a short noiseless run), and the CLI's one-line errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from fedhp.cli import main
from fedhp.experiments import fedht
from fedhp.experiments.common import ReproOptions


def grid(values: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """method -> γ -> objectives for K = 3, 5 (DIHT: K = 1)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method, by_gamma in values.items():
        ks = ["1"] if method == "diht" else ["3", "5"]
        out[method] = {g: dict(zip(ks, v, strict=True)) for g, v in by_gamma.items()}
    return out


def test_choose_prefers_a_gamma_stable_for_every_method_and_k() -> None:
    g = grid(
        {
            "diht": {"0.01": [3.0], "0.001": [20.0], "0.0001": [90.0]},
            "fedht": {
                "0.01": [math.inf, math.inf],
                "0.001": [22.0, 4000.0],
                "0.0001": [50.0, 45.0],
            },
            "fediterht": {
                "0.01": [math.inf, math.inf],
                "0.001": [107.0, 109.0],
                "0.0001": [40.0, 30.0],
            },
        }
    )
    chosen = fedht.choose(g, f0=100.0)
    assert chosen["stable_gammas"] == [0.0001]  # 0.001: Fed-HT K=5 and FedIter-HT exceed f(x₀)
    assert chosen["shared_gamma"] == 0.0001
    assert chosen["shared_k"] == {"diht": 1, "fedht": 5, "fediterht": 5}
    assert chosen["tuned"] == {
        "diht": {"gamma": 0.01, "K": 1},
        "fedht": {"gamma": 0.001, "K": 3},
        "fediterht": {"gamma": 0.0001, "K": 5},
    }
    # nothing stable: the best score over the finite ones
    assert fedht.choose(g, f0=1.0)["shared_gamma"] == 0.001


def test_rounds_and_simulated_time_to_target() -> None:
    rows = [{"round": r, "objective": 10.0 / r} for r in range(1, 11)]
    assert fedht.rounds_to(rows, 2.0) == 5 and fedht.rounds_to(rows, 0.5) is None
    assert fedht.sim_time(20, 10) == pytest.approx(20 * (0.150 + 10 * 20e-6))
    assert fedht.final_objective(rows, 10) == 1.0 and fedht.final_objective(rows, 11) == math.inf
    assert fedht.best_k({"3": 2.0, "5": 2.0, "8": 3.0}) == (3, 2.0)


LINE = re.compile(
    r"^fedht noiseless (diht|fedht|fediterht) rounds_to_target=(\d+|never) "
    r"objective_final=\S+ sim_time_to_target_s=\S+$"
)


def test_noiseless_reproduction_prints_one_line_per_method(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = main(
        ["reproduce", "fedht-noiseless", "dataset.dim=100", "dataset.samples=30"]
        + ["--rounds", "6", "--out", str(out)]
    )
    assert code == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fedht ")]
    assert [LINE.match(ln).group(1) for ln in lines] == ["diht", "fedht", "fediterht"]  # type: ignore[union-attr]
    table = json.loads((out / "table.json").read_text())
    assert table["rows"][0]["rounds_to_target"] == 6  # DIHT reaches its own target at T = 6
    for name in table["figures"]:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert "dist_to_true" in table["recovery"]["fediterht"]


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["reproduce", "fedht-libsvm", "--out", str(tmp_path)]) == 2
    assert "--path is required" in capsys.readouterr().err
    assert main(["reproduce", "fedht-libsvm", "--path", str(tmp_path / "none.svm")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_libsvm_problem_from_the_file(tmp_path: Path) -> None:
    binary = tmp_path / "rcv1.svm"
    binary.write_text("-1 1:0.5 3:1\n+1 2:1\n")
    real = tmp_path / "e2006.svm"
    real.write_text("-3.2 1:0.5\n-2.9 2:1\n-4.0 3:1\n")
    opts = ReproOptions(quiet=True)
    logistic = fedht.problems(opts, str(binary))["libsvm"].overrides
    assert "model.name=logreg" in logistic and "dataset.sparse=true" in logistic
    assert "partition.category=kmeans" in logistic
    assert "model.name=linreg" in fedht.problems(opts, str(real))["libsvm"].overrides


@pytest.mark.slow
def test_parallel_runs_give_the_sequential_results(tmp_path: Path, capsys) -> None:
    """``--jobs 2`` runs the experiment's runs in worker processes: same table, same lines."""
    args = ["reproduce", "fedht-noiseless", "dataset.dim=50", "dataset.samples=20", "--rounds", "4"]
    tables, lines = [], []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        assert main([*args, "--jobs", jobs, "--out", str(out)]) == 0
        tables.append(json.loads((out / "table.json").read_text())["rows"])
        lines.append([ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fedht ")])
        assert len(list((out / "runs" / "full").iterdir())) == 3  # noiseless: one K
    assert tables[0] == tables[1] and lines[0] == lines[1] and len(lines[0]) == 3
