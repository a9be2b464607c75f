"""FedLPS: Eq. 13 by hand, Q's gradient with the STE off, masked personal models, the cost
metrics and the P-UCBV ratios carried in the state (resumable)."""

from __future__ import annotations

import pytest
import torch

from fedhp.models.masks import param_mask, unit_mask_from_scores, unit_weight_norms
from tests.conftest import small_experiment

BASE = [
    "algorithm.name=fedlps",
    "model.name=cnn2",
    "federation.client_fraction=0.25",
    "algorithm.batch_size=20",
    "federation.weighting=samples",
]


def _run(*extra: str):  # type: ignore[no-untyped-def]
    exp = small_experiment(*BASE, *extra)
    state = exp.algorithm.init_state(exp.model.init_params(0))
    return exp, state


def test_eq13_aggregation_and_personal_models_by_hand() -> None:
    exp, state = _run("algorithm.local_steps=2", "algorithm.ratio=fixed")
    algo, model = exp.algorithm, exp.model
    w = state["global"].clone()
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    delta = update.per_client["delta"]
    algo.aggregate(state, task, update)
    counts = exp.ctx.fed.train.counts[task.clients].double()
    p = (counts / counts.sum()).float()
    torch.testing.assert_close(state["global"], w - (p.unsqueeze(1) * delta).sum(0))
    # the personal models are the trained models under their final masks; Δ is zero off-mask
    units = update.per_client["units"] > 0.5
    pm = param_mask(model, units, False)
    assert bool((delta[pm == 0] == 0).all())
    personal = state["personal"][task.clients]
    assert bool((personal[pm == 0] == 0).all())
    torch.testing.assert_close(personal, (w - delta) * pm)
    # FLST keeps round(0.5·J) units per layer, capped by the capability
    caps = state["capability"][task.clients]
    assert (
        task.per_client["ratio"].tolist()
        == torch.minimum(torch.full_like(caps, 0.5), caps).tolist()
    )


def test_scores_without_ste_follow_only_the_importance_term() -> None:
    """One local step with ste=false: Q ← Q − η·2λ(Q − sigmoid(|ω⁰|_J)); with the STE the CE
    signal moves Q too."""
    exp, state = _run("algorithm.local_steps=1", "algorithm.ste=false", "algorithm.lam=0.7")
    algo, model = exp.algorithm, exp.model
    q0 = state["scores"].clone()
    task = algo.plan(state, 0)
    algo.train(state, task)
    c = task.clients
    target = torch.sigmoid(unit_weight_norms(model, state["global"].unsqueeze(0)))
    expected = q0[c] - 0.1 * 2 * 0.7 * (q0[c] - target)
    torch.testing.assert_close(state["scores"][c], expected)
    exp2, state2 = _run("algorithm.local_steps=1", "algorithm.lam=0.7")
    exp2.algorithm.train(state2, exp2.algorithm.plan(state2, 0))
    assert float((state2["scores"][c] - expected).abs().max()) > 1e-7


def test_round_metrics_and_bandit_state() -> None:
    exp, state = _run("algorithm.local_steps=2", "algorithm.rounds=3")
    algo = exp.algorithm
    before = state["ratio"].clone()
    assert bool(((before >= 1 / 16) & (before < 1)).all())
    stats = algo.run_round(state, 0)
    for key in ("sim_time_s", "round_sim_time_s", "flops", "mean_keep_ratio", "mean_train_acc"):
        assert stats[key] > 0, key
    assert stats["sim_time_s"] == pytest.approx(stats["round_sim_time_s"])
    chosen = (state["bandit_scalars"][:, 0] < 1).nonzero().flatten()  # ε halved: updated
    assert len(chosen) == round(0.25 * exp.ctx.num_clients)
    arms = state["bandit_arms"]
    assert bool((arms[chosen, 5, 0] >= 0).all())  # 5 arms + one split
    stats2 = algo.run_round(state, 1)
    assert stats2["sim_time_s"] > stats["sim_time_s"] and stats2["flops"] > stats["flops"]


def test_a_run_resumes_exactly_with_its_bandits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """3 rounds straight = 2 rounds, a checkpoint, and --resume to 3 (the bandits' arms are
    state tensors); the personalized accuracy and the simulated time are reported."""
    import csv

    from fedhp.api import run
    from fedhp.cli import main

    args = dict(
        algorithm__name="fedlps",
        model__name="cnn2",
        federation__client_fraction=0.25,
        algorithm__local_steps=2,
        algorithm__rounds=3,
        subsample__train=2500,
        subsample__test=400,
        partition__test_per_class=30,
        eval_every=1,
        checkpoint_every=1,
        progress=False,
    )
    run(out=tmp_path / "a", rounds=3, **args)
    run(out=tmp_path / "b", rounds=2, **args)
    assert main(["run", "--resume", str(tmp_path / "b"), "rounds=3"]) == 0
    rows = []
    for d in ("a", "b"):
        with open(tmp_path / d / "metrics.csv") as f:
            rows.append(list(csv.DictReader(f))[-1])
    assert rows[0] == rows[1]
    assert 0 <= float(rows[0]["personal_acc"]) <= 1 and float(rows[0]["sim_time_s"]) > 0


