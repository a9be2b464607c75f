"""The sweep's figure (``curves.png``; ``--format`` adds ``curves.pdf`` / ``curves.svg``): one
panel per accuracy column some run has (global model, personalized models), per grid point the
mean over its finished seeds per round with a ± one standard error band — the table's own spread
(sample std / √n) — in the table's units (accuracy in %). Every panel has a legend naming the
points by their short names (``λ = 15, μ = 0.01``); the selected point is drawn bold. No title:
the caption line of ``table.md`` (:func:`caption`) says what is drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from matplotlib.figure import Figure

from fedhp.reporting import Line, draw_lines, paper_style, save_figure, short_label, short_names
from fedhp.tables import mean_std

__all__ = [
    "CURVE_COLUMNS",
    "PANEL_TITLES",
    "caption",
    "curve",
    "plot_sweep",
    "point_labels",
    "sweep_figure",
]

CURVE_COLUMNS = ("global_acc", "personal_acc")
"""The metrics.csv columns drawn, one panel each (those some finished run has)."""
PANEL_TITLES = {"global_acc": "global model", "personal_acc": "personalized models"}
SPLIT_WORDS = {"test": "test", "val": "validation"}


class _RunRows(Protocol):
    rows: list[dict[str, Any]]


class _SweepPoint(Protocol):
    id: str
    values: dict[str, Any]

    @property
    def finished(self) -> Sequence[_RunRows]: ...


def _number(value: Any) -> float | None:
    """A finite float, or None (missing, non-numeric, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def curve(runs: Sequence[_RunRows], column: str) -> tuple[list[float], list[float], list[float]]:
    """(rounds, mean, standard error) of ``column`` over the runs that have it, on the rounds
    every one of them has (the standard error: sample std / √n, 0 for one run)."""
    series = []
    for run in runs:
        by_round = {}
        for row in run.rows:
            x, y = _number(row.get("round")), _number(row.get(column))
            if x is not None and y is not None:
                by_round[x] = y
        if by_round:
            series.append(by_round)
    if not series:
        return [], [], []
    common = sorted(set.intersection(*(set(s) for s in series)))
    means, ses = [], []
    for x in common:
        mean, sd = mean_std([s[x] for s in series])
        means.append(mean)
        ses.append(sd / math.sqrt(len(series)))
    return common, means, ses


def point_labels(points: Sequence[_SweepPoint]) -> dict[str, str]:
    """Each point's legend label from its grid values (``$\\lambda$ = 15``); its id where the
    points have no grid values (a sweep of seeds only)."""
    keys = list(dict.fromkeys(k for p in points for k in p.values))
    names = short_names(keys)
    return {p.id: short_label(p.values, names) or p.id for p in points}


def _seeds_word(points: Sequence[_SweepPoint]) -> str:
    counts = {len(p.finished) for p in points if p.finished}
    if len(counts) == 1:
        n = counts.pop()
        return f"{n} seed{'s' if n != 1 else ''}"
    return "seeds"


def caption(split: str = "test", name: str = "curves") -> str:
    """The line of ``table.md`` that says what the figure draws and which spread its band is."""
    words = SPLIT_WORDS.get(split, split)
    return (
        f"- figure `{name}.png` (with `--format`, also .pdf/.svg): {words} accuracy (%) per "
        "round, per grid point the mean over its finished seeds ± one standard error (sample "
        "std / √n, the table's spread) as a band"
    )


def plot_sweep(
    points: Sequence[_SweepPoint],
    split: str,
    selected: str | None,
    out_png: Path,
    formats: Sequence[str] = ("png",),
) -> list[Path]:
    """Draw the sweep's figure (see the module's docstring) and write it as ``out_png`` with
    each suffix of ``formats``; the files written."""
    with paper_style():
        return save_figure(sweep_figure(points, split, selected), out_png, formats)


def sweep_figure(points: Sequence[_SweepPoint], split: str, selected: str | None) -> Figure:
    """The figure :func:`plot_sweep` writes (make it within :func:`~fedhp.reporting.paper_style`
    for the printed page's fonts)."""
    labels = point_labels(points)
    panels: list[tuple[str, list[Line]]] = []
    for column in CURVE_COLUMNS:
        lines = []
        for point in points:
            xs, ys, ses = curve(point.finished, column)
            if not xs:
                continue
            label = labels[point.id] + (" (selected)" if point.id == selected else "")
            lines.append(
                Line(
                    label,
                    xs,
                    [100 * y for y in ys],
                    std=[100 * se for se in ses],
                    width=2.4 if point.id == selected else 1.4,
                    marker="." if len(xs) < 30 else "",
                )
            )
        if lines:
            panels.append((column, lines))
    words = SPLIT_WORDS.get(split, split)
    ylabel = f"{words} accuracy (%)"
    legend_title = f"mean ± s.e., {_seeds_word(points)}"
    count = max(len(panels), 1)
    fig = Figure(figsize=(3.5 * count, 2.8))
    axes = fig.subplots(1, count, squeeze=False)[0]
    if not panels:
        draw_lines(axes[0], [], "round", ylabel, title="no finished runs", integer_x=True)
    for ax, (column, lines) in zip(axes, panels, strict=False):
        title = PANEL_TITLES.get(column, column)
        draw_lines(ax, lines, "round", ylabel, title=title, integer_x=True)
        _legend(ax, len(lines), legend_title)
    fig.tight_layout()
    return fig


def _legend(ax: Any, entries: int, title: str) -> None:
    """A legend on this panel: small, titled with the band's spread, two columns when long."""
    ax.legend(
        title=title,
        fontsize="x-small" if entries > 6 else "small",
        title_fontsize="x-small" if entries > 6 else "small",
        ncol=2 if entries > 6 else 1,
        frameon=True,
        framealpha=0.8,
    )
