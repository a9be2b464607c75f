"""End-to-end accuracy on real data (the foundation issue's bar)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhp.engine.runner import run_experiment
from tests.conftest import small_experiment


@pytest.mark.slow
def test_fedavg_mnist_setting1_dnn100_reaches_88_percent(tmp_path: Path) -> None:
    """FedAvg, MNIST Setting 1, DNN 784-100-10: >= 88% global test accuracy within 200 rounds."""
    exp = small_experiment("rounds=200", "eval_every=50", "model.hidden=[100]")
    summary = run_experiment(exp, tmp_path, progress=False)
    assert summary["best_global_acc"] >= 0.88, summary
