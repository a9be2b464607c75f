"""FedPer: only the body is averaged and billed; heads stay with their clients; the personalized
model is the global body with the client's head."""

from __future__ import annotations

import torch

from fedhp.models.masks import output_layer_mask
from tests.conftest import small_experiment

STEPS = ["algorithm.local_steps=3", "algorithm.batch_size=5", "model.hidden=[8]"]


def test_output_layer_mask_is_the_last_linear() -> None:
    exp = small_experiment("algorithm.name=fedper", *STEPS)
    head = output_layer_mask(exp.model)
    assert int(head.sum()) == 8 * 10 + 10  # 784-8-10: the 8→10 layer, weight and bias
    assert bool(head[-90:].all()) and not bool(head[:-90].any())


def test_body_is_averaged_heads_stay_and_only_the_body_is_billed() -> None:
    fp = small_experiment("algorithm.name=fedper", "federation.client_fraction=0.5", *STEPS)
    algo, ctx = fp.algorithm, fp.ctx
    state = algo.init_state(fp.model.init_params(0))
    w0, heads0 = state["global"].clone(), state["head"].clone()
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    # the local models start from the global body with the client's own head: FedAvg's start
    algo.aggregate(state, task, update)
    body = algo.body_idx
    expected = update.per_client["body"].mean(0)  # uniform weighting
    torch.testing.assert_close(state["global"][body], expected)
    assert torch.equal(state["global"][algo.head_idx], w0[algo.head_idx])
    others = torch.ones(ctx.num_clients, dtype=torch.bool)
    others[task.clients] = False
    assert torch.equal(state["head"][others], heads0[others])
    assert not torch.equal(state["head"][task.clients], heads0[task.clients])
    personal = algo.personal_models(state)
    assert personal is not None
    torch.testing.assert_close(personal[:, body], state["global"][body].expand(ctx.num_clients, -1))
    torch.testing.assert_close(personal[:, algo.head_idx], state["head"])
    totals = ctx.ledger.current()
    n = len(task.clients)
    assert totals["params_client_cloud_up"] == n * len(body)
    assert totals["params_client_cloud_down"] == n * len(body)


def test_one_client_round_equals_fedavg() -> None:
    """With one client the body update is exactly FedAvg's local SGD (same minibatches)."""
    one = ["federation.num_clients=1", "federation.num_edges=1", *STEPS]
    fp = small_experiment("algorithm.name=fedper", *one)
    fa = small_experiment("algorithm.name=fedavg", *one)
    states = [e.algorithm.init_state(e.model.init_params(0)) for e in (fp, fa)]
    fp.algorithm.run_round(states[0], 0)
    fa.algorithm.run_round(states[1], 0)
    body, head = fp.algorithm.body_idx, fp.algorithm.head_idx
    torch.testing.assert_close(states[0]["global"][body], states[1]["global"][body])
    torch.testing.assert_close(states[0]["head"][0], states[1]["global"][head])


def test_a_one_layer_model_is_refused_in_one_line() -> None:
    import pytest

    from fedhp.errors import ConfigError

    with pytest.raises(ConfigError, match="fedper needs a body") as err:
        small_experiment("algorithm.name=fedper", "model.name=mlr")
    assert "\n" not in str(err.value)
