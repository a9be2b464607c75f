"""What ``--select val`` chose and how: each grid point's score (the mean over its seeds of the
metric, a diverged run or a missing value counting as −∞) and the tie rule (the earliest point
in the grid's order), stated in the table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TIE_RULE", "point_score", "tie_line"]

TIE_RULE = "the earliest point in the grid's order is selected"


def point_score(summaries: Sequence[Mapping[str, Any] | None], metric: str) -> float:
    """A point's score: the mean of ``metric`` over its runs' summaries (a diverged run, an
    unfinished one or a missing or non-finite value counts as −∞); −∞ for no runs."""
    values = []
    for summary in summaries:
        value = None if summary is None or "stopped" in summary else summary.get(metric)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        values.append(float(value) if ok and math.isfinite(value) else -math.inf)  # type: ignore[arg-type]
    return statistics.fmean(values) if values else -math.inf


def tie_line(scores: Mapping[str, float], selected: str, metric: str) -> str | None:
    """A table line saying which points tie with the selected one and the rule that chose it
    (None: no tie)."""
    if selected not in scores:
        return None
    best = scores[selected]
    tied = [point for point, score in scores.items() if score == best]
    if len(tied) < 2:
        return None
    if best == -math.inf:
        return (
            f"- tie: no point has a score (every run diverged or lacks `{metric}`); "
            f"{TIE_RULE}: **{selected}**"
        )
    shown = f"{100 * best:.2f} %" if "acc" in metric else f"{best:.6g}"
    return (
        f"- tie: {', '.join(f'**{p}**' for p in tied)} have the same mean `{metric}` "
        f"({shown}); {TIE_RULE}: **{selected}**"
    )
