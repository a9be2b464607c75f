"""Reproductions of the sFedHP, Fed-HT, FNR-FL and FedLPS papers' tables and figures, the
robust-aggregation study and the client-level DP curve of issue 20 (``fedhp reproduce NAME``)."""

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


def _fedht(name: str) -> Callable[[ReproOptions], Any]:
    def run(opts: ReproOptions) -> Any:
        from fedhp.experiments import fedht

        return fedht.reproduce(opts, name)

    return run


def _fnrfl(opts: ReproOptions) -> Any:
    from fedhp.experiments import fnrfl

    return fnrfl.reproduce(opts)


def _fedlps(experiment: str) -> Callable[[ReproOptions], Any]:
    def run(opts: ReproOptions) -> Any:
        from fedhp.experiments import fedlps

        return fedlps.reproduce(opts, experiment)

    return run


def _robust(opts: ReproOptions) -> Any:
    from fedhp.experiments import robust

    return robust.reproduce(opts)


def _leaf(opts: ReproOptions) -> Any:
    from fedhp.experiments import leaf

    return leaf.reproduce(opts)


def _dp(opts: ReproOptions) -> Any:
    from fedhp.experiments import dp

    return dp.reproduce(opts)


REPRODUCTIONS: dict[str, Callable[[ReproOptions], Any]] = {
    "sfedhp-table1": _table1,
    "sfedhp-lambda": _lambda,
    "sfedhp-figures": _figures,
    "sfedhp-tune": _tune,
    "fedht-sim1": _fedht("sim1"),
    "fedht-sim2": _fedht("sim2"),
    "fedht-mnist": _fedht("mnist"),
    "fedht-libsvm": _fedht("libsvm"),
    "fedht-noiseless": _fedht("noiseless"),
    "fnrfl-table2": _fnrfl,
    "fedlps-table1": _fedlps("table1"),
    "fedlps-ablation": _fedlps("ablation"),
    "robust": _robust,
    "dp": _dp,
    "leaf-shakespeare": _leaf,
}

__all__ = ["REPRODUCTIONS", "ReproOptions"]
