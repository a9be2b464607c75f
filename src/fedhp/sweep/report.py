"""A sweep's report, written into the sweep folder from its manifest (``sweep.json``) and its
runs' folders.

For the test-split runs: ``table.md`` and ``table.csv`` (one row per grid point, in the
manifest's order: the point's values, the seeds finished, mean ± standard error over seeds of
each accuracy in ``summary.json``, the mean best round, the accumulated bytes of all links in MB,
the training seconds, the runs that diverged) and ``curves.png`` (per point the mean accuracy
over seeds per round with a ± one standard error band, :mod:`fedhp.sweep.figures`; ``.pdf`` /
``.svg`` too as ``--format`` asks). With ``select: val`` the same for the validation-split
runs: ``val_table.md``, ``val_table.csv`` and ``val_curves.png``.

The standard error is the sample standard deviation over seeds / √n (0 for one seed). A run
without ``summary.json`` is unfinished and left out; a diverged run (``stopped`` in its summary)
counts with its results up to its last good round, and the ``stopped`` column says how many.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.reporting import (
    _format_cell,
    _parse_cell,
    read_rows,
    write_text_atomic,
)
from fedhp.sweep.figures import caption, plot_sweep
from fedhp.sweep.plan import MANIFEST
from fedhp.tables import markdown_table, mean_std

__all__ = ["ACC_KEYS", "load_table", "table_rows", "write_report"]

ACC_KEYS = ("final_global_acc", "best_global_acc", "final_personal_acc", "best_personal_acc")
"""The summary.json accuracies a table reports (those present in some run)."""
SPLIT_WORDS = {"test": "test", "val": "validation"}


@dataclass
class _Run:
    """One run of the manifest and what its folder holds (``summary`` None: unfinished)."""

    entry: Mapping[str, Any]
    folder: Path
    summary: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        return self.summary is not None and "stopped" in self.summary


@dataclass
class _Point:
    """One grid point's runs of one split."""

    id: str
    values: dict[str, Any]
    runs: list[_Run] = field(default_factory=list)

    @property
    def finished(self) -> list[_Run]:
        return [r for r in self.runs if r.summary is not None]


def _read_run(folder: Path, entry: Mapping[str, Any]) -> _Run:
    """A run's summary.json and metrics.csv (missing or unreadable files: unfinished, no rows)."""
    run = _Run(entry, folder / str(entry["out_dir"]))
    try:
        summary = json.loads((run.folder / "summary.json").read_text())
    except (OSError, ValueError):
        return run
    if isinstance(summary, dict):
        run.summary = summary
        try:
            run.rows = read_rows(run.folder / "metrics.csv")
        except (OSError, ValueError, csv.Error):
            run.rows = []
    return run


def _points(folder: Path, manifest: Mapping[str, Any], split: str) -> list[_Point]:
    """The runs of ``split`` grouped by grid point, in the manifest's order."""
    points: dict[str, _Point] = {}
    for entry in manifest.get("runs") or []:
        if entry.get("split", "test") != split:
            continue
        pid = str(entry.get("point", "base"))
        point = points.setdefault(pid, _Point(pid, dict(entry.get("values") or {})))
        point.runs.append(_read_run(folder, entry))
    return list(points.values())


def _number(value: Any) -> float | None:
    """A finite float, or None (missing, non-numeric, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and standard error (sample std / √n; 0 for one value); None, None for none."""
    if not values:
        return None, None
    mean, sd = mean_std(values)
    return mean, sd / math.sqrt(len(values))


def _total_bytes(run: _Run) -> float | None:
    """The last metrics.csv row's ``cum_bytes_total`` (else summary.json's total)."""
    for row in reversed(run.rows):
        value = _number(row.get("cum_bytes_total"))
        if value is not None:
            return value
    comm = (run.summary or {}).get("communication")
    return _number(comm.get("bytes_total")) if isinstance(comm, Mapping) else None


