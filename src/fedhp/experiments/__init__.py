"""Reproductions of the sFedHP, Fed-HT, FNR-FL and FedLPS papers' tables and figures, the
robust-aggregation study and the client-level DP curve of issue 20 (``fedhp reproduce NAME``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fedhp.experiments.common import ReproOptions


def _reproduce(module: str, *args: str) -> Callable[[ReproOptions], Any]:
    """``fedhp.experiments.MODULE.reproduce(opts, *args)``, the module imported at the call (a
    command imports only the experiment it runs)."""

    def run(opts: ReproOptions) -> Any:
        return importlib.import_module(f"fedhp.experiments.{module}").reproduce(opts, *args)

    return run


REPRODUCTIONS: dict[str, Callable[[ReproOptions], Any]] = {
    "sfedhp-table1": _reproduce("table1"),
    "sfedhp-lambda": _reproduce("lambda_sweep"),
    "sfedhp-figures": _reproduce("figures"),
    "sfedhp-tune": _reproduce("tune"),
    "fedht-sim1": _reproduce("fedht", "sim1"),
    "fedht-sim2": _reproduce("fedht", "sim2"),
    "fedht-mnist": _reproduce("fedht", "mnist"),
    "fedht-libsvm": _reproduce("fedht", "libsvm"),
    "fedht-noiseless": _reproduce("fedht", "noiseless"),
    "fnrfl-table2": _reproduce("fnrfl"),
    "fedlps-table1": _reproduce("fedlps", "table1"),
    "fedlps-ablation": _reproduce("fedlps", "ablation"),
    "robust": _reproduce("robust"),
    "robust-paper": _reproduce("robust_paper"),
    "dp": _reproduce("dp"),
    "leaf-shakespeare": _reproduce("leaf"),
}

__all__ = ["REPRODUCTIONS", "ReproOptions"]
