"""Tests for fedhp.comm.ledger: per-link and per-node accounting, unit masks, snapshots."""

from __future__ import annotations

import json

import pytest
import torch

from fedhp.comm import CommLedger


def test_ledger_rounds_totals_and_sums() -> None:
    ledger = CommLedger()
    msgs = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [1.0] * 10])  # 6 + 40 bytes
    ledger.record("edge_cloud", "up", msgs)
    ledger.record("edge_cloud", "down", torch.ones(4, 10))  # 4 * 40 bytes
    ledger.record("client_edge", "up", msgs, zero_threshold=2.0)  # all zero -> 0 bytes
    r1 = ledger.end_round()
    assert r1["bytes_edge_cloud_up"] == 46
    assert r1["bytes_edge_cloud_down"] == 160
    assert r1["bytes_edge_cloud"] == 206
    assert r1["remark1_bits_edge_cloud_up"] == 83 + 640
    assert r1["messages_edge_cloud_down"] == 4
    assert r1["enc_bitmap_edge_cloud_up"] == 1 and r1["enc_dense_edge_cloud_up"] == 1
    assert r1["bytes_client_edge_up"] == 0 and r1["enc_index_client_edge_up"] == 2
    assert r1["bytes_total"] == 206
    assert r1["dense_bytes_total"] == 80 + 160 + 80
    assert not any("client_cloud" in k for k in r1)
    ledger.record("edge_cloud", "up", msgs)
    r2 = ledger.end_round()
    assert r2["bytes_edge_cloud_up"] == 46 and r2["bytes_edge_cloud_down"] == 0
    assert set(r2) == set(r1)
    tot = ledger.totals()
    assert tot["bytes_edge_cloud_up"] == 92
    assert tot["bytes_total"] == 206 + 46
    assert ledger.rounds == 2
    assert all(isinstance(v, float) for v in tot.values())


def test_ledger_rejects_unknown_link_and_direction() -> None:
    ledger = CommLedger()
    with pytest.raises(ValueError, match="link"):
        ledger.record("edge_edge", "up", torch.ones(1, 3))
    with pytest.raises(ValueError, match="direction"):
        ledger.record("edge_cloud", "sideways", torch.ones(1, 3))
    with pytest.raises(ValueError):
        ledger.node_totals("nowhere")
    with pytest.raises(ValueError):
        ledger.record("edge_cloud", "up", torch.ones(2, 3), nodes=torch.tensor([0]))


def test_ledger_per_node_totals() -> None:
    ledger = CommLedger()
    p = 10
    sparse = torch.zeros(p)
    sparse[0] = 1.0
    for _ in range(3):
        # edges 0, 1, 0 upload: edge 0 sends a sparse and a dense message, edge 1 a dense one
        up = torch.stack([sparse, torch.ones(p), torch.ones(p)])
        ledger.record("edge_cloud", "up", up, nodes=torch.tensor([0, 1, 0]))
        ledger.record("edge_cloud", "down", torch.ones(2, p), nodes=torch.tensor([0, 1]))
        ledger.end_round()
    nodes = ledger.node_totals("edge_cloud")
    assert sorted(nodes) == [0, 1]
    assert nodes[0]["bytes_up"] == 3 * (6 + 40)
    assert nodes[0]["bytes_down"] == 3 * 40
    assert nodes[0]["bytes"] == 3 * (6 + 40 + 40)
    assert nodes[0]["remark1_bits_up"] == 3 * (83 + 640)
    assert nodes[0]["messages_up"] == 6
    assert nodes[1]["bytes"] == 3 * 80
    total_up = ledger.totals()["bytes_edge_cloud_up"]
    assert nodes[0]["bytes_up"] + nodes[1]["bytes_up"] == total_up
    assert ledger.node_totals("client_cloud") == {}


