"""LotteryFL-style personal magnitude masks: the pruning step by hand, the accuracy gate, the
untouched output layer, and entry-wise averaging over the holders."""

from __future__ import annotations

import torch

from fedhp.algorithms.heterofl import held_mean
from fedhp.algorithms.lotteryfl import magnitude_prune
from fedhp.models.masks import output_layer_mask
from tests.conftest import small_experiment


def test_magnitude_prune_by_hand() -> None:
    params = torch.tensor([[0.5, -0.1, 0.3, 0.2, 9.0, 0.0], [0.1, 0.1, 0.4, -0.4, 9.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 1]])
    out = magnitude_prune(params, mask, [slice(0, 4)], step=0.5, floor=0.25)
    # row 0: keep round(4·0.5) = 2 of 4 → |0.5|, |0.3|; row 1: round(3·0.5 + 0.5) = 2 of the
    # 3 kept → 0.4 and the first 0.1 (tie → lower index); entries outside the block untouched
    assert out.tolist() == [[1, 0, 1, 0, 1, 1], [1, 0, 1, 0, 1, 1]]
    floor = magnitude_prune(params, mask, [slice(0, 4)], step=0.9, floor=0.5)
    assert floor[:, :4].sum(1).tolist() == [2.0, 2.0]  # never below the floor of the block


def _round(threshold: float):  # type: ignore[no-untyped-def]
    exp = small_experiment(
        "algorithm.name=lotteryfl",
        "model.name=cnn2",
        "federation.client_fraction=0.25",
        "algorithm.local_steps=2",
        f"algorithm.acc_threshold={threshold}",
        "algorithm.prune_step=0.2",
    )
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    w = state["global"].clone()
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    stats = algo.aggregate(state, task, update)
    return exp, algo, state, w, task, update, stats


def test_a_round_prunes_hidden_weights_and_averages_over_holders() -> None:
    exp, algo, state, w, task, update, stats = _round(0.0)
    clients = task.clients
    mask = state["mask"][clients]
    head = output_layer_mask(exp.model)
    assert bool((mask[:, head] == 1).all())  # the output layer is never pruned
    for block in algo.blocks:  # 20 % of every hidden weight layer is gone
        size = block.stop - block.start
        assert mask[:, block].sum(1).tolist() == [float(int(size * 0.8 + 0.5))] * len(clients)
    biases = torch.ones(exp.model.num_params, dtype=torch.bool)
    for block in algo.blocks:
        biases[block] = False
    assert bool((mask[:, biases] == 1).all())
    params = update.per_client["model"]
    assert bool((params[mask == 0] == 0).all())
    torch.testing.assert_close(state["personal"][clients], params)
    weights = exp.ctx.client_weights(clients)
    torch.testing.assert_close(state["global"], held_mean(w, params, mask, weights))
    assert stats["mean_density"] < 1.0 and stats["flops"] > 0
    # the next round's sub-models are the global model under each client's mask
    nxt = algo.plan(state, 1)
    torch.testing.assert_close(
        nxt.per_client["start"], state["global"] * state["mask"][nxt.clients]
    )


def test_below_the_accuracy_gate_nothing_is_pruned() -> None:
    _, _, state, _, _, _, stats = _round(1.0)
    assert bool((state["mask"] == 1).all())
    assert stats["mean_density"] == 1.0
