"""The edge level as rows (fedhp.engine.edges): each edge's clients' rows."""

from __future__ import annotations

import torch

from fedhp.engine.edges import edge_members


def test_edge_members_are_views_where_contiguous() -> None:
    members = edge_members(torch.tensor([0, 0, 0, 2, 2]), 3)
    assert members == [slice(0, 3), slice(0, 0), slice(3, 5)]
