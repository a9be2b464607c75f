"""pFedGP: the class tree covers every class once, a two-class client's prediction by hand (the
node GP's predictive under the same Gibbs draws), one-class clients, no global accuracy,
evaluation that leaves training alone, and a bit-identical resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.algorithms.gp import expected_sigmoid, gibbs, linear_kernel, predictive
from fedhp.algorithms.gp_tree import GPSettings, build_tree, class_probabilities
from fedhp.cli import main
from tests.conftest import small_experiment

TINY = [
    "algorithm.name=pfedgp",
    "model.name=dnn",
    "model.hidden=[16]",
    "subsample.train=1000",
    "subsample.test=500",
    "partition.train_per_class=40",
    "partition.test_per_class=40",
    "federation.num_clients=4",
    "federation.num_edges=1",
    "algorithm.chains=4",
    "algorithm.test_chains=4",
    "eval_train=false",
    "progress=false",
    "threads=1",
]


@pytest.mark.parametrize("num_classes", [2, 3, 5, 10])
def test_the_tree_has_every_class_once_as_a_leaf(num_classes: int) -> None:
    means = torch.randn(num_classes, 4, generator=torch.Generator().manual_seed(num_classes))
    classes = list(range(10, 10 + num_classes))
    tree = build_tree(means, classes, restarts=5)
    assert len(tree) == num_classes - 1  # a binary tree with one leaf per class
    assert sorted(tree[0].classes) == classes
    leaves = []
    for node in tree:
        assert node.left and node.right and not set(node.left) & set(node.right)
        for side in (node.left, node.right):
            children = [n for n in tree if sorted(n.classes) == sorted(side)]
            if len(side) == 1:
                leaves.append(side[0])
                assert not children
            else:
                assert len(children) == 1
    assert sorted(leaves) == classes


def test_two_class_prediction_by_hand() -> None:
    emb = torch.tensor([[1.0, 0.0], [0.9, 0.3], [0.0, 1.0], [0.2, 1.0]], dtype=torch.float64)
    y = torch.tensor([3, 3, 7, 7])
    test = torch.tensor([[1.0, 0.1], [0.1, 1.0]], dtype=torch.float64)
    gp = GPSettings(linear_kernel, mean=0.0, gibbs_steps=3)
    tree = build_tree(torch.stack([emb[:2].mean(0), emb[2:].mean(0)]), [3, 7])
    probs = class_probabilities(emb, y, test, tree, 10, gp, 8, torch.Generator().manual_seed(5))
    # by hand: the same draws, one node (left = class 3)
    labels = torch.tensor([1, 1, 0, 0])
    k = linear_kernel(emb, emb)
    state = gibbs(k, labels, 0.0, 3, 8, torch.Generator().manual_seed(5))
    kx = linear_kernel(emb, test)
    mu, var = predictive(k, kx, linear_kernel(test, test).diagonal(), labels, state, 0.0)
    p3 = expected_sigmoid(mu, var).mean(0)
    torch.testing.assert_close(probs[:, 3], p3)
    torch.testing.assert_close(probs[:, 7], 1 - p3)
    assert float(probs.sum(1).sub(1).abs().max()) < 1e-12 and probs[:, [0, 1, 2]].sum() == 0
    assert probs[0, 3] > 0.5 > probs[1, 3]  # each test point leans to its nearer class


def test_one_class_clients_predict_their_class_and_keep_the_model(tmp_path: Path) -> None:
    exp = small_experiment(*TINY, "partition.labels_per_client=1", "rounds=1")
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    w = state["global"].clone()
    algo.run_round(state, 0)
    torch.testing.assert_close(state["global"], w)  # nobody had a tree to train
    result = algo.personal_evaluation(state, exp.ctx.fed.test)
    assert result.accuracy == 1.0  # every client's test images are its one class
    assert algo.global_model(state) is None


def test_training_changes_the_network_and_evaluation_does_not_touch_training() -> None:
    exp = small_experiment(*TINY, "rounds=1")
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    twin = {k: v.clone() for k, v in state.items()}
    algo.personal_evaluation(twin, exp.ctx.fed.test)  # evaluating first must not matter
    exp2 = small_experiment(*TINY, "rounds=1")
    algo.run_round(state, 0)
    exp2.algorithm.run_round(twin, 0)
    assert torch.equal(state["global"], twin["global"])
    assert not torch.equal(state["global"], exp.model.init_params(0))


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    args = ["run", *TINY, "eval_every=1", "checkpoint_every=1"]
    assert main([*args, "rounds=3", "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "rounds=2", "--out", str(tmp_path / "b")]) == 0
    assert main(["run", "--resume", str(tmp_path / "b"), "rounds=3"]) == 0
    for name in ("metrics.csv", "per_client.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    metrics = (tmp_path / "a" / "metrics.csv").read_text().splitlines()[0]
    assert "personal_acc" in metrics and "global_acc" not in metrics


def test_exact_two_means_beats_or_ties_kmeans_restarts() -> None:
    from fedhp.algorithms.gp_tree import _split_sse, _two_means
    from fedhp.data.categories import kmeans

    for seed in range(5):
        x = torch.randn(7, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        left, right = _two_means(x, restarts=50)
        assert sorted(left + right) == list(range(7)) and 0 in left and right
        mask = torch.zeros(1, 7, dtype=torch.bool)
        mask[0, right] = True
        exact = float(_split_sse(x, mask)[0])
        labels, centroids = kmeans(x, 2, seed)
        k_sse = float(((x - centroids[torch.as_tensor(labels)]) ** 2).sum())
        assert exact <= k_sse + 1e-9
        # the SSE of a split by hand
        by_hand = sum(float(((x[s] - x[s].mean(0)) ** 2).sum()) for s in (left, right))
        assert exact == pytest.approx(by_hand)


def test_a_client_with_one_sample_per_class_still_predicts() -> None:
    from fedhp.algorithms.gp_tree import client_tree, tree_loss

    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.2]], dtype=torch.float64)
    y = torch.tensor([0, 4, 9])
    gp = GPSettings(linear_kernel, gibbs_steps=2, chains=3)
    tree = client_tree(emb, y, restarts=3)
    gen = torch.Generator().manual_seed(0)
    assert tree_loss(emb, y, tree, gp, gen) is None  # no held-out half anywhere: no loss
    probs = class_probabilities(emb, y, emb, tree, 10, gp, 3, gen)
    torch.testing.assert_close(probs.sum(1), torch.ones(3, dtype=torch.float64))
    assert probs[:, [0, 4, 9]].sum() == pytest.approx(3.0)


def test_inducing_points_as_many_as_the_data_give_the_full_gp_objective() -> None:
    """IP-data with X̄ = the client's own embeddings (one inducing point per sample, same class)
    fits every node's GP on exactly the data: the objective equals the full GP's scored on the
    data it was fitted on, with the same Gibbs draws."""
    from fedhp.algorithms.gp_tree import _left_probability, _node_data, inducing_tree_loss

    g = torch.Generator().manual_seed(2)
    y = torch.tensor([0, 0, 0, 3, 3, 3, 5, 5, 5])
    emb = torch.randn(9, 4, generator=g, dtype=torch.float64) + y[:, None].double()
    gp = GPSettings(linear_kernel, gibbs_steps=2, chains=4)
    tree = build_tree(torch.stack([emb[y == c].mean(0) for c in (0, 3, 5)]), [0, 3, 5])
    got = inducing_tree_loss(emb, y, emb, y, tree, gp, torch.Generator().manual_seed(9))
    gen = torch.Generator().manual_seed(9)
    expected = torch.zeros((), dtype=torch.float64)
    for node in tree:
        idx, labels = _node_data(node, y)
        p_left = _left_probability(emb[idx], labels, emb[idx], gp, gp.chains, gen)
        p = torch.where(labels == 1, p_left, 1 - p_left)
        ce = -torch.log(p)
        expected = expected + torch.stack([ce[y[idx] == c].mean() for c in node.classes]).mean()
    assert got is not None
    torch.testing.assert_close(got, expected)


def test_inducing_points_learn_and_are_averaged_over_the_clients_holding_each_class() -> None:
    exp = small_experiment(*TINY, "algorithm.inducing=true", "algorithm.inducing_points=3")
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    before = state["inducing"].clone()
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    algo.aggregate(state, task, update)
    held = update.per_client["inducing_held"]
    k = exp.model.num_classes
    moved = (state["inducing"] - before).view(k, -1).abs().sum(1) > 0
    assert moved.tolist() == (held.sum(0) > 0).tolist()  # exactly the classes someone holds
    weights = exp.ctx.client_weights(task.clients).double()
    rows = update.per_client["inducing"].view(len(task.clients), k, -1).double()
    for c in range(k):
        if held[:, c].sum() > 0:
            w = weights * held[:, c]
            mean = (w[:, None] * rows[:, c]).sum(0) / w.sum()
            torch.testing.assert_close(state["inducing"].view(k, -1)[c].double(), mean)
    result = algo.personal_evaluation(state, exp.ctx.fed.test)
    assert 0 < result.accuracy <= 1


def test_the_marginal_objective_trains_too() -> None:
    exp = small_experiment(*TINY, "algorithm.objective=marginal")
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    stats = algo.run_round(state, 0)
    assert stats["local_loss"] > 0 and not torch.equal(state["global"], exp.model.init_params(0))


def test_learned_kernel_hyperparameters_move_and_are_averaged() -> None:
    exp = small_experiment(*TINY, "algorithm.learn_kernel=true")
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    assert state["kernel"].exp().tolist() == pytest.approx([8.0, 1.0])
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    algo.aggregate(state, task, update)
    rows = update.per_client["kernel"]
    assert not torch.allclose(rows, torch.tensor([8.0, 1.0]).log().expand_as(rows))
    weights = exp.ctx.client_weights(task.clients)
    torch.testing.assert_close(state["kernel"], (weights[:, None] * rows).sum(0) / weights.sum())


def test_the_training_count_sees_every_full_batch_step() -> None:
    """summary.json's ``train_samples``: each inner step is one gradient evaluation of the
    network over the client's whole training set; a one-class client fits nothing."""
    exp = small_experiment(*TINY, "rounds=1", "algorithm.inner_steps=2")
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    exp.model.trained_samples = 0
    algo.run_round(state, 0)
    train = exp.ctx.fed.train
    expected = 0
    for c in range(exp.ctx.num_clients):
        _, y = algo._client_data(train, c)
        expected += 2 * len(y) if len(torch.unique(y)) > 1 else 0
    assert expected > 0 and exp.model.trained_samples == expected
