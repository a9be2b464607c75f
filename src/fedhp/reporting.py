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
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Value = float | int | str


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside ``path``, created like any file the user creates
    (mode 0666 minus the umask; ``tempfile.mkstemp`` would make it 0600), open to read and
    write."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


_TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{8}\.tmp$")


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete the temporary files that atomic writes killed midway (SIGKILL, power loss) left
    in ``folder`` (``.<name>.<8 hex>.tmp``, :func:`_create_temp`'s names); the paths removed.
    For the process that owns the folder, before it writes there."""
    removed: list[Path] = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for path in entries:
        if _TEMP_NAME.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` atomically: ``write`` fills a temporary file (open to read back too) that
    then replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "w+b") as fh:
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


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")
    _atomic_write(Path(path), lambda fh: fh.write(data))


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
    write_text_atomic(Path(path), json.dumps(obj, indent=2, default=_json_default) + "\n")


def write_yaml_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as YAML (keys in insertion order) to ``path`` atomically."""
    write_text_atomic(Path(path), yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))


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


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, Value]]]:
    with Path(path).open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = [
            {k: _parse_cell(v) for k, v in raw.items() if k is not None and v != ""}
            for raw in reader
        ]
        return list(reader.fieldnames or []), rows


def read_rows(path: Path) -> list[dict[str, Value]]:
    """The rows of a CSV file written by :class:`MetricsWriter` (numbers parsed, empty cells
    left out)."""
    return _read_csv(path)[1]


class MetricsWriter:
    """Append-only ``metrics.csv`` whose header is the union of all row keys.

    ``path`` is the CSV file, or a folder (then ``folder/metrics.csv``). The column order is
    ``round`` first, then keys in the order they were first seen. The whole file is rewritten
    atomically, so it is always complete: on every :meth:`append`, or with ``min_interval`` > 0
    at most once per ``min_interval`` seconds (rows appended in between wait for the next
    rewrite or :meth:`flush`). Rows are formatted once, when appended (again only when a new
    column appears). A fresh writer replaces any existing file on its first append; use
    :meth:`resume` to continue one.
    """

    def __init__(self, path: Path, min_interval: float = 0.0) -> None:
        path = Path(path)
        self.path = path if path.suffix == ".csv" else path / "metrics.csv"
        self.min_interval = min_interval
        self._rows: list[dict[str, Value]] = []
        self._columns: list[str] = ["round"]
        self._text: list[str] = []  # the formatted rows, under the current header
        self._pending = False  # rows not in the file yet
        self._last_write = -math.inf  # time.monotonic() of the last rewrite

    @classmethod
    def resume(cls, path: Path, round: int, min_interval: float = 0.0) -> MetricsWriter:
        """Reopen an existing file, keeping only rows with ``round <= round``.

        The trimmed file is written back at once, so rows from after the checkpoint are gone
        even if no new row is appended. A missing file gives an empty writer.
        """
        writer = cls(path, min_interval)
        if writer.path.exists():
            columns, rows = _read_csv(writer.path)
            writer._columns += [c for c in columns if c not in writer._columns]
            for row in rows:
                r = row.get("round")
                if isinstance(r, int | float) and r > round:
                    continue
                writer._rows.append(row)
            writer._text = [writer._format(writer._rows)]
            writer._write()
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
        """Add one row and rewrite the file atomically (see ``min_interval``)."""
        self.extend([row])

    def extend(self, rows: Iterable[Mapping[str, Value]]) -> None:
        """Add several rows with one atomic rewrite (see ``min_interval``)."""
        new = [dict(row) for row in rows]
        columns = len(self._columns)
        for row in new:
            self._columns += [key for key in row if key not in self._columns]
        self._rows += new
        if len(self._columns) > columns:  # a new column: every row gets its empty cells
            self._text = [self._format(self._rows)]
        else:
            self._text.append(self._format(new))
        self._pending = True
        if time.monotonic() - self._last_write >= self.min_interval:
            self._write()

    def flush(self) -> None:
        """Rewrite the file now if some rows are not in it yet."""
        if self._pending:
            self._write()

    def _format(self, rows: Iterable[Mapping[str, Value]]) -> str:
        """``rows`` as CSV lines under the current header."""
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        for row in rows:
            out.writerow([_format_cell(row[c]) if c in row else "" for c in self._columns])
        return buf.getvalue()

    def _write(self) -> None:
        header = self._format([{c: c for c in self._columns}])
        write_text_atomic(self.path, header + "".join(self._text))
        self._text = ["".join(self._text)]
        self._pending = False
        self._last_write = time.monotonic()


def _to_float(value: object) -> float:
    if isinstance(value, int | float):  # (bool too)
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


FIGURE_FORMATS = ("png", "pdf", "svg")
"""The file name extensions a figure may have (``fedhp compare --out``); anything else is PNG."""