def _show(value: Any) -> str:
    """A grid value as one cell (``[500,200]``, ``0.1``, ``fedavg``, ``true``)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _acc_keys(points: Sequence[_Point], metric: str | None) -> list[str]:
    """The accuracies some finished run reports (and the selection metric, if numeric)."""
    summaries = [r.summary for p in points for r in p.finished if r.summary is not None]
    keys = [*ACC_KEYS, *([metric] if metric and metric not in ACC_KEYS else [])]
    return [k for k in keys if any(_number(s.get(k)) is not None for s in summaries)]


def _rows(
    points: Sequence[_Point],
    grid_keys: Sequence[str],
    acc_keys: Sequence[str],
    selected: str | None,
) -> list[dict[str, Any]]:
    """The table's rows as the CSV holds them (None: an empty cell)."""
    out = []
    for point in points:
        done = [r.summary for r in point.finished if r.summary is not None]
        row: dict[str, Any] = {"point": point.id}
        row.update({k: point.values.get(k) for k in grid_keys})
        row["selected"] = point.id == selected
        row["n"] = len(done)
        row["runs"] = len(point.runs)
        row["stopped"] = sum(r.stopped for r in point.runs)
        for key in acc_keys:
            values = [v for s in done if (v := _number(s.get(key))) is not None]
            row[f"{key}_mean"], row[f"{key}_se"] = _mean_se(values)
            if key.startswith("best_"):
                rounds = [v for s in done if (v := _number(s.get(f"{key}_round"))) is not None]
                row[f"{key}_round"] = _mean(rounds)
        mbs = [b / 1e6 for r in point.finished if (b := _total_bytes(r)) is not None]
        row["mb_total"] = _mean(mbs)
        row["seconds"] = _mean([v for s in done if (v := _number(s.get("seconds"))) is not None])
        out.append(row)
    return out


@dataclass
class _Table:
    """One split's table: its points, columns and rows."""

    points: list[_Point]
    grid_keys: list[str]
    acc_keys: list[str]
    rows: list[dict[str, Any]]

    @property
    def columns(self) -> list[str]:
        cols = ["point", *self.grid_keys, "selected", "n", "runs", "stopped"]
        for key in self.acc_keys:
            cols += [f"{key}_mean", f"{key}_se"]
            if key.startswith("best_"):
                cols.append(f"{key}_round")
        return [*cols, "mb_total", "seconds"]

    @property
    def unfinished(self) -> int:
        return sum(len(p.runs) - len(p.finished) for p in self.points)


def _table(folder: Path, manifest: Mapping[str, Any], split: str) -> _Table:
    points = _points(folder, manifest, split)
    grid_keys = list(manifest.get("grid") or {})
    selected = (manifest.get("selected") or {}).get("point")
    metric = manifest.get("metric") if split == "val" else None
    acc_keys = _acc_keys(points, metric)
    return _Table(points, grid_keys, acc_keys, _rows(points, grid_keys, acc_keys, selected))


def table_rows(
    folder: Path, manifest: Mapping[str, Any], split: str = "test"
) -> list[dict[str, Any]]:
    """The rows of ``split``'s table computed from the run folders, as :func:`load_table`
    reads them back from the CSV."""
    return _table(Path(folder), manifest, split).rows


