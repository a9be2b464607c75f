"""The pieces the sFedHP paper's table reproductions (``sfedhp-table1``, ``sfedhp-lambda``) share:
one row's cells, our accuracies next to the paper's numbers, and the page around the table."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedhp.experiments.common import ReproOptions, describe, paper_cell, pct, table_result
from fedhp.tables import markdown_table

MODEL_WORDS = {"global": "GM", "personal": "PM"}


def row_header(hp: str, models: Sequence[str], paper: Sequence[str]) -> list[str]:
    """The titles of :func:`row_cells`' columns (``hp``: the hyperparameters' title)."""
    return [
        "Method",
        hp,
        "grad. evals / client / round",
        *(f"{MODEL_WORDS[model]} {when} (%)" for model in models for when in ("final", "best")),
        *paper,
    ]


def row_cells(
    label: str,
    hp: str,
    row: Mapping[str, Any],
    models: Sequence[str],
    paper: Sequence[Any],
    cell: Callable[[Any], str] = pct,
) -> list[str]:
    """The method (`` (diverged)`` where a seed stopped), its hyperparameters, its gradient
    evaluations, the final and best accuracy of each of ``models`` (``global`` / ``personal``;
    written by ``cell``: mean ± std unless given) and the paper's numbers."""
    return [
        label + (" (diverged)" if row.get("stopped") else ""),
        hp,
        str(row["gradient_evaluations_per_round"]),
        *(cell(row[f"{when}_{model}_acc"]) for model in models for when in ("final", "best")),
        *(paper_cell(value) for value in paper),
    ]


def table_page(
    opts: ReproOptions,
    title: str,
    note: str,
    header: Sequence[str],
    lines: Sequence[Sequence[str]],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """The table as data (:func:`fedhp.experiments.common.table_result`) with its Markdown: the
    title, what was run, ``note`` and the table."""
    text = f"# {title}\n\n{describe(opts)}\n\n{note}\n\n" + markdown_table(header, lines)
    return table_result(opts, rows, text)
