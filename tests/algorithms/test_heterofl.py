"""HeteroFL and FedRolex: entry-wise averaging over holders by hand, the sub-models' held entries
(ordered or rolling), masked training, and the cost metrics."""

from __future__ import annotations

import torch

from fedhp.algorithms.heterofl import held_mean
from fedhp.models.masks import held_entries, masked_flops, param_mask, unit_groups, window_unit_mask
from tests.conftest import small_experiment

BASE = [
    "model.name=cnn2",
    "federation.client_fraction=0.25",
    "algorithm.batch_size=20",
    "algorithm.local_steps=2",
    "federation.weighting=samples",
]


def test_held_mean_by_hand() -> None:
    previous = torch.tensor([9.0, 9.0, 9.0, 9.0])
    params = torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 0.0, 5.0, 0.0], [5.0, 4.0, 0.0, 0.0]])
    held = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0]])
    out = held_mean(previous, params, held, torch.tensor([1.0, 2.0, 3.0]))
    expected = [(1 + 6 + 15) / 6, (2 + 12) / 4, 5.0, 9.0]  # nobody holds the last entry
    torch.testing.assert_close(out, torch.tensor(expected))


def _round(name: str, rnd: int = 0):  # type: ignore[no-untyped-def]
    exp = small_experiment(f"algorithm.name={name}", *BASE)
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    w = state["global"].clone()
    task = algo.plan(state, rnd)
    update = algo.train(state, task)
    stats = algo.aggregate(state, task, update)
    return exp, state, w, task, update, stats


def test_heterofl_round_by_hand() -> None:
    exp, state, w, task, update, stats = _round("heterofl")
    model, clients = exp.model, task.clients
    caps = task.per_client["capability"]
    units = window_unit_mask(model, caps)
    held = held_entries(model, param_mask(model, units))
    torch.testing.assert_close(task.per_client["start"], w * held)
    params = update.per_client["model"]
    assert bool((params[held == 0] == 0).all())  # training never leaves the sub-model
    assert not torch.equal(params, w * held)
    torch.testing.assert_close(state["personal"][clients], params)
    counts = exp.ctx.fed.train.counts[clients].double()
    num = (counts[:, None] * held * params).sum(0)
    den = (counts[:, None] * held).sum(0)
    expected = torch.where(den > 0, num / den.clamp(min=1), w.double())
    torch.testing.assert_close(state["global"], expected.float())
    # each sub-model keeps the first round(z·J) units of every hidden layer
    start = 0
    for g in unit_groups(model):
        kept = units[:, start : start + g.size]
        start += g.size
        n = torch.floor(caps * g.size + 0.5).clamp(min=1).long()
        for i in range(len(clients)):
            assert kept[i].nonzero().flatten().tolist() == list(range(int(n[i])))
    flops = 3.0 * masked_flops(model, units).double() * (2 * 20)  # 2 steps of 20 samples
    assert stats["flops"] == float(flops.sum())
    assert stats["sim_time_s"] > 0


def test_fedrolex_window_rolls_with_the_round() -> None:
    exp, _, w, task, _, _ = _round("fedrolex", rnd=3)
    model = exp.model
    caps = task.per_client["capability"]
    units = window_unit_mask(model, caps, 3)
    held = held_entries(model, param_mask(model, units))
    torch.testing.assert_close(task.per_client["start"], w * held)
    j = unit_groups(model)[0].size
    for i, z in enumerate(caps.tolist()):
        n = max(1, int(z * j + 0.5))
        assert units[i, :j].nonzero().flatten().tolist() == sorted((3 + k) % j for k in range(n))
