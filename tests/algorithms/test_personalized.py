"""pFedMe, Per-FedAvg and HeurFedAMP: hand computations on a tiny federation, what the
personalized evaluation uses, and end-to-end smoke runs on MNIST Setting 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.algorithms.heurfedamp import HeurFedAMPOptions, attention_weights
from fedhp.algorithms.perfedavg import PerFedAvgOptions, batched_hvp
from fedhp.algorithms.pfedme import PFedMeOptions
from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.runner import run_experiment
from tests.algorithms.tiny import client_data, init_params, mlr_grad, mlr_loss, tiny_context


def test_pfedme_round_matches_hand_and_pm_is_theta() -> None:
    ctx = tiny_context(edge_sizes=(4,))
    opt = PFedMeOptions(lam=3.0, K=3, R=2, personal_lr=0.1, lr=0.2, beta=0.8, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    w = state["global"].clone()
    thetas, locals_ = [], []
    for c in range(4):
        x, y = client_data(ctx, c)
        th, loc = w.clone(), w.clone()
        for _ in range(opt.R):
            for _ in range(opt.K):
                th = th - opt.personal_lr * (mlr_grad(th, x, y) + opt.lam * (th - loc))
            loc = loc - opt.lr * opt.lam * (loc - th)
        thetas.append(th)
        locals_.append(loc)
    algo.run_round(state, 0)
    w_hand = (1 - opt.beta) * w + opt.beta * torch.stack(locals_).mean(0)
    torch.testing.assert_close(state["global"], w_hand, atol=1e-5, rtol=1e-4)
    personal = algo.personal_models(state)
    assert personal is not None
    torch.testing.assert_close(personal, torch.stack(thetas), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(personal, torch.stack(locals_), atol=1e-3)  # theta, not w_loc


def test_partial_participation_leaves_other_clients_untouched() -> None:
    ctx = tiny_context(edge_sizes=(2, 2, 2))
    ctx.participation.client_fraction = 0.5
    ctx.participation.edges_per_round = 1
    for opt in (PFedMeOptions(K=1, R=1, batch_size=6), HeurFedAMPOptions(local_steps=1)):
        algo = opt.build(ctx)
        state = algo.init_state(init_params())
        key = "theta" if "theta" in state else "personal"
        state[key] += torch.randn(state[key].shape, generator=torch.Generator().manual_seed(1))
        before = state[key].clone()
        algo.run_round(state, 0)
        changed = (state[key] != before).any(1)
        assert int(changed.sum()) == 3
    from fedhp.algorithms.sfedhp import SFedHPOptions

    algo = SFedHPOptions(K=1, R=1, batch_size=6).build(ctx)
    state = algo.init_state(init_params())
    before = state["theta"].clone()
    algo.run_round(state, 0)
    assert int((state["theta"] != before).any(1).sum()) == 2  # one edge of two clients


def test_perfedavg_fo_round_matches_hand() -> None:
    ctx = tiny_context(edge_sizes=(3,))
    opt = PerFedAvgOptions(alpha=0.1, beta=0.3, local_steps=2, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    w = state["global"].clone()
    finals = []
    for c in range(3):
        x, y = client_data(ctx, c)
        p = w.clone()
        for _ in range(opt.local_steps):
            p = p - opt.beta * mlr_grad(p - opt.alpha * mlr_grad(p, x, y), x, y)
        finals.append(p)
    algo.run_round(state, 0)
    torch.testing.assert_close(state["global"], torch.stack(finals).mean(0), atol=1e-5, rtol=1e-4)


def test_batched_hvp_matches_per_client_autograd() -> None:
    ctx = tiny_context(edge_sizes=(3,))
    params = init_params().expand(3, -1) + 0.1 * torch.randn(3, 15)
    v = torch.randn(3, 15)
    xs, ys = zip(*(client_data(ctx, c) for c in range(3)), strict=True)
    hv = batched_hvp(ctx.model, params, torch.stack(xs), torch.stack(ys), v)
    for c in range(3):
        _, ref = torch.autograd.functional.hvp(
            lambda p, c=c: mlr_loss(p, xs[c], ys[c]), params[c], v[c]
        )
        torch.testing.assert_close(hv[c], ref, atol=1e-5, rtol=1e-4)


def test_perfedavg_personalization_uses_training_data_only() -> None:
    ctx = tiny_context(edge_sizes=(4,), nan_test=True)  # any test-data use would give NaN
    opt = PerFedAvgOptions(alpha=0.1, batch_size=6, variant="hf", local_steps=1)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    algo.run_round(state, 0)
    personal = algo.personal_models(state)
    assert personal is not None and bool(torch.isfinite(personal).all())
    w = state["global"]
    expected = torch.stack([w - 0.1 * mlr_grad(w, *client_data(ctx, c)) for c in range(4)])
    torch.testing.assert_close(personal, expected, atol=1e-5, rtol=1e-4)
    again = algo.personal_models(state)  # deterministic, independent of training's stream
    assert again is not None and torch.equal(again, personal)


@pytest.mark.parametrize("alpha", [0.1, 0.5])
def test_heurfedamp_attention_rows(alpha: float) -> None:
    models = torch.randn(6, 20, generator=torch.Generator().manual_seed(0))
    rows = torch.tensor([0, 2, 5])
    xi = attention_weights(models, rows, alpha, sigma=10.0)
    torch.testing.assert_close(xi.sum(1), torch.ones(3))
    torch.testing.assert_close(xi[torch.arange(3), rows], torch.full((3,), alpha))
    # Off-diagonal: exp(sigma cos) normalized to 1 - alpha, computed by hand for row 2.
    unit = models / models.norm(dim=1, keepdim=True)
    others = [j for j in range(6) if j != 2]
    e = torch.exp(10.0 * torch.stack([unit[2] @ unit[j] for j in others]))
    torch.testing.assert_close(xi[1, others], (1 - alpha) * e / e.sum())
    assert attention_weights(models[:1], torch.tensor([0]), alpha, 10.0).item() == 1.0


def test_heurfedamp_round_matches_hand_with_the_proximal_term() -> None:
    """Steps after the first start away from u_i, where lam / alpha_k (w - u_i) counts."""
    ctx = tiny_context(edge_sizes=(3,))
    opt = HeurFedAMPOptions(
        alpha=0.4, sigma=2.0, lam=1.5, alpha_k=0.5, local_steps=3, lr=0.1, batch_size=6
    )
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    state["personal"] += torch.randn(3, 15, generator=torch.Generator().manual_seed(2))
    models = state["personal"].clone()
    xi = attention_weights(models, torch.arange(3), 0.4, 2.0)
    u = xi @ models
    algo.run_round(state, 0)
    for c in range(3):
        x, y = client_data(ctx, c)
        p, plain = u[c].clone(), u[c].clone()
        for _ in range(opt.local_steps):
            p = p - opt.lr * (mlr_grad(p, x, y) + opt.lam / opt.alpha_k * (p - u[c]))
            plain = plain - opt.lr * mlr_grad(plain, x, y)
        torch.testing.assert_close(state["personal"][c], p, atol=1e-6, rtol=1e-5)
        assert (p - plain).abs().max() > 1e-2  # the proximal term moved the result
    assert algo.global_model(state) is None


def test_perfedavg_hf_round_matches_hand() -> None:
    """Per-FedAvg HF: w' = w - a g(w); g = g(w') - a H(w) g(w'); w <- w - b g, per client."""
    ctx = tiny_context(edge_sizes=(3,))
    opt = PerFedAvgOptions(variant="hf", alpha=0.3, beta=0.5, local_steps=2, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    w = state["global"].clone()
    finals, first_order = [], []
    for c in range(3):
        x, y = client_data(ctx, c)
        p, q = w.clone(), w.clone()
        for _ in range(opt.local_steps):
            g = mlr_grad(p - opt.alpha * mlr_grad(p, x, y), x, y)
            _, hg = torch.autograd.functional.hvp(lambda v, x=x, y=y: mlr_loss(v, x, y), p, g)
            p = p - opt.beta * (g - opt.alpha * hg)
            q = q - opt.beta * mlr_grad(q - opt.alpha * mlr_grad(q, x, y), x, y)
        finals.append(p)
        first_order.append(q)
    algo.run_round(state, 0)
    torch.testing.assert_close(state["global"], torch.stack(finals).mean(0), atol=1e-6, rtol=1e-5)
    gap = (torch.stack(finals).mean(0) - torch.stack(first_order).mean(0)).abs().max()
    assert gap > 1e-4  # the Hessian term changed the result: HF is not FO


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.name=pfedme", "algorithm.R=5", "algorithm.K=3"],
        ["algorithm.name=perfedavg", "algorithm.beta=0.05", "algorithm.local_steps=5"],
        [
            "algorithm.name=perfedavg",
            "algorithm.variant=hf",
            "algorithm.beta=0.05",
            "algorithm.local_steps=5",
        ],
        ["algorithm.name=heurfedamp", "algorithm.local_steps=10"],
    ],
)
def test_smoke_mnist(tmp_path: Path, overrides: list[str]) -> None:
    cfg = resolve_config(None, ["progress=false", "rounds=2", "model.name=mlr", *overrides])
    summary = run_experiment(build_experiment(cfg), tmp_path, progress=False)
    assert summary["final_personal_acc"] > 0.3  # chance: 0.1
    if overrides[0] == "algorithm.name=pfedme":
        assert summary["final_global_acc"] > 0.3