def _csv_text(table: _Table) -> str:
    """The table as CSV: grid values as JSON text, floats in their shortest exact form."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(table.columns)
    for row in table.rows:
        cells = []
        for col in table.columns:
            value = row.get(col)
            if value is None:
                cells.append("")
            elif col == "point":
                cells.append(str(value))
            elif col in table.grid_keys:
                cells.append(_show(value))
            elif isinstance(value, bool):
                cells.append(str(int(value)))
            else:
                cells.append(_format_cell(value))
        out.writerow(cells)
    return buf.getvalue()


def _fmt_acc(key: str, mean: float | None, se: float | None) -> str:
    if mean is None or se is None:
        return "—"
    if "acc" in key:
        return f"{100 * mean:.2f} ± {100 * se:.2f}"
    return f"{mean:.4g} ± {se:.2g}"


def _fmt_round(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _fmt_mb(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def _fmt_score(metric: str, score: Any) -> str:
    value = _number(score)
    if value is None:
        return "none (every run of every point diverged or is missing)"
    return f"{100 * value:.2f} %" if "acc" in metric else f"{value:.4g}"


def _markdown(
    manifest: Mapping[str, Any],
    split: str,
    table: _Table,
    tie: str | None = None,
) -> str:
    """The header lines (``tie``: the selection's tie line) and the table."""
    rows, acc_keys, unfinished = table.rows, table.acc_keys, table.unfinished
    grid = manifest.get("grid") or {}
    grid_keys = list(grid)
    seeds = list(manifest.get("seeds") or [])
    base = list(manifest.get("base") or [])
    metric = str(manifest.get("metric") or "final_global_acc")
    selected = manifest.get("selected")
    words = SPLIT_WORDS.get(split, split)
    evaluated = {
        str(r.get("eval_split") or r.get("split"))
        for r in manifest.get("runs") or []
        if r.get("split") == split
    }
    on_val_unselected = split == "test" and evaluated == {"val"}
    if on_val_unselected:
        words = SPLIT_WORDS["val"]
    lines = [f"# Sweep: {words} split", ""]
    lines.append(f"- base: {' '.join(f'`{b}`' for b in base) if base else '(the defaults)'}")
    if manifest.get("plugins"):
        lines.append(f"- plugins: {', '.join(str(p) for p in manifest['plugins'])}")
    if grid:
        axes = "; ".join(f"`{k}` ∈ {{{', '.join(_show(v) for v in vs)}}}" for k, vs in grid.items())
        lines.append(f"- grid: {axes}")
    lines.append(f"- seeds: {', '.join(str(s) for s in seeds)} ({len(seeds)} per point)")
    if selected:
        point, score = selected.get("point"), _fmt_score(metric, selected.get("score"))
        if split == "val":
            lines.append(
                f"- every grid point on the validation split; selection metric: `{metric}` "
                f"(mean over seeds; for the selection a diverged run counts as −∞). "
                f"Selected (✓): **{point}** (score {score}); table.md reports its test runs."
            )
        else:
            lines.append(
                f"- selected on the validation split by the mean `{metric}` over seeds: "
                f"**{point}** (score {score}; val_table.md lists every point). This table "
                "reports that point's test runs."
            )
        if tie:
            lines.append(tie)
    elif manifest.get("select") == "val":
        lines.append(f"- selection on the validation split by `{metric}`: not made yet")
    if on_val_unselected:
        lines.append(
            "- every run evaluates on the validation split, as its base config says "
            "(`eval_split=val`); no point is selected or re-run on test (`--select val` does)"
        )
    lines.append(
        "- accuracies in %: mean ± standard error over the finished seeds (sample std / √n); "
        "best round: mean round of the best accuracy; MB: accumulated bytes on all links "
        "(metrics.csv `cum_bytes_total`), mean; seconds: training wall-clock, mean; stopped: "
        "runs that diverged (counted with their results up to the last good round)"
    )
    if any(row["n"] == 1 for row in rows):
        lines.append("- n = 1: ± 0.00 is no spread estimate (the standard error needs 2 seeds)")
    lines.append(caption(split, "val_curves" if split == "val" else "curves"))
    if unfinished:
        lines.append(f"- unfinished: {unfinished} run(s) without summary.json, not counted in n")
    if not rows:
        lines.append(f"- no {words}-split runs in this sweep")
    lines.append("")
    header = [*(grid_keys or ["point"])]
    if selected:
        header.insert(0, "selected")
    header.append("n")
    for key in acc_keys:
        header.append(f"{key} (%)" if "acc" in key else key)
        if key.startswith("best_"):
            header.append(f"{key} round")
    header += ["MB", "seconds", "stopped"]
    cells = []
    for row in rows:
        line = [_show(row[k]) if row[k] is not None else "" for k in grid_keys] or [row["point"]]
        if selected:
            line.insert(0, "✓" if row["selected"] else "")
        line.append(str(row["n"]) if row["n"] == row["runs"] else f"{row['n']}/{row['runs']}")
        for key in acc_keys:
            line.append(_fmt_acc(key, row[f"{key}_mean"], row[f"{key}_se"]))
            if key.startswith("best_"):
                line.append(_fmt_round(row[f"{key}_round"]))
        secs = row["seconds"]
        line += [_fmt_mb(row["mb_total"]), "—" if secs is None else f"{secs:.1f}"]
        line.append(str(row["stopped"]))
        cells.append(line)
    return "\n".join(lines) + "\n" + markdown_table(header, cells)


def _write_split(
    folder: Path, manifest: Mapping[str, Any], split: str, prefix: str, formats: Sequence[str]
) -> list[Path]:
    table = _table(folder, manifest, split)
    selected = (manifest.get("selected") or {}).get("point")
    md, csv_path, png = (
        folder / f"{prefix}{name}" for name in ("table.md", "table.csv", "curves.png")
    )
    write_text_atomic(md, _markdown(manifest, split, table, _tie(folder, manifest)))
    write_text_atomic(csv_path, _csv_text(table))
    figures = plot_sweep(table.points, split, selected, png, formats)
    return [md, csv_path, *figures]


def _tie(folder: Path, manifest: Mapping[str, Any]) -> str | None:
    """The line stating a tie of the selected point on the validation split (None: none)."""
    from fedhp.sweep.selection import point_score, tie_line

    selected = (manifest.get("selected") or {}).get("point")
    if not selected:
        return None
    metric = str(manifest.get("metric") or "final_global_acc")
    points = _points(folder, manifest, "val")
    scores = {p.id: point_score([r.summary for r in p.runs], metric) for p in points}
    return tie_line(scores, str(selected), metric)


def write_report(
    folder: Path, manifest: Mapping[str, Any], formats: Sequence[str] = ("png",)
) -> list[Path]:
    """Write the sweep's tables and figures into ``folder`` (see the module's docstring);
    returns the files written: table.md, table.csv, curves.png (and curves.pdf / curves.svg
    as ``formats`` names them), then the same with ``val_`` where the manifest has
    validation-split runs."""
    folder = Path(folder)
    written = _write_split(folder, manifest, "test", "", formats)
    if any(r.get("split") == "val" for r in manifest.get("runs") or []):
        written += _write_split(folder, manifest, "val", "val_", formats)
    return written


def load_table(folder: Path) -> list[dict[str, Any]]:
    """The test table's rows (``table.csv``) as dicts: ``point``, one key per grid key (its
    value as given), ``selected`` (bool), ``n``, ``runs``, ``stopped``, ``<acc>_mean``,
    ``<acc>_se``, ``best_<...>_round``, ``mb_total``, ``seconds`` (None: an empty cell)."""
    folder = Path(folder)
    path = folder / "table.csv"
    if not path.is_file():
        raise ConfigError(f"{folder}: no table.csv (not a finished fedhp sweep folder)")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        grid_keys = set(manifest.get("grid") or {})
    except (OSError, ValueError, AttributeError):
        grid_keys = set()
    with path.open(newline="", encoding="utf-8") as fh:
        raw = list(csv.DictReader(fh))
    rows = []
    for record in raw:
        row: dict[str, Any] = {}
        for key, text in record.items():
            if key is None:
                continue
            if text == "" or text is None:
                row[key] = None
            elif key == "point":
                row[key] = text
            elif key == "selected":
                row[key] = text == "1"
            elif key in grid_keys:
                try:
                    row[key] = json.loads(text)
                except ValueError:
                    row[key] = text
            else:
                row[key] = _parse_cell(text)
        rows.append(row)
    return rows
