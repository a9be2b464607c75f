"""BatchNorm running statistics in the algorithms: averaged (FedAvg) or kept per client
(FedBN-style), counted on the wire, refused by the methods that do not support them."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms.buffers import BufferPolicy
from fedhp.engine.evaluate import evaluate_personal, evaluate_shared
from fedhp.engine.ops import weighted_mean
from fedhp.engine.runner import evaluate_state
from fedhp.errors import ConfigError
from tests.conftest import small_experiment

BN = ["model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"]


def test_fedavg_averages_the_clients_statistics_and_counts_them() -> None:
    exp = small_experiment(*BN, "algorithm.local_steps=2")
    algo, ctx, model = exp.algorithm, exp.ctx, exp.model
    state = algo.init_state(model.init_params(0))
    assert torch.equal(state["global_buffers"], model.init_buffers())
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    bufs = update.per_client["buffers"]
    assert bufs.shape == (len(task.clients), model.num_buffers)
    assert not torch.allclose(bufs[0], bufs[1])  # each client's own batch statistics
    algo.aggregate(state, task, update)
    expected = weighted_mean(bufs, ctx.client_weights(task.clients))
    torch.testing.assert_close(state["global_buffers"], expected)
    totals = ctx.ledger.current()
    width = model.num_params + model.num_buffers  # one message: parameters, then buffers
    assert totals["params_client_cloud_down"] == len(task.clients) * width
    assert totals["params_client_cloud_up"] == len(task.clients) * width


def test_local_buffers_stay_with_each_client() -> None:
    exp = small_experiment(*BN, "algorithm.local_steps=2", "algorithm.buffers=local")
    algo, model = exp.algorithm, exp.model
    state = algo.init_state(model.init_params(0))
    assert state["client_buffers"].shape == (exp.ctx.num_clients, model.num_buffers)
    assert algo.held_keys == {"client_buffers": "client"}
    algo.run_round(state, 0)
    first = state["client_buffers"].clone()
    assert not torch.allclose(first[0], first[1])
    task = algo.plan(state, 1)
    assert "global_buffers" not in task.broadcast  # nothing sent down
    update = algo.train(state, task)
    # Round 2 started from each client's own statistics, not from an average.
    fresh = exp.algorithm.ctx.model.init_buffers()
    assert not torch.allclose(update.per_client["buffers"][0], fresh)
    assert torch.equal(state["client_buffers"][task.clients], update.per_client["buffers"])
    totals = exp.ctx.ledger.current()
    n = len(task.clients)  # two rounds down (parameters only), round 1 up (with statistics)
    assert totals["params_client_cloud_down"] == 2 * n * model.num_params
    assert totals["params_client_cloud_up"] == n * (model.num_params + model.num_buffers)


@pytest.mark.parametrize(
    "name", ["hierfavg", "local", "centralized", "fedprox", "moon", "scaffold", "fednova"]
)
def test_other_flat_methods_train_bn_models(name: str) -> None:
    exp = small_experiment(
        *BN,
        f"algorithm.name={name}",
        # (hierfavg's local work is kappa1 x kappa2: it does not read local_steps)
        *(["algorithm.kappa1=1"] if name == "hierfavg" else ["algorithm.local_steps=2"]),
        "algorithm.lr=0.05",
    )
    state = exp.algorithm.init_state(exp.model.init_params(0))
    before = {k: v.clone() for k, v in state.items()}
    exp.algorithm.run_round(state, 0)
    key = "theta_buffers" if name == "local" else "global_buffers"
    assert not torch.allclose(state[key], before[key])
    assert bool(torch.isfinite(state[key]).all())


@pytest.mark.parametrize("name", ["sfedhp", "pfedme", "perfedavg", "heurfedamp"])
def test_personalized_methods_refuse_bn_models_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError, match="batch_norm=false") as err:
        small_experiment(*BN, f"algorithm.name={name}")
    assert "\n" not in str(err.value)


def test_local_buffers_give_fedbn_personalized_accuracy() -> None:
    """``buffers=local``: the personalized model of client c is the global model with c's own
    running statistics, evaluated on c's own test data, and the global model sent to every
    client for it is billed on the evaluation link."""
    exp = small_experiment(*BN, "algorithm.local_steps=2", "algorithm.buffers=local")
    algo, ctx, model = exp.algorithm, exp.ctx, exp.model
    state = algo.init_state(model.init_params(0))
    algo.run_round(state, 0)
    row, clients = evaluate_state(exp, state)
    w, own = state["global"], state["client_buffers"]
    expected = evaluate_personal(model, w.expand(ctx.num_clients, -1), ctx.fed.test, buffers=own)
    assert row["personal_acc"] == pytest.approx(expected.accuracy)
    per_client = [c["personal_acc"] for c in clients]
    assert per_client == pytest.approx(expected.per_client_accuracy().tolist())
    shared = evaluate_shared(model, w, ctx.fed.test, buffers=state["global_buffers"])
    assert row["personal_acc"] != pytest.approx(shared.accuracy)  # own statistics matter
    assert algo.evaluation_needs_global and algo.evaluates_on_nodes
    plain = small_experiment(*BN, "algorithm.local_steps=2")
    assert plain.algorithm.personal_models(state) is None
    assert not plain.algorithm.evaluation_needs_global


def _policy(mode: str, width: int = 3, **kw: object) -> BufferPolicy:
    return BufferPolicy(mode, width, 4, lambda: torch.arange(float(width)), **kw)  # type: ignore[arg-type]


def test_the_policy_hands_out_the_sent_rows_under_average_and_keeps_nothing() -> None:
    policy = _policy("average")
    state = policy.init_state(torch.device("cpu"))
    assert set(state) == {"global_buffers"} and policy.node_keys() == {}
    assert policy.travels_down and policy.sent(state).keys() == {"global_buffers"}
    clients, sent = torch.tensor([1, 3]), torch.full((2, 3), 7.0)
    rows = policy.start(state, clients, sent)
    assert rows is not None and torch.equal(rows, sent) and rows.data_ptr() != sent.data_ptr()
    policy.keep(state, clients, rows + 1)
    assert set(state) == {"global_buffers"}  # nothing stored per client


def test_the_policy_keeps_each_clients_own_rows_under_local() -> None:
    policy = _policy("local")
    state = policy.init_state(torch.device("cpu"))
    assert state["client_buffers"].shape == (4, 3) and policy.node_keys() == {
        "client_buffers": "client"
    }
    assert not policy.travels_down and policy.sent(state) == {}
    clients = torch.tensor([0, 2])
    rows = policy.start(state, clients, None)
    assert rows is not None and torch.equal(rows, torch.arange(3.0).expand(2, 3))
    policy.keep(state, clients, rows + 5)
    own = policy.own(state)
    assert own is not None and own[2].tolist() == [5.0, 6.0, 7.0] and own[1].tolist() == [0, 1, 2]


def test_the_policy_is_a_no_op_without_batch_norm_and_can_live_under_another_key() -> None:
    none = _policy("local", width=0)
    assert none.init_state(torch.device("cpu")) == {} and not none.local
    assert none.start({}, torch.tensor([0]), None) is None
    mine = _policy("local", own_key="theta_buffers", shared=False)
    assert set(mine.init_state(torch.device("cpu"))) == {"theta_buffers"}
