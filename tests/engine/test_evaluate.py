"""Personalized evaluation with a DIFFERENT model per client: client c's model on client c's own
test set, against a plain per-client loop (a mix-up of clients or test sets would show)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fedhp.algorithms.heurfedamp import HeurFedAMPOptions
from fedhp.engine.evaluate import evaluate_personal
from fedhp.engine.runner import evaluate_state
from tests.algorithms.tiny import CLASSES, FEATURES, client_test, tiny_context

N_TEST = (5, 9, 3, 7, 4)  # uneven, and longer than the evaluation window below


def distinct_models(c: int) -> torch.Tensor:
    return 2.0 * torch.randn(
        c, FEATURES * CLASSES + CLASSES, generator=torch.Generator().manual_seed(4)
    )


def hand(params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[int, float]:
    """Correct predictions and summed loss of one MLR model on one client's samples."""
    w = params[: FEATURES * CLASSES].view(CLASSES, FEATURES)
    logits = x @ w.T + params[FEATURES * CLASSES :]
    loss = F.cross_entropy(logits, y, reduction="sum")
    return int((logits.argmax(1) == y).sum()), float(loss)


def test_each_client_is_scored_with_its_own_model_on_its_own_test_set() -> None:
    ctx = tiny_context(edge_sizes=(3, 2), n_test=N_TEST, seed=1)
    models = distinct_models(5)
    result = evaluate_personal(ctx.model, models, ctx.fed.test, width=4)
    expected = [hand(models[c], *client_test(ctx, c)) for c in range(5)]
    assert result.correct.tolist() == [float(k) for k, _ in expected]
    # Both sides sum float32 losses (in different orders): float32 tolerances.
    torch.testing.assert_close(
        result.loss_sum,
        torch.tensor([s for _, s in expected], dtype=torch.float64),
        rtol=1e-5,
        atol=1e-5,
    )
    assert result.count.tolist() == [float(n) for n in N_TEST]
    assert result.accuracy == sum(k for k, _ in expected) / sum(N_TEST)
    # The data can tell the clients apart: client 0's model scores differently on client 1's set.
    assert hand(models[0], *client_test(ctx, 0)) != hand(models[1], *client_test(ctx, 0))


def test_evaluate_state_reports_each_clients_own_model() -> None:
    ctx = tiny_context(edge_sizes=(3, 2), n_test=N_TEST, seed=1)
    algo = HeurFedAMPOptions().build(ctx)
    state = {"personal": distinct_models(5)}
    exp = SimpleNamespace(
        model=ctx.model,
        ctx=ctx,
        algorithm=algo,
        cfg=SimpleNamespace(eval_split="test", eval_train=True),
    )
    row, clients = evaluate_state(exp, state)  # type: ignore[arg-type]
    correct = [hand(state["personal"][c], *client_test(ctx, c))[0] for c in range(5)]
    for c in range(5):
        assert clients[c]["personal_acc"] == correct[c] / N_TEST[c]
    assert row["personal_acc"] == sum(correct) / sum(N_TEST)
    assert row["edge0_personal_acc"] == sum(correct[:3]) / sum(N_TEST[:3])
    assert row["edge1_personal_acc"] == sum(correct[3:]) / sum(N_TEST[3:])
    assert "global_acc" not in row


def test_balanced_accuracy_is_the_mean_of_per_class_accuracies() -> None:
    """The global model on an unbalanced union of test sets: the mean over classes of each
    class's accuracy, by hand from a plain loop — not the micro-averaged accuracy."""
    from fedhp.engine.evaluate import evaluate_shared

    ctx = tiny_context(edge_sizes=(3, 2), n_test=N_TEST, seed=1)
    w = distinct_models(1)[0]
    result = evaluate_shared(ctx.model, w, ctx.fed.test, chunk=4)
    hits: dict[int, list[bool]] = {}
    for c in range(5):
        x, y = client_test(ctx, c)
        wm = w[: FEATURES * CLASSES].view(CLASSES, FEATURES)
        pred = (x @ wm.T + w[FEATURES * CLASSES :]).argmax(1)
        for label, ok in zip(y.tolist(), (pred == y).tolist(), strict=True):
            hits.setdefault(label, []).append(ok)
    per_class = [sum(v) / len(v) for v in hits.values()]
    assert result.balanced_accuracy == pytest.approx(sum(per_class) / len(per_class))
    sizes = [len(v) for v in hits.values()]
    assert len(set(sizes)) > 1  # unbalanced, so the two averages differ in general
    assert result.balanced_accuracy != pytest.approx(result.accuracy)


def test_eval_train_false_skips_the_training_set_and_changes_nothing_else() -> None:
    from tests.conftest import small_experiment

    rows = {}
    for flag in ("true", "false"):
        exp = small_experiment("algorithm.name=ditto", "model.name=mlr", f"eval_train={flag}")
        state = exp.algorithm.init_state(exp.model.init_params(0))
        exp.algorithm.run_round(state, 0)
        rows[flag] = evaluate_state(exp, state)
    full, fast = rows["true"], rows["false"]
    assert "train_loss" in full[0] and "personal_train_loss" in full[0]
    assert "train_loss" not in fast[0] and "personal_train_loss" not in fast[0]
    assert {k: v for k, v in full[0].items() if "train" not in k} == fast[0]
    assert full[1] == fast[1]
