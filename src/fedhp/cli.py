"""The ``fedhp`` command line: ``fedhp run [CONFIG] [--out DIR] [key=value ...]``,
``fedhp run --resume DIR``, ``fedhp list``, ``fedhp compare RUN_DIR... --out fig.png``,
``fedhp reproduce NAME [--dataset ..] [--setting ..] [--rounds T] [--seeds N] [key=value ...]``;
``--plugin FILE`` (run, list, reproduce, flower app/deploy) imports your own components first.
"""

from __future__ import annotations

import argparse
import json
import sys
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


RESULTS = (
    "config.yaml, metrics.csv, per_client.csv, timings.csv, summary.json, plot.png, "
    "checkpoint.pt, checkpoint_time.json, final_state.pt"
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
    from fedhp.api import default_out_dir, prepare, run_built
    from fedhp.config import resolve_config
    from fedhp.errors import ConfigError

    config_path, overrides = _split_positionals(args.items)
    if args.resume is not None:
        if args.out or config_path is not None or args.plugin:
            raise ConfigError(
                "--resume DIR: give no CONFIG, --out or --plugin (the run's folder is DIR; its "
                "config.yaml names the plugins)"
            )
        out = Path(args.resume)
        cfg = _resume_config(out, overrides)
    else:
        cfg = resolve_config(config_path, overrides, plugins=args.plugin)
        out = Path(args.out) if args.out else default_out_dir(cfg)
    exp = prepare(cfg)
    if args.check:
        fed = exp.ctx.fed
        print(
            f"ok: {cfg.algorithm.get('name')} on {cfg.dataset.get('name')}, {fed.num_clients} "
            f"clients, {exp.ctx.topology.num_edges} edges, {exp.model.num_params} parameters"
        )
        return 0
    try:
        summary = run_built(exp, out, resume=args.resume is not None)
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
    from fedhp.plugins import load_plugins

    load_plugins(args.plugin)

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
            if registry is MODELS:
                print(f"  {'':14s} {_parameter_counts(cls())}")
            for line in _choice_lines(cls):
                print(f"  {'':14s}   {line}")
    return 0


def _plugin_overrides(plugins: Sequence[str]) -> list[str]:
    """``plugins=[...]`` (absolute paths) for runs configured by overrides only."""
    from fedhp.plugins import load_plugins, resolve_plugin

    if not plugins:
        return []
    specs = [resolve_plugin(p) for p in plugins]
    load_plugins(specs)  # a broken plugin fails now, before any run starts
    return ["plugins=[" + ", ".join(json.dumps(p) for p in specs) + "]"]


def cmd_compare(args: argparse.Namespace) -> int:
    from fedhp.compare import compare

    compare([Path(d) for d in args.runs], Path(args.out), args.metric, args.x, not args.no_band)
    return 0


def _parameter_counts(options: Any) -> str:
    """A model's parameter (and BatchNorm buffer) counts with its default options on MNIST-
    and CIFAR-shaped inputs with 10 classes."""
    from fedhp.errors import ConfigError

    parts = []
    for label, shape in (("1x28x28", (1, 28, 28)), ("3x32x32", (3, 32, 32))):
        try:
            model = options.build(shape, 10)
        except ConfigError:
            continue
        extra = f" + {model.num_buffers:,} buffers" if model.num_buffers else ""
        parts.append(f"{model.num_params:,} parameters{extra} on {label}")
    return "size: " + "; ".join(parts)


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
        rounds=args.rounds if args.rounds is not None else 800,
        rounds_given=args.rounds is not None,
        path=args.path,
        gamma=args.gamma,
        seeds=args.seeds,
        model=args.model,
        out=Path(args.out) if args.out else None,
        runs=Path(args.runs) if args.runs else None,
        eval_every=args.eval_every,
        threads=args.threads,
        tuned=Path(args.tuned) if args.tuned else None,
        methods=args.methods.split(",") if args.methods else None,
        data_dir=args.data_dir,
        extra=[*args.overrides, *_plugin_overrides(args.plugin)],
        jobs=args.jobs,
        quick=args.quick,
        leak=args.leak,
        skews=args.skews.split(",") if args.skews else None,
    )
    REPRODUCTIONS[args.name](opts)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fedhp.plugins import add_plugin_option

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
    add_plugin_option(run)
    run.set_defaults(func=cmd_run)
    lst = sub.add_parser("list", help="list algorithms, datasets, models and partitions")
    add_plugin_option(lst)
    lst.set_defaults(func=cmd_list)
    cmp = sub.add_parser(
        "compare",
        help="plot several runs on one figure and tabulate their final/best values",
        description="One line per run (mean ± std band over runs that differ only by seed) and "
        "a Markdown table of final and best values (printed, and written beside --out as .md).",
    )
    cmp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="results folders of fedhp run")
    cmp.add_argument("--metric", default="global_acc", help="metrics.csv column (global_acc)")
    cmp.add_argument(
        "--x", choices=("round", "bytes", "sim_time"), default="round", help="x axis (round)"
    )
    cmp.add_argument("--out", required=True, help="PNG to write, e.g. fig.png")
    cmp.add_argument("--no-band", action="store_true", help="no mean ± std band per seed group")
    cmp.set_defaults(func=cmd_compare)
    rep = sub.add_parser(
        "reproduce",
        help="reproduce the sFedHP / Fed-HT / FNR-FL / FedLPS papers' tables and figures, "
        "and the client-level DP curve (dp)",
    )
    rep.add_argument(
        "name",
        help="sfedhp-table1 | sfedhp-lambda | sfedhp-figures | sfedhp-tune | fedht-sim1 | "
        "fedht-sim2 | fedht-mnist | fedht-libsvm | fedht-noiseless | fnrfl-table2 | "
        "fedlps-table1 | fedlps-ablation | robust | dp",
    )
    rep.add_argument(
        "overrides", nargs="*", metavar="key=value", help="applied to every run (right after NAME)"
    )
    rep.add_argument("--dataset", choices=("mnist", "fmnist", "cifar10"), default="mnist")
    rep.add_argument("--setting", type=int, choices=(1, 2), default=1)
    rep.add_argument(
        "--rounds", type=int, default=None, help="global rounds T (default 800; fedht-*: their own)"
    )
    rep.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default 1)")
    rep.add_argument(
        "--model",
        choices=("dnn", "dnn-500-200", "mlr", "cnn", "cnn2", "vgg", "resnet18", "vgg11", "small"),
        default=None,
        help="default: dnn (784-100-10) for MNIST/FMNIST, vgg for CIFAR-10; fnrfl-table2: "
        "resnet18 | vgg11 | small (default resnet18, --quick: small); fedlps-*: cnn2",
    )
    rep.add_argument("--out", help="folder for table.md/table.json/figures")
    rep.add_argument("--runs", help="folder of the individual runs (default OUT/runs; reused)")
    rep.add_argument("--eval-every", type=int, default=10, help="evaluate every N rounds")
    rep.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    rep.add_argument("--jobs", type=int, default=1, help="runs at once, in worker processes")
    rep.add_argument("--tuned", help="JSON written by sfedhp-tune (hyperparameters to use)")
    rep.add_argument("--methods", help="comma-separated subset of the reproduction's methods")
    rep.add_argument("--data-dir", help="dataset.data_dir for every run (e.g. CIFAR-10 batches)")
    add_plugin_option(rep)
    rep.add_argument("--path", help="fedht-libsvm: the LibSVM file (E2006-tfidf, RCV1, ...)")
    rep.add_argument(
        "--gamma", type=float, help="fedht-*: compare at this common γ (K still from the grid)"
    )
    rep.add_argument(
        "--quick",
        action="store_true",
        help="fnrfl-table2: a short CPU run (data subset, E = 2); fedlps-*: 30 rounds of 1 epoch; "
        "robust: 10 rounds, sign flip and ALIE at 20 % only; dp: 40 rounds",
    )
    rep.add_argument(
        "--leak", action="store_true", help="fnrfl-table2: the authors' protocol (D_pub = test set)"
    )
    rep.add_argument(
        "--skews", help="fnrfl-table2: comma-separated feature,label,quantity,label+feature,mixed"
    )
    rep.set_defaults(func=cmd_reproduce)
    from fedhp.flower.deploy_cli import add_parser as add_flower_parser

    add_flower_parser(sub)  # fedhp flower certs|keys|app|deploy (docs/flower.md)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedhp`` console script."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # key=value overrides may also come after options (fedhp run --out DIR rounds=5)
    takes = "items" if hasattr(args, "items") else "overrides"
    if (
        unknown
        and all("=" in u and not u.startswith("-") for u in unknown)
        and hasattr(args, takes)
    ):
        setattr(args, takes, [*getattr(args, takes), *unknown])
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
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
