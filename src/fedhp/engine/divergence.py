"""Divergence: a round whose state or losses are not finite (or above ``max_loss``) stops the run
with a one-line :class:`~fedhp.errors.DivergenceError` that names the likely cause."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from fedhp.engine.experiment import EngineExperiment
from fedhp.engine.protocol import Row, State
from fedhp.errors import DivergenceError

LOSS_KEYS = ("local_loss", "global_loss", "train_loss", "personal_loss", "personal_train_loss")


STIFF = 0.5


def likely_cause(options: Any) -> str:
    """A short guess at why ``options`` diverged, naming the values to lower: a quadratic
    penalty weight the options declare (``penalty_weights``: field → symbol) when weight·η ≥
    :data:`STIFF` (a gradient step on weight/2‖·‖² is unstable from weight·η = 2 on), else the
    learning rate. A weight is paired with the step sizes that multiply it
    (``penalty_steps``: field → step fields, default ``lr``); the stiffest pair is named."""
    lr = getattr(options, "lr", None)
    steps: dict[str, tuple[str, ...]] = getattr(options, "penalty_steps", {})
    worst: tuple[float, str] | None = None
    for field, symbol in getattr(options, "penalty_weights", {}).items():
        weight = getattr(options, field, None)
        for step_field in steps.get(field, ("lr",)):
            step = getattr(options, step_field, None)
            if not (isinstance(weight, int | float) and isinstance(step, int | float)):
                continue
            product = weight * step
            if weight > 0 and product >= STIFF and (worst is None or product > worst[0]):
                eta = "η" if step_field == "lr" else f"η ({step_field})"
                worst = (
                    product,
                    f"{symbol}·{eta} = {product:g} too large (algorithm.{field}={weight:g}, "
                    f"algorithm.{step_field}={step:g}); lower them",
                )
    if worst is not None:
        return worst[1]
    if isinstance(lr, int | float):
        return f"learning rate too large (algorithm.lr={lr:g}); lower it"
    return "step sizes too large; lower the algorithm's learning rates"


def divergence_problem(state: State, stats: Row, max_loss: float | None) -> str | None:
    """What is wrong with ``state`` / the loss values in ``stats`` (None when all is well).

    Non-finite parameters, a non-finite loss, or a loss above ``max_loss`` count as divergence."""
    bad = [
        k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())
    ]
    if bad:
        return f"non-finite values in {', '.join(sorted(bad))}"
    for key in LOSS_KEYS:
        loss = stats.get(key)
        if not isinstance(loss, int | float):
            continue
        if not math.isfinite(loss):
            return f"{key} is {loss}"
        if max_loss is not None and loss > max_loss:
            return f"{key} {loss:.4g} > max_loss={max_loss:g}"
    return None


def divergence_error(
    exp: EngineExperiment, rnd: int, problem: str, out_dir: Path | None
) -> DivergenceError:
    """The error of round ``rnd`` (0-based) that diverged with ``problem``; ``out_dir``: where the
    results up to the last good round are kept."""
    name = exp.cfg.algorithm.get("name")
    where = ""
    if out_dir is not None:
        where = f"; results up to round {rnd} (the last good one) are kept in {out_dir}"
    return DivergenceError(
        f"round {rnd + 1}: {name} diverged ({problem}); "
        f"likely cause: {likely_cause(exp.options)}{where}"
    )
