"""The engine's side of the algorithm interface (engine/protocol.py): what it reads of options
comes from hooks they declare, and the engine imports no algorithm."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from fedhp.algorithms import ALGORITHMS
from fedhp.algorithms.base import LocalWorkOptions
from fedhp.engine.divergence import likely_cause
from fedhp.engine.protocol import LocalWorkOptionsLike


def modules_loaded_by(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after ``statement``."""
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "module", ["fedhp.engine.runner", "fedhp.engine.checkpoint", "fedhp.engine.aggregation"]
)
def test_the_engine_imports_no_algorithm(module: str) -> None:
    loaded = modules_loaded_by(f"import {module}")
    assert module in loaded
    assert not {m for m in loaded if m.startswith("fedhp.algorithms")}


def test_the_configuration_imports_no_torch() -> None:
    loaded = modules_loaded_by("import fedhp.config")
    assert "fedhp.config" in loaded and "fedhp.robust" in loaded
    assert "torch" not in loaded


def test_local_work_is_recognized_by_what_the_options_offer() -> None:
    for name in ALGORITHMS.names():
        opts = ALGORITHMS.build({"name": name}, "algorithm")
        assert isinstance(opts, LocalWorkOptionsLike) == isinstance(opts, LocalWorkOptions), name
    steps = ALGORITHMS.build({"name": "fedavg", "local_epochs": 2, "batch_size": 4}, "algorithm")
    assert isinstance(steps, LocalWorkOptionsLike)
    assert steps.step_counts(torch.tensor([8, 9])).tolist() == [4, 6]


def test_the_hint_blames_the_penalties_the_options_declare() -> None:
    declared = SimpleNamespace(lr=0.1, gamma=10.0, lam=10.0, penalty_weights={"gamma": "γ"})
    assert likely_cause(declared).startswith("γ·η = 1 too large (algorithm.gamma=10")
    assert likely_cause(SimpleNamespace(lr=0.1, lam=10.0, penalty_weights={})).startswith(
        "learning rate too large"
    )
    fedprox = ALGORITHMS.build({"name": "fedprox", "mu": 20.0, "lr": 0.1}, "algorithm")
    assert likely_cause(fedprox).startswith("μ·η = 2 too large (algorithm.mu=20")
    sfedhp = ALGORITHMS.build({"name": "sfedhp", "lam": 15.0, "lr": 0.05}, "algorithm")
    assert likely_cause(sfedhp).startswith("λ·η = 0.75 too large (algorithm.lam=15")


def test_the_engine_names_no_penalty_of_its_own() -> None:
    """An undeclared penalty field is not blamed: the names live in the algorithms' options."""
    assert likely_cause(SimpleNamespace(lr=0.05, lam=15.0)).startswith("learning rate too large")
