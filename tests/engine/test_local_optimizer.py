"""Local SGD with momentum and weight decay equals ``torch.optim.SGD`` client by client, with a
method's gradient term (FedProx's prox) inside the momentum, and frozen steps waiting."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedhp.engine.ops import (
    ConstantGrad,
    LocalOptimizer,
    prox_grad,
    sgd_steps,
    weighted_sgd_steps,
)
from tests.conftest import small_experiment
from tests.policies import use_policy

LR, MOMENTUM, DECAY, MU = 0.1, 0.9, 0.01, 0.5


def _setup() -> tuple:
    exp = small_experiment("algorithm.name=fedavg", "model.hidden=[6]")
    model = exp.model
    params = torch.stack([model.init_params(s) for s in (1, 2)])
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(2, 5, 1, 28, 28, generator=g), torch.randint(0, 10, (2, 5), generator=g))
        for _ in range(4)
    ]
    return model, params, batches


def _reference(model, start, batches, client, center=None, active=None):  # type: ignore[no-untyped-def]
    net = model.make_module(start.clone())
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=DECAY)
    for step, (x, y) in enumerate(batches):
        if active is not None and not active[step]:
            continue
        opt.zero_grad()
        loss = F.cross_entropy(net(x[client]), y[client])
        if center is not None:
            flat = torch.cat([p.reshape(-1) for p in net.parameters()])
            loss = loss + MU / 2 * (flat - center).pow(2).sum()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def test_sgd_steps_with_momentum_weight_decay_and_prox_match_torch() -> None:
    model, params, batches = _setup()
    optimizer = LocalOptimizer(MOMENTUM, DECAY)
    it = iter(batches)
    out, _ = sgd_steps(model, params, lambda: next(it), 4, LR, optimizer=optimizer)
    for c in range(2):
        torch.testing.assert_close(out[c], _reference(model, params[c], batches, c))
    center = model.init_params(7)
    it = iter(batches)
    out, _ = sgd_steps(
        model, params, lambda: next(it), 4, LR, prox_grad(center, MU), optimizer=optimizer
    )
    for c in range(2):
        ref = _reference(model, params[c], batches, c, center=center)
        torch.testing.assert_close(out[c], ref, atol=1e-6, rtol=1e-5)
    plain = iter(batches)
    no_momentum, _ = sgd_steps(model, params, lambda: next(plain), 4, LR)
    assert float((no_momentum - out).abs().max()) > 1e-4  # the option does something


def test_weighted_steps_freeze_the_velocity_of_idle_clients() -> None:
    """Client 1 has no sample at step 1 (all weights 0): its update and velocity wait, so it
    matches torch's SGD over its three real steps."""
    model, params, batches = _setup()
    weights = torch.ones(4, 2, 5)
    weights[1, 1] = 0.0

    def batch(step: int, rows: slice):  # type: ignore[no-untyped-def]
        x, y = batches[step]
        return x[rows], y[rows], weights[step, rows]

    out, _ = weighted_sgd_steps(
        model, params, batch, 4, LR, optimizer=LocalOptimizer(MOMENTUM, DECAY)
    )
    torch.testing.assert_close(out[0], _reference(model, params[0], batches, 0))
    active = [True, False, True, True]
    torch.testing.assert_close(out[1], _reference(model, params[1], batches, 1, active=active))


