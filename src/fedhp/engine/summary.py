"""summary.json: what a finished run reports (final and best accuracies, time, local work,
training FLOPs, communication totals)."""

from __future__ import annotations

import math
from typing import Any

import torch

from fedhp.config import resolved_section
from fedhp.engine.experiment import EngineExperiment
from fedhp.engine.protocol import LocalWorkOptionsLike, Row


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def local_work_summary(exp: EngineExperiment) -> Row:
    """Which local budget was used; under ``local_epochs`` the gradient evaluations per round are
    the clients' real step counts ``E * ceil(n_c / batch)`` (mean over clients, min and max)."""
    opts = exp.options
    if not isinstance(opts, LocalWorkOptionsLike):
        return {}
    out: Row = {"local_work": opts.local_work()}
    if opts.local_epochs is not None:
        steps = opts.step_counts(exp.ctx.fed.train.counts.cpu())
        out["gradient_evaluations_per_round"] = float(steps.double().mean())
        out["gradient_evaluations_per_round_min"] = int(steps.min())
        out["gradient_evaluations_per_round_max"] = int(steps.max())
    return out


def train_flops_summary(exp: EngineExperiment, trained_samples: int | None) -> Row:
    """The run's training arithmetic: ``samples_processed`` (samples of every gradient
    evaluation the engine ran, :attr:`~fedhp.models.base.BatchedModel.trained_samples`; also as
    ``train_samples``, its older, misleading name: it is not the training set's size, which is
    ``train_set_size``), ``train_flops_per_sample``
    (:meth:`~fedhp.models.base.BatchedModel.train_flops_per_sample`) and the product
    ``train_flops``; ``samples_processed`` and ``train_flops`` are None where the count is not
    known (rounds run on Flower nodes, a resumed checkpoint written before the count existed)."""
    per_sample = exp.model.train_flops_per_sample()
    return {
        "train_set_size": int(exp.ctx.fed.train.counts.sum()),
        "samples_processed": trained_samples,
        "train_samples": trained_samples,
        "train_flops_per_sample": per_sample,
        "train_flops": None if trained_samples is None else trained_samples * per_sample,
    }


def summarize(
    exp: EngineExperiment,
    rows: list[Row],
    seconds: float,
    rounds_done: int,
    trained_samples: int | None = None,
) -> Row:
    """summary.json: final and best accuracies, time, training FLOPs (``trained_samples``:
    see :func:`train_flops_summary`), communication totals."""
    summary: Row = {
        "algorithm": exp.cfg.algorithm.get("name"),
        "dataset": exp.cfg.dataset.get("name"),
        "model": resolved_section("model", exp.cfg.model),
        "num_params": exp.model.num_params,
        "rounds": rounds_done,
        "seed": exp.cfg.seed,
        "seconds": seconds,
        "seconds_per_round": seconds / max(rounds_done, 1),
        "torch_threads": torch.get_num_threads(),
        "gradient_evaluations_per_round": exp.options.gradient_evaluations(),
    }
    summary.update(local_work_summary(exp))
    summary.update(train_flops_summary(exp, trained_samples))
    summary.update(exp.algorithm.summary_notes())
    for key in ("global_acc", "personal_acc", "global_balanced_acc"):
        values = [(r["round"], r[key]) for r in rows if key in r]
        if values:
            best_round, best = max(values, key=lambda rv: rv[1])
            summary[f"final_{key}"] = values[-1][1]
            summary[f"best_{key}"] = best
            summary[f"best_{key}_round"] = best_round
    summary["communication"] = exp.ctx.ledger.totals()
    return {k: _clean(v) for k, v in summary.items()}
