r"""``fedhp compare RUN_DIR... --out fig.png``: several runs on one plot, and a table.

Runs whose configurations differ only by ``seed`` (and bookkeeping: ``progress``, ``mlflow``,
``checkpoint_every``, ``tensorboard``) form a group, drawn as one line, the mean over seeds with
a ± one-standard-deviation band (sample std, n − 1; the legend says so). Each line is labelled by
what sets its group apart from the others: in the table ``algorithm=fedavg`` or
``algorithm.lr=0.1``, in the figure by the short names the sweep's figure uses (``fedavg``,
``$\eta$ = 0.1``). The Markdown table gives each group's final and best value of the metric
(mean ± std over seeds; accuracies in %, as on the figure's axis); it is printed and written
beside the figure (``fig.md``). The figure is written in the format ``--out`` names, and in each
of ``--format``'s (``png,pdf,svg``) beside it.

Configurations are compared in their fully resolved form (:func:`fedhp.config.normalized_config`),
so a run that left an option at its default and one that gave the default are one group. A run
whose metrics.csv is missing, unreadable or without evaluated rounds is left out with a
``fedhp: warning:`` line; a run repeating another's configuration and seed is left out too, so a
group's count is its number of distinct seeds.
"""

from __future__ import annotations

import csv
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure

from fedhp.errors import ConfigError, FedhpError, FedhpWarning
from fedhp.experiments.common import markdown_table, mean_std
from fedhp.reporting import (
    Line,
    column_label,
    draw_lines,
    paper_style,
    read_rows,
    save_figure,
    short_label,
    short_names,
    short_value,
    write_text_atomic,
)

NOT_GROUPED = ("seed", "progress", "checkpoint_every", "tensorboard", "mlflow")
NOT_LABELLED = (*NOT_GROUPED, "plugins")
SECTIONS = ("dataset", "partition", "model", "algorithm")
X_AXES = {
    "round": ("round", "global round"),
    "bytes": ("cum_bytes_total", "accumulated communication, MB (all links)"),
    "sim_time": ("sim_time", "simulated time (s)"),
}
X_SCALE = {"bytes": 1e-6}


@dataclass
class Run:
    """One results folder: its configuration and metrics.csv rows."""

    folder: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]


@dataclass
class Group:
    """Runs that differ only by seed, with their label."""

    runs: list[Run]
    label: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    """What sets the group apart (dotted key → value; ``default``: left at its default)."""


class BrokenRun(ConfigError):
    """A run folder whose metrics cannot be used (``fedhp compare`` leaves it out)."""