FIXED_METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "pdf": {"CreationDate": None, "Producer": None, "Creator": None},
    "svg": {"Date": None, "Creator": None},
}
"""No creation date or tool version in a figure file: the same figure, the same bytes."""


def _save(fig: Figure, out_png: Path, dpi: int = 110) -> None:
    """Write ``fig`` in the format its extension names (:data:`FIGURE_FORMATS`, else PNG)."""
    FigureCanvasAgg(fig)
    kind = Path(out_png).suffix.lower().lstrip(".")
    kind = kind if kind in FIGURE_FORMATS else "png"
    meta = FIXED_METADATA[kind]
    _atomic_write(Path(out_png), lambda fh: fig.savefig(fh, format=kind, dpi=dpi, metadata=meta))


def parse_formats(text: str | Sequence[str] | None, flag: str = "--format") -> list[str]:
    """The figure formats of ``png,pdf,svg`` (a comma list, or a list), in that order,
    duplicates dropped; None: ``["png"]``; else a one-line :class:`ConfigError` naming
    ``flag``."""
    from fedhp.errors import ConfigError

    if text is None:
        return ["png"]
    items = text.split(",") if isinstance(text, str) else [str(t) for t in text]
    kinds = [t.strip().lower().lstrip(".") for t in items]
    if not kinds or any(not k for k in kinds):
        raise ConfigError(f"{flag} {text!r}: name formats among {','.join(FIGURE_FORMATS)}")
    bad = [k for k in kinds if k not in FIGURE_FORMATS]
    if bad:
        raise ConfigError(
            f"{flag} {bad[0]}: not a figure format; choose among {','.join(FIGURE_FORMATS)} "
            "(e.g. --format png,pdf)"
        )
    return [k for k in FIGURE_FORMATS if k in kinds]


PAPER_STYLE: dict[str, Any] = {
    "font.size": 9.0,
    "axes.titlesize": 9.0,
    "axes.labelsize": 9.0,
    "legend.fontsize": 8.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "pdf.fonttype": 42,  # TrueType in PDFs (journals refuse Type 3 fonts)
    "svg.hashsalt": "fedhp",  # the same SVG ids every time
}
"""Figure sizes and fonts for a printed page (the sweep's and ``fedhp compare``'s figures)."""
PAPER_DPI = 200


