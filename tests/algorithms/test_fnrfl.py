"""FNR-FL: class-average feature norms, the refined set, both regularizers, the wrapper equal
to its base without refinement, D_pub rules (carved out of training; test overlap refused unless
marked), and the refined models' second upload billed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedhp.algorithms.fnrfl import class_avg_norms, reference_norms, refine_loss, refine_set
from fedhp.build import partition_data
from fedhp.config import resolve_config
from fedhp.engine.runner import run_experiment
from fedhp.errors import ConfigError
from tests.conftest import small_experiment

FNR = ["algorithm.name=fnrfl", "algorithm.local_steps=3", "public.per_class=5"]


def tiny_model():  # type: ignore[no-untyped-def]
    return small_experiment("model.hidden=[6]").model


def test_class_avg_norms_by_hand() -> None:
    model = tiny_model()
    params = torch.stack([model.init_params(s) for s in (0, 1)])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 1, 28, 28, generator=g)
    y = torch.tensor([0, 0, 3, 3, 3, 5, 0])
    norms, acc = class_avg_norms(model, params, x, y, 10)
    for c in range(2):
        net = model.make_module(params[c]).eval()
        feats = net.embed(x).detach()  # type: ignore[operator]
        for k in range(10):
            sel = y == k
            if sel.any():
                want = float(feats[sel].norm(dim=1).mean())
                assert float(norms[c, k]) == pytest.approx(want, rel=1e-5)
            else:
                assert torch.isnan(norms[c, k])
        hits = (net(x).argmax(1) == y).double().mean()
        assert float(acc[c]) == pytest.approx(float(hits))


def test_refine_set_lowest_accuracy_ties_to_lower_id() -> None:
    acc = torch.tensor([0.5, 0.2, 0.5, 0.2, 0.9])
    assert refine_set(acc, 2).tolist() == [1, 3]
    assert refine_set(acc, 3).tolist() == [0, 1, 3]  # 0.5 tie: client 0 before client 2
    assert refine_set(acc, 0).tolist() == []


def test_reference_norms_paper_and_code_sums() -> None:
    nan = float("nan")
    f = torch.tensor([[1.0, 2.0], [3.0, nan], [5.0, 6.0], [7.0, 8.0]], dtype=torch.float64)
    refined = torch.tensor([0, 1])
    delta, mean = reference_norms(f, refined, "paper")  # m in S \ S_re = {2, 3}
    assert delta[0].tolist() == [(5 - 1) + (7 - 1), (6 - 2) + (8 - 2)]
    assert mean[0].tolist() == [6.0, 7.0]
    delta, mean = reference_norms(f, refined, "code")  # every m != j that has the class
    assert delta[0].tolist() == [(3 - 1) + (5 - 1) + (7 - 1), (6 - 2) + (8 - 2)]
    assert mean[1].tolist()[0] == pytest.approx((1 + 5 + 7) / 3)


def test_paper_regularizer_has_zero_gradient_and_differentiable_matches_autograd() -> None:
    model = tiny_model()
    params = torch.stack([model.init_params(s) for s in (0, 1)])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 28, 28, generator=g)
    y = torch.tensor([1, 1, 2, 4, 4, 4])
    delta = torch.randn(2, 10, generator=g, dtype=torch.float64)
    target = torch.rand(2, 10, generator=g, dtype=torch.float64) * 3
    target[:, 2] = float("nan")  # no reference client has class 2: left out

    def grad(lam: float, mode: str, w: torch.Tensor) -> torch.Tensor:
        leaf = w.clone().requires_grad_(True)
        refine_loss(model, leaf, x, y, lam, mode, delta, target).sum().backward()  # type: ignore[arg-type]
        assert leaf.grad is not None
        return leaf.grad

    assert torch.equal(grad(5.0, "paper", params), grad(0.0, "paper", params))
    got = grad(0.7, "differentiable", params)
    for c in range(2):
        net = model.make_module(params[c])
        feats = net.embed(x)  # type: ignore[operator]
        loss = F.cross_entropy(net.head(feats), y)  # type: ignore[operator]
        for k in (1, 4):  # classes in the batch with a target
            sel = y == k
            rho = float(sel.double().mean())
            loss = loss + 0.7 * rho * (feats[sel].norm(dim=1).mean() - float(target[c, k])) ** 2
        loss.backward()
        want = torch.cat([p.grad.reshape(-1) for p in net.parameters()])  # type: ignore[union-attr]
        torch.testing.assert_close(got[c], want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("base", ["fedavg", "fedprox"])
def test_no_refined_clients_is_the_base_algorithm(base: str) -> None:
    wrap = small_experiment(*FNR, f"algorithm.base={base}", "algorithm.p=0")
    plain = small_experiment(
        f"algorithm.name={base}", "algorithm.local_steps=3", "public.per_class=5"
    )
    states = [e.algorithm.init_state(e.model.init_params(0)) for e in (wrap, plain)]
    for rnd in range(2):
        wrap.algorithm.run_round(states[0], rnd)
        plain.algorithm.run_round(states[1], rnd)
    assert torch.equal(states[0]["global"], states[1]["global"])
    assert wrap.ctx.ledger.current() == plain.ctx.ledger.current()


def test_refined_models_travel_a_second_time() -> None:
    exp = small_experiment(*FNR, "algorithm.p=0.25")
    state = exp.algorithm.init_state(exp.model.init_params(0))
    stats = exp.algorithm.run_round(state, 0)
    n, p, k = exp.ctx.num_clients, exp.model.num_params, 10
    n_re = int(n * 0.25)
    assert stats["fnr_refined"] == n_re
    totals = exp.ctx.ledger.current()
    assert totals["params_client_cloud_up"] == n * p + n_re * p
    assert totals["params_client_cloud_down"] == n * p + n_re * k


def test_public_data_is_carved_out_of_training_and_class_balanced() -> None:
    cfg = resolve_config(None, ["public.per_class=7"])
    data, clients, public = partition_data(cfg)
    base, base_clients, none = partition_data(resolve_config(None, []))
    assert none is None and public is not None and public.source == "holdout"
    assert torch.bincount(public.y, minlength=10).tolist() == [7] * 10
    assert len(data.train_y) == len(base.train_y) - 70

    def keys(x: torch.Tensor) -> set[bytes]:
        return {r.numpy().tobytes() for r in x.flatten(1)}

    rows = keys(public.x)
    assert len(rows) == 70
    for c in clients:
        assert not rows & keys(c.train_x)  # no client trains on D_pub
        assert not rows & keys(c.test_x)  # and no evaluation set contains it


def test_test_overlap_refused_unless_allowed_then_marked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="allow_test_leak") as err:
        small_experiment(*FNR, "public.source=test")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="public.per_class"):
        small_experiment("algorithm.name=fnrfl")
    exp = small_experiment(*FNR, "public.source=test", "algorithm.allow_test_leak=true", "rounds=1")
    run_experiment(exp, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["test_leak"] is True


@pytest.mark.parametrize("base", ["scaffold", "fednova", "moon"])
def test_wraps_the_other_flat_methods(base: str) -> None:
    """X+FNR-FL: X's own state rides along (SCAFFOLD's control variates, MOON's previous
    models) and the refinement still happens."""
    exp = small_experiment(*FNR, f"algorithm.base={base}", "algorithm.p=0.25")
    state = exp.algorithm.init_state(exp.model.init_params(0))
    base_keys = set(exp.algorithm.base.init_state(exp.model.init_params(0)))  # type: ignore[attr-defined]
    assert set(state) == base_keys
    stats = exp.algorithm.run_round(state, 0)
    assert stats["fnr_refined"] == 5 and bool(torch.isfinite(state["global"]).all())
