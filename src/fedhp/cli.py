"""The ``fedhp`` command line: ``fedhp run [CONFIG] [--out DIR] [key=value ...]``,
``fedhp run --resume DIR``, ``fedhp list``,
``fedhp reproduce NAME [--dataset ..] [--setting ..] [--rounds T] [--seeds N] [key=value ...]``
"""

from __future__ import annotations

import argparse
import sys
import time
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

from fedhp.errors import FedhpError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"fedhp: error: {message} (see `fedhp --help`)\n")


def _split_positionals(items: Sequence[str]) -> tuple[Path | None, list[str]]:
    config: Path | None = None
    overrides: list[str] = []
    for i, item in enumerate(items):
        if i == 0 and "=" not in item:
            config = Path(item)
        else:
            overrides.append(item)
    return config, overrides


def default_out_dir(cfg: Any) -> Path:
    """``runs/<algorithm>-<dataset>-<timestamp>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.algorithm.get('name')}-{cfg.dataset.get('name')}-{stamp}"


RESULTS = (
    "config.yaml, metrics.csv, per_client.csv, timings.csv, summary.json, plot.png, "
    "checkpoint.pt, final_state.pt"
)


def _resume_config(folder: Path, overrides: list[str]) -> Any:
    """The configuration of the run in ``folder`` (only rounds/progress may be overridden)."""
    from fedhp.config import parse_override, resolve_config
    from fedhp.engine.checkpoint import RESUMABLE_KEYS
    from fedhp.errors import ConfigError

    if not (folder / "config.yaml").is_file():
        raise ConfigError(f"--resume {folder}: no config.yaml there (not a fedhp results folder)")
    for text in overrides:
        key = next(iter(parse_override(text)))
        if key not in RESUMABLE_KEYS:
            raise ConfigError(
                f"--resume: {key} cannot change when resuming; allowed: {', '.join(RESUMABLE_KEYS)}"
            )
    return resolve_config(folder / "config.yaml", overrides)


def cmd_run(args: argparse.Namespace) -> int:
    from fedhp.algorithms import ALGORITHMS
    from fedhp.config import resolve_config
    from fedhp.engine.build import build_experiment
    from fedhp.engine.runner import run_experiment
    from fedhp.errors import ConfigError

    config_path, overrides = _split_positionals(args.items)
    if args.resume is not None:
        if args.out or config_path is not None:
            raise ConfigError("--resume DIR: give no CONFIG or --out (the run's folder is DIR)")
        out = Path(args.resume)
        cfg = _resume_config(out, overrides)
    else:
        cfg = resolve_config(config_path, overrides)
        out = Path(args.out) if args.out else default_out_dir(cfg)
    if cfg.backend != "inprocess":
        from fedhp.flower.shards import check_flower_config

        hierarchical = ALGORITHMS.build(cfg.algorithm, "algorithm").hierarchical
        check_flower_config(cfg, hierarchical)
    exp = build_experiment(cfg)
    if args.check:
        fed = exp.ctx.fed
        print(
            f"ok: {cfg.algorithm.get('name')} on {cfg.dataset.get('name')}, {fed.num_clients} "
            f"clients, {exp.ctx.topology.num_edges} edges, {exp.model.num_params} parameters"
        )
        return 0
    try:
        if cfg.backend == "flower-sim":
            from fedhp.flower.simulation import run_flower_sim

            summary = run_flower_sim(exp, out, resume=args.resume is not None)
        else:
            summary = run_experiment(exp, out, resume=args.resume is not None)
    except KeyboardInterrupt:
        print(f"fedhp: interrupted; continue with: fedhp run --resume {out}", file=sys.stderr)
        return 130
    parts = [
        f"{k}={summary[k]:.4f}" for k in ("final_global_acc", "final_personal_acc") if k in summary
    ]
    print(f"done: {summary['rounds']} rounds in {summary['seconds']:.1f}s; {' '.join(parts)}")
    print(f"results: {out}/ ({RESULTS})")
    return 0


def _options_line(cls: Any) -> str:
    fields = getattr(cls, "model_fields", {})
    parts = []
    for name, field in fields.items():
        default = field.default
        parts.append(
            f"{name}={default!r}" if default is not None or not field.is_required() else name
        )
    return ", ".join(parts) if parts else "(no options)"


def _choice_lines(cls: Any) -> list[str]:
    """``name (a|b|c): description`` for each described option with a fixed set of values."""
    lines = []
    for name, field in getattr(cls, "model_fields", {}).items():
        if typing.get_origin(field.annotation) is Literal and field.description:
            choices = "|".join(str(c) for c in typing.get_args(field.annotation))
            lines.append(f"{name} ({choices}): {field.description}")
    return lines


def cmd_list(args: argparse.Namespace) -> int:
    from fedhp.algorithms import ALGORITHMS
    from fedhp.data import DATASETS, PARTITIONERS
    from fedhp.models import MODELS

    for title, registry in (
        ("algorithms", ALGORITHMS),
        ("datasets", DATASETS),
        ("models", MODELS),
        ("partitions", PARTITIONERS),
    ):
        print(f"{title}:")
        for name in registry.names():
            cls = registry.get(name)
            doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            print(f"  {name:14s} {doc}")
            print(f"  {'':14s} options: {_options_line(cls)}")
            for line in _choice_lines(cls):
                print(f"  {'':14s}   {line}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from fedhp.errors import ConfigError
    from fedhp.experiments import REPRODUCTIONS, ReproOptions

    if args.name not in REPRODUCTIONS:
        raise ConfigError(
            f"reproduce: unknown {args.name!r}; choose from {', '.join(REPRODUCTIONS)}"
        )
    opts = ReproOptions(
        dataset=args.dataset,
        setting=args.setting,
        rounds=args.rounds,
        seeds=args.seeds,
        model=args.model,
        out=Path(args.out) if args.out else None,
        runs=Path(args.runs) if args.runs else None,
        eval_every=args.eval_every,
        threads=args.threads,
        tuned=Path(args.tuned) if args.tuned else None,
        methods=args.methods.split(",") if args.methods else None,
        data_dir=args.data_dir,
        extra=list(args.overrides),
        jobs=args.jobs,
    )
    REPRODUCTIONS[args.name](opts)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedhp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run one experiment")
    run.add_argument("items", nargs="*", metavar="[CONFIG] [key=value ...]")
    run.add_argument("--out", help="results folder (default runs/<algorithm>-<dataset>-<time>)")
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in DIR from its config.yaml and checkpoint.pt "
        "(only rounds=N and progress=... may be given)",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="validate the configuration and load the data, then exit without training",
    )
    run.set_defaults(func=cmd_run)
    lst = sub.add_parser("list", help="list algorithms, datasets, models and partitions")
    lst.set_defaults(func=cmd_list)
    rep = sub.add_parser("reproduce", help="reproduce the sFedHP paper's tables and figures")
    rep.add_argument("name", help="sfedhp-table1 | sfedhp-lambda | sfedhp-figures | sfedhp-tune")
    rep.add_argument(
        "overrides", nargs="*", metavar="key=value", help="applied to every run (right after NAME)"
    )
    rep.add_argument("--dataset", choices=("mnist", "fmnist", "cifar10"), default="mnist")
    rep.add_argument("--setting", type=int, choices=(1, 2), default=1)
    rep.add_argument("--rounds", type=int, default=800, help="global rounds T (default 800)")
    rep.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default 1)")
    rep.add_argument(
        "--model",
        choices=("dnn", "dnn-500-200", "mlr", "cnn", "vgg"),
        default=None,
        help="default: dnn (784-100-10) for MNIST/FMNIST, vgg for CIFAR-10",
    )
    rep.add_argument("--out", help="folder for table.md/table.json/figures")
    rep.add_argument("--runs", help="folder of the individual runs (default OUT/runs; reused)")
    rep.add_argument("--eval-every", type=int, default=10, help="evaluate every N rounds")
    rep.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    rep.add_argument("--jobs", type=int, default=1, help="runs at once, in worker processes")
    rep.add_argument("--tuned", help="JSON written by sfedhp-tune (hyperparameters to use)")
    rep.add_argument("--methods", help="comma-separated subset of the reproduction's methods")
    rep.add_argument("--data-dir", help="dataset.data_dir for every run (e.g. CIFAR-10 batches)")
    rep.set_defaults(func=cmd_reproduce)
    from fedhp.flower.deploy_cli import add_parser as add_flower_parser

    add_flower_parser(sub)  # fedhp flower certs|keys|app|deploy (docs/flower.md)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedhp`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except FedhpError as err:
        print(f"fedhp: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("fedhp: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
