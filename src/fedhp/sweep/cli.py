"""``fedhp sweep``: a grid of runs (points × seeds) as batches, one progress bar, a table and a
figure (docs/sweep.md). The same options may come from a ``sweep:`` section of the YAML file."""

from __future__ import annotations

import argparse
from typing import Any

from fedhp.cli_args import add_items, split_positionals
from fedhp.errors import ConfigError

__all__ = ["add_parser", "cmd_sweep"]


def add_parser(sub: Any) -> None:
    """Add ``fedhp sweep`` to the subcommands ``sub``."""
    from fedhp.plugins import add_plugin_option

    sw = sub.add_parser(
        "sweep",
        help="run a grid of runs (hyperparameters x seeds) batched together; table and figure",
        description="Run every grid point for every seed (runs of one structure share a batch: "
        "same model, shapes and rounds; seeds and float hyperparameters may differ), then write "
        "table.md/table.csv (mean ± standard error over seeds) and curves.png. Started again "
        "in the same --out, it resumes (options in any order; more seeds or grid values run only "
        "the new runs). Options may also come from a `sweep:` section of CONFIG (the flags win). "
        "docs/sweep.md.",
    )
    add_items(sw)
    sw.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="a grid axis, e.g. algorithm.lam=15,20,25 (repeat for more axes: their product)",
    )
    sw.add_argument(
        "--seeds",
        help="the seeds themselves, e.g. 0,1,2 or 0-4; --seeds 3 is seed 3 alone (default 0, or "
        "the base's seed=; `fedhp reproduce --seeds N` counts seeds 0..N-1 instead)",
    )
    sw.add_argument(
        "--out", help="the sweep's folder (default sweeps/<algorithm>-<dataset>-<time>)"
    )
    sw.add_argument(
        "--select",
        choices=["val"],
        help="val: run the grid on the validation split, pick the point with the best mean "
        "over seeds, re-run that point on the test split and report it",
    )
    sw.add_argument(
        "--metric",
        help="with --select val: what it maximizes, one of final_global_acc, best_global_acc, "
        "final_personal_acc, best_personal_acc, final_global_balanced_acc, "
        "best_global_balanced_acc (default final_global_acc, else final_personal_acc)",
    )
    sw.add_argument(
        "--runs-per-batch",
        type=int,
        help="runs trained together (default: as many as the memory budget allows)",
    )
    sw.add_argument("--backend", choices=["inprocess", "ray"], help="where batches run")
    sw.add_argument("--address", help="--backend ray: join this Ray cluster (e.g. auto)")
    sw.add_argument(
        "--batching",
        choices=["auto", "lockstep", "sequential"],
        help="lockstep: a batch's runs train in step, their model kernels fused; sequential: "
        "one after another in this process; auto (default): lockstep on a GPU, sequential on "
        "the CPU (docs/sweep.md says why)",
    )
    sw.add_argument(
        "--format",
        metavar="FMT[,FMT]",
        help="the figures' formats among png, pdf, svg (e.g. pdf,svg: curves.pdf and "
        "curves.svg too; curves.png is always written)",
    )
    add_plugin_option(sw)
    sw.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``fedhp sweep``."""
    from fedhp.sweep.api import (
        default_sweep_dir,
        figure_formats,
        seeds_of,
        split_sweep_section,
        sweep_spec,
    )
    from fedhp.sweep.folder import run_in_folder
    from fedhp.sweep.grid import parse_grid

    config_path, overrides = split_positionals(args.items)
    base, section = split_sweep_section(config_path)
    grid: dict[str, Any] = dict(section.get("grid") or {})
    grid.update(parse_grid(args.grid))
    flags = {
        "seeds": args.seeds,
        "out": args.out,
        "select": args.select,
        "metric": args.metric,
        "runs_per_batch": args.runs_per_batch,
        "backend": args.backend,
        "address": args.address,
        "batching": args.batching,
    }
    options = {k: v for k, v in section.items() if k not in ("grid", "plugins")}
    options.update({k: v for k, v in flags.items() if v is not None})
    figure_formats(options, args.format)  # the figures' formats (curves.png always)
    plugins = [*section.get("plugins", []), *args.plugin]
    options["seeds"] = seeds_of(base, overrides, options.get("seeds"), "--seeds")
    base = [*base, *overrides]
    if options.get("out") in (None, ""):
        if options.get("out") == "":
            raise ConfigError("--out: empty; name a folder for the sweep")
        options["out"] = str(default_sweep_dir(base, plugins))
    spec = sweep_spec(base, grid, plugins=plugins, **options)
    try:
        spec, manifest = run_in_folder(spec)
    except KeyboardInterrupt:
        import sys

        print(
            "fedhp: interrupted; the same command resumes the sweep (finished runs are kept)",
            file=sys.stderr,
        )
        return 130
    print((spec.out / "table.md").read_text())
    runs = len(manifest["runs"])
    names = ("table.md", "table.csv", "curves.png", "curves.pdf", "curves.svg", "sweep.json")
    written = ", ".join(n for n in names if (spec.out / n).is_file())
    print(f"results: {spec.out}/ ({written}; {runs} run folders)")
    return 0
