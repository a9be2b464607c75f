"""Results-folder writers: metrics.csv, JSON/YAML files and PNG plots.

Every file is written atomically (temporary file in the same folder, fsync, ``os.replace``), so a
crash leaves either the old or the new file, never a half-written one. Plots use matplotlib's Agg
canvas directly (``matplotlib.figure.Figure``), so they never touch pyplot's global state or the
user's backend choice.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Value = float | int | str


def _atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` atomically: ``write`` fills a temporary file that then replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Persist the rename itself (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    data = text.encode("utf-8")
    _atomic_write(path, lambda fh: fh.write(data))


def _json_default(obj: Any) -> Any:
    """Serialize numpy/torch scalars and arrays, paths and sets."""
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if hasattr(obj, "tolist"):  # numpy arrays/scalars, torch tensors
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serializable")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    _atomic_write_text(Path(path), json.dumps(obj, indent=2, default=_json_default) + "\n")


def write_yaml_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as YAML (keys in insertion order) to ``path`` atomically."""
    _atomic_write_text(Path(path), yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))


def _parse_cell(text: str) -> Value:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _format_cell(value: Value) -> str:
    if isinstance(value, float):
        return repr(value)  # shortest round-trip form; nan/inf read back with float()
    return str(value)


class MetricsWriter:
    """Append-only ``metrics.csv`` whose header is the union of all row keys.

    ``path`` is the CSV file, or a folder (then ``folder/metrics.csv``). The column order is
    ``round`` first, then keys in the order they were first seen. The whole file is rewritten
    atomically on every :meth:`append`, so it is always complete. A fresh writer replaces any
    existing file on its first append; use :meth:`resume` to continue one.
    """

    def __init__(self, path: Path) -> None:
        path = Path(path)
        self.path = path if path.suffix == ".csv" else path / "metrics.csv"
        self._rows: list[dict[str, Value]] = []
        self._columns: list[str] = ["round"]

    @classmethod
    def resume(cls, path: Path, round: int) -> MetricsWriter:
        """Reopen an existing file, keeping only rows with ``round <= round``.

        The trimmed file is written back at once, so rows from after the checkpoint are gone
        even if no new row is appended. A missing file gives an empty writer.
        """
        writer = cls(path)
        if writer.path.exists():
            with writer.path.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                for name in reader.fieldnames or []:
                    if name not in writer._columns:
                        writer._columns.append(name)
                for raw in reader:
                    row = {k: _parse_cell(v) for k, v in raw.items() if k is not None and v != ""}
                    r = row.get("round")
                    if isinstance(r, int | float) and r > round:
                        continue
                    writer._rows.append(row)
            writer._flush()
        return writer

    @property
    def rows(self) -> list[dict[str, Value]]:
        """A copy of the rows written so far."""
        return [dict(r) for r in self._rows]

    @property
    def columns(self) -> list[str]:
        """The current header."""
        return list(self._columns)

    def append(self, row: Mapping[str, Value]) -> None:
        """Add one row and rewrite the file atomically."""
        self.extend([row])

    def extend(self, rows: Iterable[Mapping[str, Value]]) -> None:
        """Add several rows with one atomic rewrite."""
        for row in rows:
            for key in row:
                if key not in self._columns:
                    self._columns.append(key)
            self._rows.append(dict(row))
        self._flush()

    def _flush(self) -> None:
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(self._columns)
        for row in self._rows:
            out.writerow([_format_cell(row[c]) if c in row else "" for c in self._columns])
        _atomic_write_text(self.path, buf.getvalue())


def _to_float(value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip():
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _series(rows: list[dict[str, Any]], column: str) -> tuple[list[float], list[float]]:
    """(x, y) of ``column`` against ``round`` (row index if absent), dropping missing/NaN."""
    xs: list[float] = []
    ys: list[float] = []
    for i, row in enumerate(rows):
        y = _to_float(row.get(column))
        x = _to_float(row.get("round", i))
        if math.isfinite(y) and math.isfinite(x):
            xs.append(x)
            ys.append(y)
    return xs, ys


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def _save(fig: Figure, out_png: Path) -> None:
    FigureCanvasAgg(fig)
    _atomic_write(Path(out_png), lambda fh: fig.savefig(fh, format="png", dpi=110))


def plot_run(metrics_rows: list[dict[str, Any]], out_png: Path, title: str) -> None:
    """Two-panel PNG: ``*_acc`` columns and accumulated ``cum_bytes_*`` (in MB) over rounds.

    Missing, empty or NaN cells are skipped; a panel without data says so.
    """
    cols = _columns(metrics_rows)
    fig = Figure(figsize=(11, 4.2))
    ax_acc, ax_comm = fig.subplots(1, 2)
    panels = (
        (ax_acc, [c for c in cols if c.endswith("_acc")], 1.0, "accuracy"),
        (ax_comm, [c for c in cols if c.startswith("cum_bytes_")], 1e6, "accumulated MB (10^6 B)"),
    )
    for ax, names, scale, ylabel in panels:
        plotted = False
        for name in names:
            xs, ys = _series(metrics_rows, name)
            if xs:
                ax.plot(xs, [y / scale for y in ys], label=name, marker="." if len(xs) < 30 else "")
                plotted = True
        if plotted:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, out_png)


def plot_curves(
    series: dict[str, tuple[list[float], list[float]]],
    out_png: Path,
    xlabel: str,
    ylabel: str,
    title: str,
    logy: bool = False,
) -> None:
    """One line per entry of ``series`` (label -> (x, y)), written as a PNG; ``logy``: log y."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), label=label)
    if series:
        ax.legend(fontsize="small")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _save(fig, out_png)
