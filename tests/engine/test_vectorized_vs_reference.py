"""The vectorized engine and the per-client reference loop agree after a round (same seed)."""

from __future__ import annotations

import pytest

from fedhp.engine.ops import sgd_steps, weighted_mean
from fedhp.engine.reference import reference_fedavg_round
from tests.conftest import small_experiment

MODELS = {
    "mlr": ["model.name=mlr"],
    "dnn100": ["model.name=dnn", "model.hidden=[100]"],
    "dnn500_200": ["model.name=dnn", "model.hidden=[500,200]"],
    "cnn": ["model.name=cnn"],
}

SLOW_MODELS = ("cnn", "dnn500_200")  # tens of seconds each: `make test-slow`


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_MODELS else n for n in MODELS],
)
def test_fedavg_round_matches_reference(name: str) -> None:
    steps = 3 if name == "cnn" else 10
    exp = small_experiment(*MODELS[name])
    ctx = exp.ctx
    clients = ctx.all_clients
    draw = ctx.batches(clients, 20)
    batches = [draw() for _ in range(steps)]
    w0 = exp.model.init_params(0)
    it = iter(batches)
    local, _ = sgd_steps(exp.model, w0.expand(len(clients), -1), lambda: next(it), steps, 0.05)
    weights = ctx.client_weights(clients)
    vectorized = weighted_mean(local, weights)
    reference = reference_fedavg_round(exp.model, w0, batches, 0.05, weights)
    assert (vectorized - reference).abs().max().item() < 1e-5
    assert (vectorized - w0).abs().max().item() > 1e-3  # the round really moved the model


def test_fedavg_algorithm_round_matches_reference() -> None:
    """The registered FedAvg's own round (sampling included) equals the reference round."""
    exp = small_experiment("algorithm.name=fedavg", "algorithm.local_steps=5")
    ctx = exp.ctx
    w0 = exp.model.init_params(0)
    rng_state = ctx.generator.get_state()
    state = exp.algorithm.init_state(w0)
    exp.algorithm.run_round(state, 0)
    ctx.generator.set_state(rng_state)
    clients = ctx.participation.sample_clients()
    draw = ctx.batches(clients, 20)
    batches = [draw() for _ in range(5)]
    reference = reference_fedavg_round(exp.model, w0, batches, 0.05, ctx.client_weights(clients))
    assert (state["global"] - reference).abs().max().item() < 1e-5
