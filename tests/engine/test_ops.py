"""The local step path of :mod:`fedhp.engine.ops`: one step (``_step``) whose gradient term is
added in one place, taken fused in the model's backward or as gradient-then-step with the same
values up to rounding; the minibatches of :class:`~fedhp.engine.ops.StepBatches` drawn as the
steps go, or all first where the clients train in chunks, and drawn even for no clients."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhp.engine.ops import (
    ConstantGrad,
    LocalOptimizer,
    LocalSteps,
    StepBatches,
    _train_rows,
    prox_grad,
    sgd_steps,
)
from fedhp.models.zoo import DNNOptions
from tests.policies import use_policy

SHAPE, CLASSES, CLIENTS, STEPS, LR = (1, 4, 4), 3, 5, 3, 0.1


def _minibatches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(CLIENTS, 6, *SHAPE, generator=g),
            torch.randint(0, CLASSES, (CLIENTS, 6), generator=g),
        )
        for _ in range(STEPS)
    ]


class Counted:
    """A ``draw()`` over fixed minibatches that records when each is drawn."""

    def __init__(self, log: list[str]) -> None:
        self.batches, self.log = iter(_minibatches()), log

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.log.append("draw")
        return next(self.batches)


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunks"])
def test_minibatches_are_drawn_as_the_steps_go_or_all_first_for_chunks(chunked: bool) -> None:
    model = DNNOptions(hidden=[8]).build(SHAPE, CLASSES)
    start = torch.stack([model.init_params(s) for s in range(CLIENTS)])
    log: list[str] = []
    step = model.sgd_step

    def logged(*args: Any, **kw: Any) -> torch.Tensor:
        log.append("step")
        return step(*args, **kw)

    model.sgd_step = logged  # type: ignore[method-assign]
    whole, whole_loss = sgd_steps(model, start, Counted([]), STEPS, LR)
    if chunked:
        use_policy(model, clients_per_chunk=2)
    log.clear()
    out, loss = sgd_steps(model, start, Counted(log), STEPS, LR)
    if chunked:  # every minibatch first, then each chunk of 2, 2, 1 clients its steps
        assert log == ["draw"] * STEPS + ["step"] * STEPS * 3
    else:
        assert log == ["draw", "step"] * STEPS
    torch.testing.assert_close(out, whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(loss, whole_loss)


def test_no_clients_still_draw_every_step() -> None:
    model = DNNOptions(hidden=[8]).build(SHAPE, CLASSES)
    log: list[str] = []
    out, loss = sgd_steps(model, torch.zeros(0, model.num_params), Counted(log), STEPS, LR)
    assert log == ["draw"] * STEPS and out.shape == (0, model.num_params) and loss.shape == (0,)


@pytest.mark.parametrize("kind", ["none", "prox", "constant"])
def test_the_fused_step_is_the_gradient_step_with_the_term(kind: str) -> None:
    """``p - lr (grad + term(p))``: the model's fused step (the term as its column hook) and
    the gradient-then-step path (taken under a weight decay too small to matter) agree up to
    rounding."""
    model = DNNOptions(hidden=[8]).build(SHAPE, CLASSES)
    start = torch.stack([model.init_params(s) for s in range(CLIENTS)])
    centre = model.init_params(99)
    term = {
        "none": None,
        "prox": prox_grad(centre, 0.5),
        "constant": ConstantGrad(torch.full((model.num_params,), 0.01)),
    }[kind]
    batches = _minibatches()

    def batch(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, y = batches[step]
        return x[rows], y[rows], None

    rows = slice(0, CLIENTS)
    fused, by_gradient = start.clone(), start.clone()
    plain = LocalSteps(model, batch, STEPS, LR)
    assert plain.fuses(term)
    fused_loss = _train_rows(plain, fused, rows, term)
    # a tiny weight decay leaves the fused path: gradient, + term, + decay, step
    decayed = LocalSteps(model, batch, STEPS, LR, optimizer=LocalOptimizer(weight_decay=1e-30))
    assert not decayed.fuses(term)
    loss = _train_rows(decayed, by_gradient, rows, term)
    torch.testing.assert_close(by_gradient, fused, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, fused_loss)
    assert not torch.equal(fused, start)


def test_train_rows_takes_a_named_argument_object() -> None:
    """The chunk's shared arguments travel as one :class:`LocalSteps` (not 12 positionals)."""
    model = DNNOptions(hidden=[8]).build(SHAPE, CLASSES)
    run = LocalSteps(model, StepBatches(Counted([]), STEPS), STEPS, LR)
    assert run.mask is None and run.buffers is None and run.optimizer is None and run.fuses(None)
    assert not LocalSteps(model, run.batch, STEPS, LR, loss_grad=model.loss_and_grad).fuses(None)