def test_capability_levels_bound_the_ratio() -> None:
    """``capability_levels=[1.0]`` lifts the device cap (every z = 1: s is the decided ratio);
    ``[0.25]`` caps every client's s at ¼ in every round (Dyn re-draws from the same levels)."""
    exp, state = _run("algorithm.local_steps=1", "algorithm.capability_levels=[1.0]")
    assert bool((state["capability"] == 1).all())
    exp.algorithm.run_round(state, 0)
    exp.algorithm.run_round(state, 1)
    assert bool((state["capability"] == 1).all())

    exp, state = _run(
        "algorithm.local_steps=1", "algorithm.ratio=fixed", "algorithm.capability_levels=[0.25]"
    )
    for rnd in range(2):
        stats = exp.algorithm.run_round(state, rnd)
        assert stats["mean_keep_ratio"] == pytest.approx(0.25)
        assert bool((state["capability"] == 0.25).all())


@pytest.mark.parametrize("levels", ["[0]", "[1.5]", "[]"])
def test_bad_capability_levels_are_refused(levels: str) -> None:
    from fedhp.errors import ConfigError

    with pytest.raises(ConfigError, match="capability_levels"):
        _run(f"algorithm.capability_levels={levels}")


@pytest.mark.parametrize("init", ["magnitude", "ordered"])
def test_score_reset_starts_every_round_from_the_initial_scores(init: str) -> None:
    """``score_reset`` (the authors' code): a client's Q at the start of a round is the initial
    scores again — sigmoid(|ω^r|_J) of the received model, or scores decreasing with the unit
    index (the code's sorted random draw keeps the same units) — not its trained Q."""
    exp, state = _run(
        "algorithm.local_steps=1",
        "algorithm.ste=false",
        "algorithm.lam=0.7",
        "algorithm.score_reset=true",
        f"algorithm.score_init={init}",
        "federation.client_fraction=1.0",
    )
    algo, model = exp.algorithm, exp.model
    for rnd in range(2):
        w = state["global"].clone()
        task = algo.plan(state, rnd)
        algo.aggregate(state, task, algo.train(state, task))
        if init == "magnitude":
            start = torch.sigmoid(unit_weight_norms(model, w.unsqueeze(0)))
        else:
            start = -torch.arange(algo.num_units, dtype=w.dtype)
        # one step with ste=false: Q = start − η·2λ(start − sigmoid(|ω^r|_J))
        target = torch.sigmoid(unit_weight_norms(model, w.unsqueeze(0)))
        expected = (start - 0.1 * 2 * 0.7 * (start - target)).expand_as(state["scores"])
        torch.testing.assert_close(state["scores"], expected)
    if init == "ordered":  # the same masks as the sorted random initial scores
        _, fresh_state = _run("algorithm.score_init=ordered")
        drawn = fresh_state["scores"]
        ratio = torch.full((drawn.shape[0],), 0.5, dtype=torch.float64)
        ordered = -torch.arange(algo.num_units, dtype=drawn.dtype).expand_as(drawn)
        assert torch.equal(
            unit_mask_from_scores(model, drawn, ratio),
            unit_mask_from_scores(model, ordered, ratio),
        )


def test_personal_keep_above_stores_only_models_trained_above_it() -> None:
    """``personal_keep_above`` (the authors' evaluation): a client's personal model is replaced
    only in rounds it trains at s above the threshold; until it has one it is evaluated on the
    global model. RCR (s = z) gives clients on both sides of ¼ in the same round."""
    exp, state = _run(
        "algorithm.local_steps=1",
        "algorithm.ratio=capability",
        "algorithm.personal_keep_above=0.25",
        "federation.client_fraction=1.0",
    )
    algo = exp.algorithm
    before = state["personal"].clone()
    assert torch.equal(algo.personal_models(state), state["global"].expand_as(before))
    w = state["global"].clone()
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    algo.aggregate(state, task, update)
    above = task.per_client["ratio"] > 0.25
    kept, skipped = task.clients[above], task.clients[~above]
    assert len(kept) and len(skipped)  # clients on both sides of the threshold
    assert state["has_personal"][kept].eq(1).all() and state["has_personal"][skipped].eq(0).all()
    assert torch.equal(state["personal"][skipped], before[skipped])
    # a stored model is the trained model under its mask: ω⊙m = (ω^r − Δ)⊙m, Δ = (ω^r − ω)⊙m
    pm = param_mask(exp.model, update.per_client["units"] > 0.5, False)
    expected = (w - update.per_client["delta"]) * pm
    torch.testing.assert_close(state["personal"][kept], expected[above])
    evaluated = algo.personal_models(state)
    assert torch.equal(evaluated[kept], state["personal"][kept])
    assert torch.equal(evaluated[skipped], state["global"].expand(len(skipped), -1))
    assert algo.evaluation_needs_global


def test_personal_keep_above_zero_adds_no_state() -> None:
    """The default (the paper) stores every round's personal model and adds no state entry."""
    exp, state = _run("algorithm.local_steps=1")
    assert "has_personal" not in state
    assert "has_personal" not in exp.algorithm.held_keys
    assert not exp.algorithm.evaluation_needs_global
