"""Reproductions of the sFedHP paper's tables and figures (``fedhp reproduce NAME``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedhp.experiments.common import ReproOptions


def _table1(opts: ReproOptions) -> Any:
    from fedhp.experiments import table1

    return table1.reproduce(opts)


def _lambda(opts: ReproOptions) -> Any:
    from fedhp.experiments import lambda_sweep

    return lambda_sweep.reproduce(opts)


def _figures(opts: ReproOptions) -> Any:
    from fedhp.experiments import figures

    return figures.reproduce(opts)


def _tune(opts: ReproOptions) -> Any:
    from fedhp.experiments import tune

    return tune.reproduce(opts)


REPRODUCTIONS: dict[str, Callable[[ReproOptions], Any]] = {
    "sfedhp-table1": _table1,
    "sfedhp-lambda": _lambda,
    "sfedhp-figures": _figures,
    "sfedhp-tune": _tune,
}

__all__ = ["REPRODUCTIONS", "ReproOptions"]