def save_figure(fig: Figure, out: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Write ``fig`` as ``out`` with each suffix of ``formats`` (``png``: at
    :data:`PAPER_DPI`); the files written. Call within :func:`paper_style`."""
    written = []
    for kind in formats:
        same = Path(out).suffix.lower() == f".{kind}"
        path = Path(out) if same else Path(out).with_suffix(f".{kind}")
        _save(fig, path, dpi=PAPER_DPI)
        written.append(path)
    return written


@contextmanager
def paper_style() -> Iterator[None]:
    """:data:`PAPER_STYLE` while a figure is made and saved (matplotlib's settings are global:
    held under the plotting lock, so a run's plot.png drawn in another thread waits)."""
    import matplotlib

    with _PLOT_LOCK, matplotlib.rc_context(PAPER_STYLE):  # type: ignore[arg-type]
        yield


MATH_NAMES = {
    "lam": r"\lambda",
    "mu": r"\mu",
    "lr": r"\eta",
    "edge_lr": r"\eta_{\mathrm{edge}}",
    "personal_lr": r"\eta_{\mathrm{pers}}",
    "beta": r"\beta",
    "alpha": r"\alpha",
    "rho": r"\rho",
    "tau": r"\tau",
    "sigma": r"\sigma",
    "gamma": r"\gamma",
    "gamma1": r"\gamma_1",
    "gamma2": r"\gamma_2",
    "noise_multiplier": r"\sigma",
    "K": "K",
    "R": "R",
}
"""Options drawn as their symbol in legends (``$\\lambda$ = 15``); others by their name."""


def short_value(value: Any) -> str:
    """A value as a legend or table shows it: ``15`` for 15.0, ``0.01``, ``1e-05``,
    ``[500,200]``, ``fedavg``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int | str):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted option key's short name for a legend: its symbol (:data:`MATH_NAMES`, as
    mathtext), else its last part with spaces; the whole key where two would read the same;
    ``""`` for a component's ``name`` (the value says it)."""
    out = {}
    for key in keys:
        last = key.split(".")[-1]
        if last == "name":
            out[key] = ""
        elif last in MATH_NAMES:
            out[key] = f"${MATH_NAMES[last]}$"
        else:
            out[key] = last.replace("_", " ")
    named = [n for n in out.values() if n]
    return {k: (k if n and named.count(n) > 1 else n) for k, n in out.items()}


def short_label(values: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """``$\\lambda$ = 15, $\\mu$ = 0.01`` for ``values`` (dotted key → value) with
    ``names`` from :func:`short_names`."""
    parts = []
    for key, value in values.items():
        text = short_value(value).replace("$", r"\$")
        name = names.get(key, key)
        parts.append(f"{name} = {text}" if name else text)
    return ", ".join(parts)


@dataclass
class Line:
    """One curve: ``y`` over ``x``; ``std``: a shaded ``y ± std`` band; ``width`` / ``color`` /
    ``alpha``: matplotlib's defaults when None."""

    label: str | None
    x: Sequence[float]
    y: Sequence[float]
    std: Sequence[float] | None = None
    width: float | None = None
    color: str | None = None
    alpha: float | None = None
    marker: str = ""


def draw_lines(
    ax: Any,
    lines: Sequence[Line],
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    log_y: bool = False,
    no_data: str | None = "no data",
    integer_x: bool | None = None,
) -> None:
    """Draw ``lines`` on ``ax`` with a legend and grid (``no_data`` written when none has any
    point).

    The one line-drawing routine of fedhp: run plots, ``fedhp compare`` and the reproductions'
    figures all go through it. On a log axis, non-positive values are left out. ``integer_x``:
    x ticks at integers only (rounds); None: when every x value is an integer."""
    drawn = False
    for line in lines:
        pts = [
            (x, y, line.std[i] if line.std is not None else 0.0)
            for i, (x, y) in enumerate(zip(line.x, line.y, strict=True))
            if not log_y or y > 0
        ]
        if not pts:
            continue
        xs, ys, sds = (list(v) for v in zip(*pts, strict=True))
        style: dict[str, Any] = {"label": line.label}
        for key, value in (("linewidth", line.width), ("color", line.color), ("alpha", line.alpha)):
            if value is not None:
                style[key] = value
        if line.marker:
            style["marker"] = line.marker
        (artist,) = ax.plot(xs, ys, **style)
        if line.std is not None and any(sd > 0 for sd in sds):
            low = [y - sd for y, sd in zip(ys, sds, strict=True)]
            high = [y + sd for y, sd in zip(ys, sds, strict=True)]
            ax.fill_between(xs, low, high, color=artist.get_color(), alpha=0.2, linewidth=0)
        drawn = True
    if log_y:
        ax.set_yscale("log")
    if integer_x is None:
        xs_all = [float(x) for line in lines for x in line.x]
        integer_x = bool(xs_all) and all(x.is_integer() for x in xs_all)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if drawn:
        if any(line.label for line in lines):
            ax.legend(fontsize="small")
    elif no_data:
        ax.text(0.5, 0.5, no_data, ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)


def plot_lines(
    lines: Sequence[Line],
    out_png: Path,
    xlabel: str,
    ylabel: str,
    title: str,
    log_y: bool = False,
    integer_x: bool | None = None,
) -> None:
    """One panel of ``lines`` written as a PNG (see :func:`draw_lines`)."""
    fig = Figure(figsize=(6.4, 4.4))
    draw_lines(
        fig.subplots(), lines, xlabel, ylabel, title, log_y, no_data=None, integer_x=integer_x
    )
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
    lines = [Line(label, list(xs), list(ys)) for label, (xs, ys) in series.items()]
    plot_lines(lines, out_png, xlabel, ylabel, title, log_y=logy)


LINK_WORDS = {
    "client_edge": "client ↔ edge",
    "edge_cloud": "edge ↔ cloud",
    "client_cloud": "client ↔ cloud",
    "client_cloud_eval": "client ↔ cloud (evaluation only)",
    "total": "all links",
}
COLUMN_LABELS = {
    "global_acc": "global model, test accuracy",
    "global_loss": "global model, test loss",
    "global_balanced_acc": "global model, balanced test accuracy",
    "train_loss": "global model, training loss",
    "personal_acc": "personalized models, test accuracy",
    "personal_loss": "personalized models, test loss",
    "personal_train_loss": "personalized models, training loss",
    "local_loss": "local training loss (minibatches, during the round)",
    "density_global": "global model density",
    "density_personal": "personalized models' density",
    "density_client": "client models' density",
    "density_edge": "edge models' density",
    "density_cloud": "cloud model density",
    "epsilon": "privacy budget ε",
    "clients_participating": "clients taking part",
    "sim_time": "simulated time (s)",
    "sim_time_s": "simulated time (s)",
    "round_sim_time_s": "simulated round time (s)",
}
"""metrics.csv columns in words (legends and axis labels); docs/outputs.md explains them all."""


def column_label(column: str) -> str:
    """A metrics.csv column in words (the column itself where fedhp has no words for it)."""
    if column in COLUMN_LABELS:
        return COLUMN_LABELS[column]
    edge = re.fullmatch(r"edge(\d+)_(global|personal)_acc", column)
    if edge is not None:
        model = "global model" if edge[2] == "global" else "personalized models"
        return f"{model}, test accuracy on edge {edge[1]}'s clients"
    traffic = re.fullmatch(r"(cum|round)_(bytes|remark1_bits)_(.+?)(?:_(up|down))?", column)
    if traffic is not None and traffic[3] in LINK_WORDS:
        what = "bytes" if traffic[2] == "bytes" else "bits (Remark 1)"
        when = "accumulated" if traffic[1] == "cum" else "this round"
        way = {"up": ", uplink", "down": ", downlink", None: ""}[traffic[4]]
        return f"{what} {when}, {LINK_WORDS[traffic[3]]}{way}"
    return column


ACC_STYLE = {
    "global": ("tab:blue", "global model"),
    "personal": ("tab:orange", "personalized models"),
}
LINK_COLORS = {"client_edge": "tab:green", "edge_cloud": "tab:red", "client_cloud": "tab:purple"}
LOSS_KEYS = ("train_loss", "global_loss", "local_loss", "personal_train_loss", "personal_loss")
LOSS_WORDS = {
    "train_loss": "global model, training data",
    "global_loss": "global model, test data",
    "local_loss": "clients' minibatches during the round",
    "personal_train_loss": "personalized models, training data",
    "personal_loss": "personalized models, test data",
}


def _accuracy_lines(rows: list[dict[str, Any]], per_edge: bool) -> list[Line]:
    """``global_acc`` / ``personal_acc`` bold; ``edge<i>_*_acc`` thin and faint (when
    ``per_edge``), one legend entry per kind."""
    cols = _columns(rows)
    lines: list[Line] = []
    for kind, (color, text) in ACC_STYLE.items():
        xs, ys = _series(rows, f"{kind}_acc")
        if xs:
            lines.append(Line(f"{text}, all clients", xs, ys, width=2.6, color=color))
        if not per_edge:
            continue
        edges = [c for c in cols if c.startswith("edge") and c.endswith(f"_{kind}_acc")]
        for i, col in enumerate(edges):
            xs, ys = _series(rows, col)
            label = f"{text}, per edge ({len(edges)})" if i == 0 else None
            lines.append(Line(label, xs, ys, width=0.8, color=color, alpha=0.45))
    return lines


def _comm_lines(rows: list[dict[str, Any]]) -> list[Line]:
    """Accumulated bytes of each link (both directions), in MB."""
    from fedhp.comm import LINKS

    lines = []
    for link in LINKS:
        xs, ys = _series(rows, f"cum_bytes_{link}")
        if xs and any(y > 0 for y in ys):
            mb = [y / 1e6 for y in ys]
            lines.append(Line(LINK_WORDS[link], xs, mb, color=LINK_COLORS.get(link)))
    if not lines:  # rows from elsewhere: whatever accumulated byte counts there are
        for col in _columns(rows):
            xs, ys = _series(rows, col)
            if col.startswith("cum_bytes_") and xs:
                lines.append(Line(column_label(col), xs, [y / 1e6 for y in ys]))
    return lines


def run_figure(metrics_rows: list[dict[str, Any]], title: str, per_edge: bool = True) -> Figure:
    """The figure of :func:`plot_run` (axes: accuracy, communication, loss)."""
    fig = Figure(figsize=(15, 4.4))
    ax_acc, ax_comm, ax_loss = fig.subplots(1, 3)
    acc = _accuracy_lines(metrics_rows, per_edge)
    comm = _comm_lines(metrics_rows)
    losses = [Line(LOSS_WORDS[k], *_series(metrics_rows, k)) for k in LOSS_KEYS]
    for group in (acc, comm, losses):
        for line in group:
            thin = line.width is not None and line.width < 1
            line.marker = "." if not thin and len(line.x) < 30 else ""
    draw_lines(ax_acc, acc, "round", "test accuracy", integer_x=True)
    draw_lines(
        ax_comm, comm, "round", "accumulated MB per link (log)", log_y=bool(comm), integer_x=True
    )
    draw_lines(ax_loss, [ln for ln in losses if ln.x], "round", "loss", integer_x=True)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_run(
    metrics_rows: list[dict[str, Any]], out_png: Path, title: str, per_edge: bool = True
) -> None:
    """Three-panel PNG over rounds: accuracy (global and personalized bold, per-edge lines thin
    unless ``per_edge`` is False), accumulated communication per link on a log axis (so the small
    edge↔cloud traffic shows beside the client↔edge traffic), and the losses.

    Missing, empty or NaN cells are skipped; a panel without data says so. Thread-safe (runs
    in lockstep threads, :mod:`fedhp.sweep.lockstep`, plot one at a time: matplotlib's text
    layout is not).
    """
    with _PLOT_LOCK:
        _save(run_figure(metrics_rows, title, per_edge), out_png)


_PLOT_LOCK = threading.Lock()
