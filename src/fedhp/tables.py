"""Results as tables: the mean and sample standard deviation over seeds, and a Markdown table.

Shared by the reproductions (:mod:`fedhp.experiments`), ``fedhp sweep``'s table
(:mod:`fedhp.sweep.report`) and ``fedhp compare``; plain Python, no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1 in the denominator; 0 for one value)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: the header row, the rule, then one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
