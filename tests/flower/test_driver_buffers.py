"""BatchNorm running statistics through the Flower round driver: the same metrics and final
state as in-process, with buffers sent, uploaded and held on the nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.engine.checkpoint import FINAL_STATE_FILE
from tests.flower.helpers import assert_same_metrics, config_args, run_flower_local, run_inprocess

BN = (
    "model.name=vgg",
    "model.cfg=[4,M,8,M]",
    "model.batch_norm=true",
    "partition.train_per_class=40",
    "partition.test_per_class=20",
)


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("fedavg", ()),
        ("fedavg", ("algorithm.buffers=local", "flower.nodes=2")),  # FedBN: evaluated on nodes
        ("hierfavg", ("algorithm.buffers=local", "flower.nodes=2")),  # node-held client_buffers
        ("local", ()),
    ],
)
def test_bn_models_match_inprocess(tmp_path: Path, name: str, extra: tuple[str, ...]) -> None:
    args = config_args(name, "rounds=2", *BN, *extra)
    run_inprocess(tmp_path / "a", args)
    _, driver = run_flower_local(tmp_path / "b", args)
    assert_same_metrics(tmp_path / "a", tmp_path / "b")
    assert not driver.events
    a, b = (
        torch.load(p / FINAL_STATE_FILE, weights_only=True)["state"] for p in tmp_path.iterdir()
    )
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.endswith("buffers") for k in a)