def test_ledger_state_dict_json_roundtrip() -> None:
    ledger = CommLedger()
    ledger.record("client_cloud", "up", torch.eye(5), nodes=torch.arange(5))
    ledger.end_round()
    ledger.record("client_cloud", "down", torch.ones(5, 5), nodes=torch.arange(5))  # open round
    state = json.loads(json.dumps(ledger.state_dict()))
    restored = CommLedger()
    restored.load_state_dict(state)
    assert restored.totals() == ledger.totals()
    assert restored.node_totals("client_cloud") == ledger.node_totals("client_cloud")
    assert restored.current() == ledger.current()
    assert restored.end_round() == ledger.end_round()
    assert restored.node_totals("client_cloud") == ledger.node_totals("client_cloud")
    assert restored.rounds == ledger.rounds == 2


def test_ledger_counts_unit_masks_beside_their_messages() -> None:
    ledger = CommLedger()
    ledger.record("client_cloud", "up", torch.ones(3, 10), nodes=torch.tensor([0, 1, 5]))
    plain = ledger.state_dict()
    assert "mask_round" not in plain  # snapshots without masks are unchanged
    added = ledger.record_masks("client_cloud", "up", 20, 3, nodes=torch.tensor([0, 1, 5]))
    assert added == 3 * 3
    current = ledger.current()
    assert current["mask_bytes_client_cloud_up"] == 9.0
    assert current["bytes_client_cloud_up"] == 3 * 40 + 9
    assert current["dense_bytes_client_cloud_up"] == 3 * 40
    assert current["messages_client_cloud_up"] == 3
    copy = CommLedger()
    copy.load_state_dict(ledger.state_dict())
    ledger.end_round()
    copy.end_round()
    assert ledger.totals() == copy.totals()
    assert ledger.totals()["bytes_total"] == 3 * 40 + 9
    assert ledger.node_totals("client_cloud")[5]["bytes_up"] == 40 + 3
    merged = CommLedger()
    node = CommLedger()
    node.record_masks("client_edge", "down", 8, 2)
    merged.merge_round(node.state_dict())
    assert merged.current()["mask_bytes_client_edge_down"] == 2.0


def test_round_node_bytes_are_what_each_node_was_billed_this_round() -> None:
    """Per node of the open round: its messages' wire bytes plus its unit masks; 0 for a node
    without a message; a closed round no longer counts."""
    ledger = CommLedger()
    dense = torch.ones(3, 100)
    ledger.record("client_cloud", "up", dense, nodes=torch.tensor([4, 7, 4]))
    ledger.record_masks("client_cloud", "up", 16, 1, nodes=torch.tensor([7]))
    got = ledger.round_node_bytes("client_cloud", "up", torch.tensor([7, 4, 9]))
    assert got.dtype == torch.float64
    assert got.tolist() == [400.0 + 2, 800.0, 0.0]
    assert ledger.round_node_bytes("client_cloud", "down", torch.tensor([4])).tolist() == [0.0]
    ledger.end_round()
    assert ledger.round_node_bytes("client_cloud", "up", torch.tensor([4])).tolist() == [0.0]


def test_merged_node_rounds_add_to_the_cloud_ledgers_own_per_node_rows() -> None:
    """A Flower node's per-node rows join the cloud's open round node by node (ids far apart
    too), and close into the totals like the cloud's own."""
    cloud, node = CommLedger(), CommLedger()
    cloud.record("client_edge", "up", torch.ones(2, 10), nodes=torch.tensor([3, 99_999]))
    node.record("client_edge", "up", torch.eye(10)[:2], nodes=torch.tensor([99_999, 0]))
    cloud.merge_round(json.loads(json.dumps(node.state_dict())))
    assert cloud.round_node_bytes("client_edge", "up", torch.tensor([0, 3, 99_999])).tolist() == [
        6.0,
        40.0,
        46.0,
    ]
    cloud.end_round()
    rows = cloud.node_totals("client_edge")
    assert sorted(rows) == [0, 3, 99_999]
    assert rows[99_999]["messages_up"] == 2 and rows[99_999]["nnz_up"] == 11
    assert sum(r["bytes_up"] for r in rows.values()) == cloud.totals()["bytes_client_edge_up"]