def test_methods_take_the_options() -> None:
    """FedAvg with momentum differs from without; FedNova normalizes by the momentum a_i."""
    from fedhp.algorithms.fednova import momentum_norm, normalized_average

    steps = ["algorithm.local_steps=3", "algorithm.batch_size=5"]
    runs = {
        m: small_experiment("algorithm.name=fedavg", f"algorithm.momentum={m}", *steps)
        for m in (0.0, 0.9)
    }
    states = {m: e.algorithm.init_state(e.model.init_params(0)) for m, e in runs.items()}
    for m, e in runs.items():
        e.algorithm.run_round(states[m], 0)
    assert float((states[0.0]["global"] - states[0.9]["global"]).abs().max()) > 1e-5

    nova = small_experiment(
        "algorithm.name=fednova",
        "algorithm.momentum=0.5",
        "algorithm.local_epochs=1",
        "algorithm.batch_size=7",
        "partition.name=quantity",
        "partition.min_samples=2",
        "partition.beta=2.0",
        "subsample.train=1000",
        "subsample.test=100",
    )
    algo = nova.algorithm
    state = algo.init_state(nova.model.init_params(0))
    x = state["global"].clone()
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    algo.aggregate(state, task, update)
    assert update.steps is not None and len(set(update.steps.tolist())) > 1
    weights = nova.ctx.client_weights(task.clients)
    expected = normalized_average(
        x, update.per_client["model"], momentum_norm(update.steps, 0.5), weights
    )
    torch.testing.assert_close(state["global"], expected)
    plain = normalized_average(x, update.per_client["model"], update.steps.double(), weights)
    assert float((plain - expected).abs().max()) > 1e-6  # ρ = 0.5 changes the aggregate


def _plain_reference(model, start, batches, client, term):  # type: ignore[no-untyped-def]
    """torch.optim.SGD on the cross-entropy plus the method's term of the flat parameters."""
    net = model.make_module(start.clone())
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in batches:
        opt.zero_grad()
        flat = torch.cat([p.reshape(-1) for p in net.parameters()])
        (F.cross_entropy(net(x[client]), y[client]) + term(flat)).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def test_plain_steps_fold_prox_and_constant_terms_into_the_models_step(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Plain SGD with FedProx's term (a shared or per-client centre) or SCAFFOLD's constant
    correction takes the fused step (the term applied inside ``sgd_step``, chunk by chunk) and
    lands where ``torch.optim.SGD`` on the same objective does."""
    model, params, batches = _setup()
    fused = []
    plain_step = type(model).sgd_step

    def spy(self, flat, x, y, lr, before=None):  # type: ignore[no-untyped-def]
        fused.append(before is not None)
        return plain_step(self, flat, x, y, lr, before)

    monkeypatch.setattr(type(model), "sgd_step", spy)
    use_policy(model, clients_per_chunk=1)  # one client a chunk
    shared = model.init_params(7)
    rows = torch.stack([model.init_params(8), model.init_params(9)])
    cases = [
        (prox_grad(shared, MU), lambda c: lambda w: MU / 2 * (w - shared).pow(2).sum()),
        (prox_grad(rows, MU), lambda c: lambda w: MU / 2 * (w - rows[c]).pow(2).sum()),
        (ConstantGrad(rows * 0.1), lambda c: lambda w: (0.1 * rows[c] * w).sum()),
    ]
    for term, objective in cases:
        fused.clear()
        out, _ = sgd_steps(model, params, iter(batches).__next__, 4, LR, term)
        assert fused == [True] * 8  # 4 steps of each one-client chunk, all fused
        for c in range(2):
            ref = _plain_reference(model, params[c], batches, c, objective(c))
            torch.testing.assert_close(out[c], ref, atol=1e-6, rtol=1e-5)


def test_masked_plain_steps_are_the_masked_gradient_steps(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Sub-models (a 0/1 mask) under plain SGD without sample weights take the fused step and
    then the mask: the same parameters as the masked gradient step ``p - lr (mask * grad)``
    (with a prox term too), and the masked entries stay zero."""
    model, params, batches = _setup()
    mask = (torch.rand(params.shape, generator=torch.Generator().manual_seed(5)) < 0.6).float()
    center = model.init_params(7)
    use_policy(model, clients_per_chunk=1)  # one client a chunk

    def batch(step: int, rows: slice):  # type: ignore[no-untyped-def]
        x, y = batches[step]
        return x[rows], y[rows], None

    for term in (None, prox_grad(center, MU)):
        out, losses = weighted_sgd_steps(model, params, batch, 4, LR, term, mask=mask)
        expected = params * mask
        total = torch.zeros(2)
        for x, y in batches:
            loss, grad = model.loss_and_grad(expected, x, y)
            if term is not None:
                grad += term(expected)
            expected = expected - LR * mask * grad
            total += loss
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(losses, total)
        assert bool((out[mask == 0] == 0).all())
