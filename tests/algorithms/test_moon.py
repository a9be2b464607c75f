"""MOON: the contrastive loss by hand, μ = 0 is FedAvg, z_prev is the client's own previous
model, the gradient is autograd's of the whole objective."""

from __future__ import annotations

import math

import pytest
import torch

from fedhp.algorithms.moon import contrastive_loss, moon_loss_grad
from tests.algorithms.test_buffers import BN
from tests.conftest import small_experiment

STEPS = ["algorithm.local_steps=3", "algorithm.batch_size=5"]


def test_contrastive_loss_by_hand() -> None:
    z = torch.tensor([[1.0, 0.0]])
    z_glob = torch.tensor([[1.0, 1.0]])  # cos = 1/sqrt(2)
    z_prev = torch.tensor([[0.0, 2.0]])  # cos = 0
    tau = 0.5
    pos, neg = (1 / math.sqrt(2)) / tau, 0.0 / tau
    expected = -math.log(math.exp(pos) / (math.exp(pos) + math.exp(neg)))
    assert float(contrastive_loss(z, z_glob, z_prev, tau)[0]) == pytest.approx(expected, rel=1e-6)


def test_objective_and_gradient_by_hand_on_a_tiny_model() -> None:
    """Per client: mean over its batch of CE + μ·ℓ_con with z, z_glob, z_prev from plain
    nn.Module forwards (hidden layer = representation); gradient = autograd of that."""
    exp = small_experiment("algorithm.name=moon", "model.hidden=[6]")
    model = exp.model
    g = torch.Generator().manual_seed(0)
    params = torch.stack([model.init_params(s) for s in (1, 2)])
    prev = torch.stack([model.init_params(s) for s in (3, 4)])
    glob = model.init_params(5)
    x = torch.randn(2, 4, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (2, 4), generator=g)
    loss, grad = moon_loss_grad(model, glob, prev, mu=0.7, temperature=0.5)(params, x, y)
    for c in range(2):
        nets = [model.make_module(w) for w in (params[c], glob, prev[c])]
        feats = [net.embed(x[c]) for net in nets]  # type: ignore[operator]
        logits = nets[0].head(feats[0])  # type: ignore[operator]
        sims = [torch.cosine_similarity(feats[0], f.detach(), dim=-1) / 0.5 for f in feats[1:]]
        con = -torch.log(sims[0].exp() / (sims[0].exp() + sims[1].exp()))
        ref = torch.nn.functional.cross_entropy(logits, y[c]) + 0.7 * con.mean()
        ref.backward()
        ref_grad = torch.cat([p.grad.reshape(-1) for p in nets[0].parameters()])  # type: ignore[union-attr]
        assert float(loss[c]) == pytest.approx(float(ref.detach()), rel=1e-5)
        torch.testing.assert_close(grad[c], ref_grad, atol=1e-6, rtol=1e-4)


def test_mu_zero_is_fedavg() -> None:
    moon = small_experiment("algorithm.name=moon", "algorithm.mu=0", *STEPS)
    avg = small_experiment("algorithm.name=fedavg", *STEPS)
    states = [e.algorithm.init_state(e.model.init_params(0)) for e in (moon, avg)]
    moon.algorithm.run_round(states[0], 0)
    avg.algorithm.run_round(states[1], 0)
    torch.testing.assert_close(states[0]["global"], states[1]["global"], atol=1e-6, rtol=0)


def test_previous_model_is_the_clients_own_last_local_model() -> None:
    exp = small_experiment("algorithm.name=moon", "federation.client_fraction=0.5", *STEPS)
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    assert torch.equal(state["prev"][3], exp.model.init_params(0))
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    torch.testing.assert_close(state["prev"][task.clients], update.per_client["model"])
    others = torch.ones(exp.ctx.num_clients, dtype=torch.bool)
    others[task.clients] = False
    assert bool((state["prev"][others] == exp.model.init_params(0)).all())


def test_contrastive_term_acts_once_previous_and_global_differ() -> None:
    """Round 0: z_prev = z_glob (both the initial model), so ℓ_con ≡ log 2 and MOON equals
    μ = 0; from round 1 on the client's previous model differs and the term moves the models."""
    runs = [small_experiment("algorithm.name=moon", f"algorithm.mu={mu}", *STEPS) for mu in (1, 0)]
    states = [e.algorithm.init_state(e.model.init_params(0)) for e in runs]
    for e, state in zip(runs, states, strict=True):
        e.algorithm.run_round(state, 0)
    torch.testing.assert_close(states[0]["global"], states[1]["global"], atol=1e-6, rtol=0)
    locals_ = [
        e.algorithm.train(state, e.algorithm.plan(state, 1)).per_client["model"]
        for e, state in zip(runs, states, strict=True)
    ]
    assert float((locals_[0] - locals_[1]).abs().max()) > 1e-4


def test_batchnorm_mu_zero_is_fedavg_with_partial_batches() -> None:
    """A BatchNorm VGG under local epochs (a partial last batch): μ = 0 MOON equals FedAvg,
    parameters and averaged running statistics (padding left out of the batch statistics)."""
    epochs = ["algorithm.local_epochs=1", "algorithm.batch_size=7"]
    moon = small_experiment("algorithm.name=moon", "algorithm.mu=0", *BN, *epochs)
    avg = small_experiment("algorithm.name=fedavg", *BN, *epochs)
    states = [e.algorithm.init_state(e.model.init_params(0)) for e in (moon, avg)]
    for e, state in zip((moon, avg), states, strict=True):
        e.algorithm.run_round(state, 0)
    for key in ("global", "global_buffers"):
        torch.testing.assert_close(states[0][key], states[1][key], atol=1e-5, rtol=0)
    assert float((states[1]["global_buffers"] - avg.model.init_buffers()).abs().max()) > 1e-3


def test_batchnorm_previous_statistics_are_the_clients_own() -> None:
    exp = small_experiment("algorithm.name=moon", "federation.client_fraction=0.5", *BN, *STEPS)
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    torch.testing.assert_close(state["prev_buffers"][task.clients], update.per_client["buffers"])
    others = torch.ones(exp.ctx.num_clients, dtype=torch.bool)
    others[task.clients] = False
    assert torch.equal(state["prev_buffers"][others][0], exp.model.init_buffers())
    task = algo.plan(state, 1)  # round 1 trains with the contrastive term on BN statistics
    assert torch.isfinite(algo.train(state, task).per_client["model"]).all()
