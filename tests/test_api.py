"""The Python API (fedhp.run / load_run / resolve and the registries) against the command line,
and the runnable examples of docs/api.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fedhp
from fedhp.cli import main

FAST = {
    "progress": False,
    "threads": 2,
    "model": {"name": "mlr"},
    "eval_every": 1,
    "algorithm": {"name": "fedavg", "local_steps": 3},
    "rounds": 3,
}
FAST_ARGS = [
    "progress=false",
    "threads=2",
    "model.name=mlr",
    "eval_every=1",
    "algorithm.name=fedavg",
    "algorithm.local_steps=3",
    "rounds=3",
]
DOCS = Path(__file__).resolve().parents[1] / "docs"
UNTYPED: Any = fedhp  # (called with arguments of the wrong type on purpose)


def test_import_fedhp_is_light() -> None:
    code = "import sys, fedhp; fedhp.__version__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_api_gives_the_cli_numbers(tmp_path: Path) -> None:
    """The same configuration through `fedhp run` and `fedhp.run`: the same files, byte for byte
    (timings aside), and a Result holding exactly what the files hold."""
    assert main(["run", "--out", str(tmp_path / "cli"), *FAST_ARGS]) == 0
    result = fedhp.run(out=tmp_path / "api", **FAST)
    for name in ("metrics.csv", "per_client.csv", "config.yaml", "final_state.pt"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "api" / name).read_bytes()
    cli = fedhp.load_run(tmp_path / "cli")
    assert result.metrics == cli.metrics and len(result.metrics) == 3
    assert result.per_client == cli.per_client
    assert result.config == cli.config
    for key in ("final_global_acc", "best_global_acc", "rounds", "communication"):
        assert result.summary[key] == cli.summary[key]
    assert result.column("global_acc") == [row["global_acc"] for row in cli.metrics]
    assert result.state.keys() == cli.state.keys() == {"global"}
    assert bool((result.state["global"] == cli.state["global"]).all())
    assert result.out_dir == tmp_path / "api"


def test_every_way_of_giving_options_resolves_alike(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model: {name: mlr}\nalgorithm: {name: fedprox, mu: 0.5}\n")
    expected = fedhp.resolve(yaml_file, rounds=4)
    assert expected.algorithm == {"name": "fedprox", "mu": 0.5} and expected.rounds == 4
    same = [
        fedhp.resolve(
            {"model": {"name": "mlr"}, "algorithm": {"name": "fedprox", "mu": 0.5}}, rounds=4
        ),
        fedhp.resolve(model__name="mlr", algorithm={"name": "fedprox", "mu": 0.5}, rounds=4),
        fedhp.resolve(
            model={"name": "mlr"}, **{"algorithm.name": "fedprox", "algorithm.mu": 0.5}, rounds=4
        ),
        fedhp.resolve(fedhp.resolve(yaml_file), rounds=4),
    ]
    for cfg in same:
        assert cfg == expected


def test_save_false_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = fedhp.run(save=False, **FAST)
    assert result.out_dir is None and list(tmp_path.iterdir()) == []
    assert len(result.metrics) == 3 and result.state["global"].ndim == 1


def test_api_errors_are_one_line_fedhp_errors(tmp_path: Path) -> None:
    with pytest.raises(fedhp.ConfigError, match=r"^algorithm.lr: Input should be greater than 0"):
        fedhp.run(save=False, algorithm__lr=-1.0)
    with pytest.raises(fedhp.ConfigError, match="not a finished fedhp run"):
        fedhp.load_run(tmp_path)
    with pytest.raises(fedhp.FedhpError, match="unknown algorithm 'nope'"):
        fedhp.run(save=False, algorithm={"name": "nope"})


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: UNTYPED.run(42), r"^config: expected a YAML file .*got int 42$"),
        (lambda: UNTYPED.resolve([1, 2]), r"^config: expected a YAML file"),
        (lambda: UNTYPED.run(save=False, plugins="p.py"), r"^plugins: expected a list"),
        (lambda: UNTYPED.run(out=3), r"^out: expected a folder name"),
        (
            lambda: UNTYPED.sweep(grid={"algorithm.lam": 15}),
            r"^grid algorithm.lam: 15 is not a list of values; write \[15\]",
        ),
        (lambda: UNTYPED.sweep(grid=[("algorithm.lam", [15])]), r"^grid: expected a mapping"),
        (lambda: UNTYPED.sweep(seeds=3.5), r"^seeds: expected a list of integers"),
        (lambda: UNTYPED.sweep(seeds=[0, "1"]), r"^seeds: '1' is not an integer"),
        (lambda: UNTYPED.sweep(out=3), r"^out: expected a folder name"),
        (lambda: UNTYPED.sweep(config=42), r"^config: expected a YAML file"),
        (lambda: UNTYPED.sweep(progress="no"), r"^progress: expected True or False"),
        (lambda: UNTYPED.sweep(seed=3, seeds=[0, 1]), r"^seed=3 beside seeds"),
        (
            lambda: UNTYPED.sweep(grid={"algorithm.lam": [15, 15.0]}),
            r"^grid algorithm.lam: 15 and 15.0 given twice",
        ),
    ],
    ids=[
        "run-42",
        "resolve-list",
        "plugins-str",
        "run-out-int",
        "grid-scalar",
        "grid-list",
        "seeds-float",
        "seeds-str-item",
        "sweep-out-int",
        "sweep-config-int",
        "progress-str",
        "seed-and-seeds",
        "grid-repeat",
    ],
)
def test_wrong_argument_types_are_fedhp_errors_naming_the_argument(
    call: Any, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fedhp.ConfigError, match=says):
        call()
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_sweep_file_given_to_run_points_to_sweep(tmp_path: Path) -> None:
    path = tmp_path / "lam.yaml"
    path.write_text("rounds: 2\nsweep:\n  grid:\n    algorithm.lam: [15, 20]\n")
    with pytest.raises(fedhp.ConfigError, match=r"run it with `fedhp sweep .*lam.yaml`"):
        fedhp.run(path, save=False)


def test_registries_are_exported() -> None:
    assert "sfedhp" in fedhp.ALGORITHMS.names() and "fedavg" in fedhp.ALGORITHMS
    assert "mnist" in fedhp.DATASETS.names() and "dirichlet" in fedhp.PARTITIONERS.names()
    assert "cnn" in fedhp.MODELS.names()
    with pytest.raises(AttributeError):
        _ = fedhp.no_such_name  # type: ignore[attr-defined]


def test_docs_api_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every python block of docs/api.md, in order, in a fresh folder."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "api.md").read_text(), re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), namespace)
    assert (tmp_path / "runs" / "first" / "plot.png").is_file()
