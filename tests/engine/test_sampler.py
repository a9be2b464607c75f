"""Minibatch index draws: the per-sample-key draw and the partial Fisher–Yates draw used for
federations too large for a key per sample."""

from __future__ import annotations

import collections

import pytest
import torch

import fedhp.engine.sampler as sampler_module
from fedhp.engine.sampler import BatchSampler


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every draw takes the large-federation path."""
    monkeypatch.setattr(sampler_module, "MAX_KEYS", 0)


def test_partial_shuffle_draws_every_ordered_subset_equally(no_keys: None) -> None:
    counts = torch.tensor([4, 6])
    sampler = BatchSampler(counts, torch.Generator().manual_seed(0))
    draws = torch.stack([sampler.draw(torch.arange(2), 2) for _ in range(24000)])
    for c, n in enumerate(counts.tolist()):
        rows = draws[:, c].tolist()
        assert all(a != b and 0 <= a < n and 0 <= b < n for a, b in rows)
        freq = collections.Counter(map(tuple, rows))
        expected = len(rows) / (n * (n - 1))
        assert len(freq) == n * (n - 1)
        assert max(abs(f - expected) for f in freq.values()) < 0.15 * expected


def test_partial_shuffle_keeps_a_clients_draws_independent_of_the_others(no_keys: None) -> None:
    counts = torch.tensor([50, 9, 300, 12])
    full = BatchSampler(counts, torch.Generator().manual_seed(3)).draw(torch.arange(4), 5)
    some = BatchSampler(counts, torch.Generator().manual_seed(3)).draw(torch.tensor([1, 2]), 5)
    assert torch.equal(some, full[1:3])
    assert all(len(set(row)) == 5 for row in full.tolist())


def test_small_federations_keep_the_key_draw() -> None:
    """Below ``MAX_KEYS`` the draw is the per-sample-key one (the runs made before stay the
    same): the 5 smallest of one uniform key per sample."""
    counts = torch.tensor([7, 8])
    drawn = BatchSampler(counts, torch.Generator().manual_seed(1)).draw(torch.arange(2), 3)
    keys = torch.rand(2, 8, generator=torch.Generator().manual_seed(1))
    keys[0, 7] = 2.0
    expected = keys.topk(3, dim=1, largest=False).indices
    assert torch.equal(drawn.sort(1).values, expected.sort(1).values)


def test_steps_are_consecutive_draws() -> None:
    counts = torch.tensor([5, 6, 7])
    clients = torch.tensor([0, 2])
    ahead = BatchSampler(counts, torch.Generator().manual_seed(2)).steps(clients, 2, 3)
    one_by_one = BatchSampler(counts, torch.Generator().manual_seed(2))
    assert torch.equal(ahead, torch.stack([one_by_one.draw(clients, 2) for _ in range(3)]))
