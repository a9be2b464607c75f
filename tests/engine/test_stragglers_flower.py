"""Stragglers' partial work under the Flower backend: the shares travel in the task to the nodes,
which train them as the in-process engine does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.engine.checkpoint import FINAL_STATE_FILE
from tests.flower.helpers import (
    BASE,
    assert_same_metrics,
    read_csv,
    run_flower_local,
    run_inprocess,
)

PARTIAL = ("faults.straggler=0.5", "faults.straggler_work=partial", "faults.client_dropout=0.1")


@pytest.mark.parametrize(
    "extra",
    [("algorithm.local_steps=4",), ("algorithm.local_epochs=2",)],
    ids=["steps", "epochs"],
)
def test_fedprox_partial_work_on_flower_nodes_is_the_inprocess_run(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    args = [*BASE, "algorithm.name=fedprox", "rounds=2", *extra, *PARTIAL]
    run_inprocess(tmp_path / "a", args)
    _, driver = run_flower_local(tmp_path / "b", args)
    assert not driver.events
    assert_same_metrics(tmp_path / "a", tmp_path / "b")
    a, b = (torch.load(tmp_path / d / FINAL_STATE_FILE, weights_only=True)["state"] for d in "ab")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    rows = read_csv(tmp_path / "a" / "metrics.csv")
    assert float(rows[-1]["clients_participating"]) > 0