def pfedme_hand_round(
    ctx, opt: PFedMeOptions, w: torch.Tensor, thetas: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """One pFedMe round, client by client, with theta started as ``opt.theta_init`` says."""
    new_thetas, locals_ = [], []
    for c, previous in enumerate(thetas):
        x, y = client_data(ctx, c)
        th, loc = (previous.clone() if opt.theta_init == "warm" else w.clone()), w.clone()
        for _ in range(opt.R):
            if opt.theta_init == "reset":
                th = w.clone()
            for _ in range(opt.K):
                th = th - opt.personal_lr * (mlr_grad(th, x, y) + opt.lam * (th - loc))
            loc = loc - opt.lr * opt.lam * (loc - th)
        new_thetas.append(th)
        locals_.append(loc)
    return (1 - opt.beta) * w + opt.beta * torch.stack(locals_).mean(0), new_thetas


@pytest.mark.parametrize("theta_init", ["round", "warm", "reset"])
def test_pfedme_theta_init_over_two_rounds(
    monkeypatch: pytest.MonkeyPatch, theta_init: str
) -> None:
    """``round`` (the default, pFedMe's reference code): a client's theta at the start of round
    t+1 is the global model sent in round t+1, not its theta from round t (``warm``)."""
    ctx = tiny_context(edge_sizes=(4,))
    opt = PFedMeOptions(
        lam=3.0,
        K=3,
        R=2,
        personal_lr=0.1,
        lr=0.2,
        beta=0.8,
        batch_size=6,
        theta_init=theta_init,  # type: ignore[arg-type]
    )
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    starts: list[torch.Tensor] = []  # theta at each round's first gradient
    original = ctx.model.sgd_step  # the step pFedMe's theta takes (no l2)

    def recording(theta, x, y, lr, before=None):  # type: ignore[no-untyped-def]
        if len(starts) < rounds_started:
            starts.append(theta.clone())
        return original(theta, x, y, lr, before)

    monkeypatch.setattr(ctx.model, "sgd_step", recording)
    w, thetas = state["global"].clone(), list(state["theta"].clone())
    for rnd in range(2):
        sent, theta_before = state["global"].clone(), state["theta"].clone()
        rounds_started = rnd + 1
        algo.run_round(state, rnd)
        start = theta_before if theta_init == "warm" else sent.expand(4, -1)
        torch.testing.assert_close(starts[rnd], start, atol=0, rtol=0)
        w, thetas = pfedme_hand_round(ctx, opt, w, thetas)
        torch.testing.assert_close(state["global"], w, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(state["theta"], torch.stack(thetas), atol=1e-5, rtol=1e-4)
    if theta_init != "warm":  # the sent model differs from round 1's theta: the choice matters
        assert not torch.allclose(starts[1], theta_before, atol=1e-3)
