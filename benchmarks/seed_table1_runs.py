"""Seed a ``fedhp reproduce sfedhp-table1`` runs folder with the finished runs of ``fedhp sweep``
folders, so the reproduction reuses them instead of running them again (issue 54).

A sweep's run ``SWEEP/runs/<point>/seed<k>`` (config.yaml + summary.json) is copied to the
reproduction's ``RUNS/<job>/seed<k>`` whose configuration it computed: the same configuration
once the cosmetic options (``checkpoint_every``, ``progress``;
``fedhp.experiments.common.COSMETIC_OPTIONS``) are set aside, exactly the check the
reproduction makes before it reuses a run. A run that computes none of the reproduction's runs is
named and not copied; a destination that already holds a run is left alone.

Usage (the paper-model rows of docs/results.md, "Table I at the paper's model"):

    python benchmarks/seed_table1_runs.py runs/table1-dnn500/sfedhp runs/table1-dnn500/hierfavg \
        --out runs/t1/mnist --dataset mnist --setting 1 --model dnn-500-200 --rounds 800 --seeds 3

then ``fedhp reproduce sfedhp-table1 ... --out runs/t1/mnist`` prints ``reused`` for those runs.
``--dry-run`` says what it would copy. The options are the reproduction's (``--out``/``--runs``,
``--eval-every``, ``--threads``, ``key=value`` overrides): give the same ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from fedhp.experiments.common import ReproOptions
    from fedhp.experiments.table1 import NAME, seed_from_sweep

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="fedhp sweep output folders")
    ap.add_argument("--out", type=Path, required=True, help="the reproduction's --out")
    ap.add_argument("--runs", type=Path, default=None, help="the reproduction's --runs")
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--setting", type=int, default=1)
    ap.add_argument("--model", default="dnn-500-200")
    ap.add_argument("--rounds", type=int, default=800)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true")
    args, extra = ap.parse_known_args(argv)
    bad = [e for e in extra if "=" not in e]
    if bad:
        ap.error(f"unknown arguments: {' '.join(bad)}")
    opts = ReproOptions(
        dataset=args.dataset,
        setting=args.setting,
        rounds=args.rounds,
        seeds=args.seeds,
        model=args.model,
        out=args.out,
        runs=args.runs,
        eval_every=args.eval_every,
        threads=args.threads,
        extra=extra,
        quiet=True,
    )
    copied = 0
    for sweep in args.sweeps:
        for source, dest, what in seed_from_sweep(opts, sweep, dry_run=args.dry_run):
            print(f"{source} -> {dest if dest is not None else '-'}: {what}")
            copied += what in ("copied", "would copy")
    print(f"{copied} run(s) {'to copy' if args.dry_run else 'copied'} into {opts.runs_dir(NAME)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