def read_run(folder: Path) -> Run:
    """A run folder's configuration (resolved) and metrics.csv, or a one-line error
    (:class:`BrokenRun` where the folder is a run but its metrics cannot be used)."""
    config_path, metrics_path = folder / "config.yaml", folder / "metrics.csv"
    if not config_path.is_file():
        raise ConfigError(f"{folder}: not a fedhp run folder (no config.yaml or metrics.csv)")
    try:
        config = yaml.safe_load(config_path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raise BrokenRun(f"{config_path}: unreadable or invalid YAML") from None
    if not isinstance(config, dict):
        raise BrokenRun(f"{config_path}: not a fedhp configuration")
    if not metrics_path.is_file():
        raise BrokenRun(f"{folder}: no metrics.csv (the run wrote no evaluated round)")
    try:
        rows = read_rows(metrics_path)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise BrokenRun(f"{metrics_path}: unreadable ({err})") from None
    rows = [r for r in rows if isinstance(r.get("round"), int)]
    if not rows:
        raise BrokenRun(f"{metrics_path}: no rows with a round number (empty or damaged)")
    return Run(folder, _resolved(config), rows)


def _resolved(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` in its fully resolved form (as written where it no longer validates)."""
    from fedhp.config import normalized_config

    try:
        return normalized_config(config)
    except FedhpError:
        return config


def read_runs(folders: Sequence[Path], metric: str) -> list[Run]:
    """The usable runs of ``folders``: broken ones, ones without ``metric`` (when some other run
    has it) and repeats of an earlier run's configuration and seed are left out with a warning
    line; an error if none is left."""
    runs: list[Run] = []
    broken: list[str] = []
    for folder in folders:
        try:
            runs.append(read_run(Path(folder)))
        except BrokenRun as err:
            broken.append(str(err))
    if not runs:
        more = f" (and {len(broken) - 1} more runs cannot be read)" if len(broken) > 1 else ""
        raise ConfigError(f"{broken[0]}{more}; nothing to compare")
    for reason in broken:
        _leave_out(reason)
    if any(metric in row for run in runs for row in run.rows):
        for run in [r for r in runs if not any(metric in row for row in r.rows)]:
            _leave_out(f"{run.folder}: metrics.csv has no {metric} column")
            runs.remove(run)
    kept: dict[str, Run] = {}
    for run in runs:
        key = f"{group_key(run.config)} seed={run.config.get('seed')!r}"
        if key in kept:
            same = f"{run.folder}: the same configuration and seed as {kept[key].folder}"
            _leave_out(same, " (it adds no seed)")
            continue
        kept[key] = run
    return list(kept.values())


def _leave_out(reason: str, why: str = "") -> None:
    warnings.warn(f"{reason}; left out{why}", FedhpWarning, stacklevel=3)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys → values (lists kept whole)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def group_key(config: dict[str, Any]) -> str:
    """The configuration minus seed and bookkeeping, as a canonical string."""
    rest = {k: v for k, v in config.items() if k not in NOT_GROUPED}
    return json.dumps(rest, sort_keys=True, default=str)


def _short(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()


def _differs(flat: list[dict[str, Any]], key: str) -> bool:
    """Whether ``key`` differs among the groups; for an option of a component (``algorithm.lr``),
    among groups naming the same component."""
    section = key.split(".")[0]
    if section not in SECTIONS or key.endswith(".name"):
        return len({_short(f.get(key)) for f in flat}) > 1
    by_name: dict[str, set[str]] = {}
    for f in flat:
        by_name.setdefault(_short(f.get(f"{section}.name")), set()).add(_short(f.get(key)))
    return any(len(values) > 1 for values in by_name.values())


def _same(a: dict[str, Any], b: dict[str, Any], section: str) -> bool:
    return a.get(f"{section}.name") == b.get(f"{section}.name")


def label_groups(groups: list[Group]) -> None:
    """Label each group by the settings in which the groups differ (a component by its name,
    plus the options that differ between groups naming the same component); a single group by
    its algorithm and dataset."""
    flat = [
        flatten({k: v for k, v in g.runs[0].config.items() if k not in NOT_LABELLED})
        for g in groups
    ]
    keys = sorted(
        {k for f in flat for k in f}, key=lambda k: (k.split(".")[0], k[-5:] != ".name", k)
    )
    shown = [k for k in keys if _differs(flat, k)]
    for group, f in zip(groups, flat, strict=True):
        parts = []
        group.values = {}
        for key in shown:
            section = key.split(".")[0]
            if key in f or section not in SECTIONS:
                parts.append(f"{key.removesuffix('.name')}={short_value(f.get(key))}")
                group.values[key] = f.get(key)
            elif _differs([g for g in flat if _same(g, f, section)], key):
                parts.append(f"{key}=default")  # config.yaml lists only the options given
                group.values[key] = "default"
        if not parts:
            parts = [f"{f.get('algorithm.name')} on {f.get('dataset.name')}"]
        group.label = ", ".join(parts)
    labels = [g.label for g in groups]
    for group in groups:  # still ambiguous (they differ only in plugins): add the folder
        if labels.count(group.label) > 1:
            group.label += f" [{group.runs[0].folder.name}]"
        seeds = len(seeds_of(group))
        if seeds > 1:
            group.label += f" ({seeds} seeds, mean ± std)"


def seeds_of(group: Group) -> list[Any]:
    """The distinct seeds of a group's runs (from their configurations)."""
    return list(dict.fromkeys(run.config.get("seed") for run in group.runs))


def make_groups(runs: Sequence[Run]) -> list[Group]:
    """Runs grouped by configuration minus seed, in the order first seen, labelled."""
    by_key: dict[str, Group] = {}
    for run in runs:
        by_key.setdefault(group_key(run.config), Group([])).runs.append(run)
    groups = list(by_key.values())
    label_groups(groups)
    return groups


def group_curve(group: Group, metric: str, x: str) -> Line:
    """The group's mean curve of ``metric`` over ``x`` with its std band, at the rounds every run
    of the group evaluated (x: averaged too, for bytes or simulated time)."""
    column = X_AXES[x][0]
    scale = X_SCALE.get(x, 1.0)
    per_run = []
    for run in group.runs:
        points = {}
        for row in run.rows:
            xv, yv = row.get(column), row.get(metric)
            if isinstance(xv, int | float) and isinstance(yv, int | float) and "round" in row:
                points[row["round"]] = (float(xv) * scale, float(yv))
        per_run.append(points)
    rounds = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    xs, ys, sds = [], [], []
    for r in rounds:
        xs.append(mean_std([p[r][0] for p in per_run])[0])
        mean, sd = mean_std([p[r][1] for p in per_run])
        ys.append(mean)
        sds.append(sd)
    return Line(group.label, xs, ys, std=sds if len(group.runs) > 1 else None)


def _stat(values: list[float], digits: int = 4, scale: float = 1.0) -> str:
    """``mean ± std`` of ``values`` times ``scale`` (just the value for one run; ``—`` for
    none)."""
    if not values:
        return "—"
    mean, sd = mean_std([v * scale for v in values])
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def in_percent(metric: str) -> bool:
    """Whether ``metric`` is an accuracy, shown in % (table and figure alike)."""
    return metric.endswith("_acc")


def table(groups: Sequence[Group], metric: str) -> str:
    """Markdown: per group, the final and best ``metric`` (lowest for losses; accuracies in
    %), rounds, MB."""
    lower = "loss" in metric
    digits, scale = (2, 100.0) if in_percent(metric) else (4, 1.0)
    rows = []
    for group in groups:
        finals, bests, rounds, mbs = [], [], [], []
        for run in group.runs:
            values = [r[metric] for r in run.rows if isinstance(r.get(metric), int | float)]
            if values:
                finals.append(float(values[-1]))
                bests.append(float(min(values) if lower else max(values)))
            if run.rows:
                rounds.append(run.rows[-1].get("round", 0))
                total = run.rows[-1].get("cum_bytes_total")
                if isinstance(total, int | float):
                    mbs.append(total / 1e6)
        rows.append(
            [
                group.label,
                str(len(seeds_of(group))),
                _stat(finals, digits, scale),
                _stat(bests, digits, scale),
                str(max(rounds, default=0)),
                _stat(mbs, 2),
            ]
        )
    unit = " (%)" if in_percent(metric) else ""
    header = [
        "run",
        "seeds",
        f"final {metric}{unit}",
        f"best {metric}{unit}",
        "rounds",
        "MB (all links)",
    ]
    return markdown_table(header, rows)


def figure_lines(groups: Sequence[Group], metric: str, x: str, band: bool = True) -> list[Line]:
    """The figure's lines: each group's :func:`group_curve` labelled by its short names
    (``$\\lambda$ = 15 (2 seeds)``), in % for an accuracy; no band unless ``band``."""
    names = short_names(list(dict.fromkeys(k for g in groups for k in g.values)))
    scale = 100.0 if in_percent(metric) else 1.0
    lines = []
    for group in groups:
        line = group_curve(group, metric, x)
        label = short_label(group.values, names) if group.values else group.label
        seeds = len(seeds_of(group))
        line.label = label + (f" ({seeds} seeds)" if seeds > 1 and group.values else "")
        line.y = [y * scale for y in line.y]
        line.std = [sd * scale for sd in line.std] if band and line.std is not None else None
        lines.append(line)
    marker = "." if max((len(line.x) for line in lines), default=0) < 30 else ""
    for line in lines:
        line.marker = marker
    return lines


def plot_compare(
    lines: Sequence[Line], out: Path, metric: str, x: str, formats: Sequence[str]
) -> list[Path]:
    """One panel of ``lines`` for a page (fonts and size of the sweep's figure), the legend
    titled with the band's spread; written as ``out`` in each of ``formats``."""
    ylabel = column_label(metric) + (" (%)" if in_percent(metric) else "")
    banded = any(line.std is not None and any(sd > 0 for sd in line.std) for line in lines)
    with paper_style():
        fig = Figure(figsize=(3.8, 2.9))
        ax = fig.subplots()
        draw_lines(ax, lines, X_AXES[x][1], ylabel, no_data=None, integer_x=x == "round")
        ax.legend(
            title="mean ± std over seeds" if banded else None,
            fontsize="x-small" if len(lines) > 6 else "small",
            title_fontsize="x-small",
            ncol=2 if len(lines) > 6 else 1,
            framealpha=0.8,
        )
        fig.tight_layout()
        return save_figure(fig, out, formats)


def compare(
    folders: Sequence[Path],
    out_png: Path,
    metric: str = "global_acc",
    x: str = "round",
    band: bool = True,
    formats: Sequence[str] = (),
) -> str:
    """Plot ``metric`` over ``x`` for the runs in ``folders`` to ``out_png`` (in the format its
    suffix names, and in each of ``formats`` beside it); write and return the Markdown table
    (``out_png`` with suffix ``.md``)."""
    if x not in X_AXES:
        raise ConfigError(f"--x {x}: choose one of {', '.join(X_AXES)}")
    runs = read_runs(folders, metric)
    if not any(metric in row for run in runs for row in run.rows):
        columns = sorted({k for run in runs for row in run.rows for k in row})
        hint = ", ".join(
            c for c in columns if c.endswith(("_acc", "_loss")) and not c.startswith("edge")
        )
        raise ConfigError(
            f"--metric {metric}: no run has this metrics.csv column; try one of: {hint}"
        )
    column = X_AXES[x][0]
    if not any(column in row for run in runs for row in run.rows):
        if x == "sim_time":
            raise ConfigError(
                "--x sim_time: none of these runs records simulated time (no sim_time column in "
                "metrics.csv); use --x round or --x bytes"
            )
        raise ConfigError(f"--x {x}: none of these runs has a {column} column in metrics.csv")
    groups = make_groups(runs)
    lines = figure_lines(groups, metric, x, band)
    out = Path(out_png)
    kinds = [out.suffix.lower().lstrip("."), *(k for k in formats if f".{k}" != out.suffix)]
    written = plot_compare(lines, out, metric, x, list(dict.fromkeys(kinds)))
    text = table(groups, metric)
    md = out.with_suffix(".md")
    write_text_atomic(md, text)
    print(text, end="")
    print(f"figure: {', '.join(str(p) for p in written)}; table: {md}")
    return text
