"""The ``fedhp`` command line (:data:`DESCRIPTION`); exit codes in :mod:`fedhp.errors`."""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
import typing
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

from fedhp.cli_args import add_items, split_positionals, warn_repeated
from fedhp.errors import FedhpError, FedhpWarning

DESCRIPTION = """\
fedhp run [CONFIG] [--out DIR] [key=value ...]   run one experiment
fedhp run --resume DIR [--from-previous]          continue an interrupted run
fedhp list                                        algorithms, datasets, models, partitions
fedhp compare RUN_DIR... --out fig.png            several runs on one figure, and a table
fedhp reproduce NAME [options] [key=value ...]    a paper's table or figure
fedhp flower certs|keys|app|deploy                Flower deployment (docs/flower.md)

--plugin FILE (run, list, reproduce, flower app/deploy) imports your own components first.
Exit codes: 0 done, 2 bad input (one line naming the field and the fix), 3 the run diverged
(the input was valid; results up to the last good round are kept), 1 a Flower deployment's run
failed, 130 interrupted. What each run folder holds: docs/outputs.md."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"fedhp: error: {message} (see `fedhp --help`)\n")


def _positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


RESULTS = (
    "config.yaml, metrics.csv, per_client.csv, timings.csv, summary.json, plot.png, "
    "checkpoint.pt, checkpoint.prev.pt, checkpoint_time.json, final_state.pt"
)
"""The files a run folder may hold, in the order the ``results:`` line names them."""


def results_line(out: Path) -> str:
    """``results: DIR/ (the files of RESULTS it holds; ...)``: only the files written (no
    checkpoint.prev.pt where one checkpoint was written, none under checkpoint_every=0)."""
    names = [n for n in RESULTS.split(", ") if (out / n).is_file()]
    return f"results: {out}/ ({', '.join(names)}; docs/outputs.md explains them)"


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
            dotted = text.partition("=")[0]
            raise ConfigError(
                f"--resume: {dotted} cannot change when resuming; allowed: "
                f"{', '.join(RESUMABLE_KEYS)} (start a new run with --out for other changes)"
            )
    # (a config.yaml written before issue 42 holds options the run did not read: not refused)
    return resolve_config(folder / "config.yaml", overrides, refuse_unread=False)


def cmd_run(args: argparse.Namespace) -> int:
    from fedhp.api import FreshFolder, check_out_dir, default_out_dir, prepare, run_built
    from fedhp.config import resolve_config
    from fedhp.errors import ConfigError, DivergenceError

    config_path, overrides = split_positionals(args.items)
    for flag, value in (("--out", args.out), ("--resume", args.resume)):
        if value is not None and not value.strip():
            raise ConfigError(
                f"{flag}: an empty folder name; name a folder"
                + (
                    " (or leave --out out for runs/<algorithm>-<dataset>-<time>)"
                    if flag == "--out"
                    else ""
                )
            )
    if args.resume is not None:
        if args.out or config_path is not None or args.plugin:
            raise ConfigError(
                "--resume DIR: give no CONFIG, --out or --plugin (the run's folder is DIR; its "
                "config.yaml names the plugins)"
            )
        if args.overwrite:
            raise ConfigError("--overwrite: not with --resume (it continues the run in DIR)")
        out = Path(args.resume)
        cfg = _resume_config(out, overrides)
        from fedhp.engine.checkpoint import check_resume

        check_resume(out, cfg.checkpoint_every, args.from_previous)  # before the data is loaded
    else:
        if args.from_previous:
            raise ConfigError("--from-previous: only with --resume DIR")
        from fedhp.api import refuse_sweep_file

        refuse_sweep_file(config_path)
        cfg = resolve_config(config_path, overrides, plugins=args.plugin)
        out = Path(args.out) if args.out else default_out_dir(cfg)
        check_out_dir(out, args.overwrite, create=False)  # before the data is loaded
    exp = prepare(cfg)
    if args.check:
        fed = exp.ctx.fed
        print(
            f"ok: {cfg.algorithm.get('name')} on {cfg.dataset.get('name')}, {fed.num_clients} "
            f"clients, {exp.ctx.topology.num_edges} edges, {exp.model.num_params:,} parameters"
        )
        return 0
    fresh: FreshFolder | None = None
    if args.resume is None:
        fresh = FreshFolder(out)  # removed again if the start fails before its first round
        check_out_dir(out, args.overwrite)
    elif args.from_previous:
        from fedhp.engine.checkpoint import use_previous

        use_previous(out)  # the damaged checkpoint.pt is kept as checkpoint.set-aside.pt
    try:
        summary = run_built(
            exp,
            out,
            resume=args.resume is not None,
            on_round=fresh.on_round if fresh is not None else None,
        )
    except KeyboardInterrupt:
        if fresh is not None and fresh.discard():
            print(
                "fedhp: interrupted before the first round finished; nothing kept (run the "
                "same command again)",
                file=sys.stderr,
            )
        else:
            print(f"fedhp: interrupted; continue with: fedhp run --resume {out}", file=sys.stderr)
        return 130
    except DivergenceError:
        raise  # (its results are kept)
    except BaseException:
        if fresh is not None:
            fresh.discard()  # a failed start leaves no folder that blocks the re-run
        raise
    parts = [
        f"{k}={summary[k]:.4f}" for k in ("final_global_acc", "final_personal_acc") if k in summary
    ]
    print(f"done: {summary['rounds']} rounds in {summary['seconds']:.1f}s; {' '.join(parts)}")
    print(results_line(out))
    return 0


def _options_line(cls: Any) -> str:
    """``name=default, ...`` of a component's options (``name (required)`` where there is no
    default)."""
    parts = []
    for name, field in getattr(cls, "model_fields", {}).items():
        if field.is_required():
            parts.append(f"{name} (required)")
        else:
            default = field.get_default(call_default_factory=True)
            parts.append(f"{name}={default!r}")
    return ", ".join(parts) if parts else "(no options)"


SUMMARY_CHARS = 160
"""``fedhp list`` shows a component's first paragraph, cut after the sentence that passes this."""


def plain(text: str) -> str:
    """Docstring text for people: ``literal`` and :role:`target` markup removed."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def summary_of(doc: str | None) -> str:
    """A component's summary: its docstring's first paragraph in whole sentences (at least the
    first), without markup."""
    if not doc:
        return ""
    paragraph = " ".join(plain(doc).strip().split("\n\n")[0].split())
    sentences = re.split(r"(?<![ (]e\.g\.)(?<![ (]i\.e\.)(?<=[.!?])\s+(?=[A-Z(])", paragraph)
    out = sentences[0]
    for sentence in sentences[1:]:
        if len(out) >= SUMMARY_CHARS:
            break
        out += " " + sentence
    return out


def _wrapped(text: str, indent: int) -> str:
    pad = " " * indent
    return textwrap.fill(text, width=100, initial_indent=pad, subsequent_indent=pad + "  ")


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
            print(f"  {name}")
            print(_wrapped(summary_of(cls.__doc__), 6))
            print(_wrapped(f"options: {_options_line(cls)}", 6))
            if registry is MODELS:
                print(_wrapped(_parameter_counts(cls()), 6))
            for line in _choice_lines(cls):
                print(_wrapped(plain(line), 8))
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
    from fedhp.errors import ConfigError
    from fedhp.reporting import FIGURE_FORMATS

    out = Path(args.out)
    kind = out.suffix.lower().lstrip(".")
    if not args.out.strip() or kind not in FIGURE_FORMATS:
        raise ConfigError(
            f"--out {args.out!r}: the figure's name must end in "
            f"{', '.join('.' + k for k in FIGURE_FORMATS)} (the format it is written in), "
            f"e.g. --out {out.stem or 'fig'}.png"
        )
    from fedhp.reporting import parse_formats

    formats = parse_formats(args.format) if args.format is not None else []
    compare([Path(d) for d in args.runs], out, args.metric, args.x, not args.no_band, formats)
    return 0


def _method_names(name: str, opts: Any) -> tuple[str, ...] | None:
    """The names ``--methods`` may list for reproduction ``name`` (None: it runs a fixed set)."""
    import dataclasses

    from fedhp.experiments import dp, fedlps, figures, fnrfl, leaf, robust, table1, tune

    if name == "sfedhp-lambda":
        from fedhp.experiments import lambda_sweep

        jobs = lambda_sweep.jobs(dataclasses.replace(opts, methods=None))
        return tuple(dict.fromkeys(job.method for job in jobs))
    names: dict[str, tuple[str, ...]] = {
        "sfedhp-table1": (*table1.METHODS, *table1.EXTRA_METHODS),
        "leaf-shakespeare": tuple(leaf.METHODS),
        "sfedhp-tune": tuple(tune.GRIDS),
        "sfedhp-figures": tuple(figures.FIG_PANELS),
        "fnrfl-table2": tuple(fnrfl.METHODS),
        "fedlps-table1": (*fedlps.TABLE1, *fedlps.TABLE1_EXTRA),
        "fedlps-ablation": tuple(fedlps.ABLATION),
        "robust": tuple(robust.ALGORITHMS),
        "dp": tuple(dp.METHODS),
    }
    return names.get(name)


def check_methods(name: str, opts: Any) -> None:
    """A one-line error for ``--methods`` naming something reproduction ``name`` does not run."""
    from fedhp.errors import ConfigError

    if opts.methods is None:
        return
    valid = _method_names(name, opts)
    if valid is None:
        raise ConfigError(f"--methods: {name} runs a fixed set of methods; drop --methods")
    unknown = [m for m in opts.methods if m not in valid]
    if unknown or not opts.methods:
        shown = ", ".join(repr(m) for m in unknown) or "none"
        raise ConfigError(f"--methods: unknown {shown} for {name}; choose from {', '.join(valid)}")


FEDHT = ("fedht-sim1", "fedht-sim2", "fedht-mnist", "fedht-libsvm", "fedht-noiseless")
FLAG_READERS: dict[str, tuple[str, ...]] = {
    "quick": (
        "fnrfl-table2",
        "fedlps-table1",
        "fedlps-ablation",
        "robust",
        "robust-paper",
        "dp",
        "leaf-shakespeare",
    ),
    "leak": ("fnrfl-table2",),
    "skews": ("fnrfl-table2",),
    "gamma": FEDHT,
    "path": ("fedht-libsvm",),
    "tuned": ("sfedhp-table1", "sfedhp-lambda", "sfedhp-tune"),
}
"""The reproductions that read each of ``fedhp reproduce``'s flags (the others ignore it)."""


def check_reproduce_flags(args: argparse.Namespace) -> None:
    """One-line errors for a flag reproduction ``args.name`` does not read, an ``--out`` or
    ``--runs`` that is a file, and a ``--tuned`` file holding no choices for the dataset and
    setting."""
    from fedhp.errors import ConfigError

    for flag, readers in FLAG_READERS.items():
        value = getattr(args, flag)
        if value not in (None, False) and args.name not in readers:
            raise ConfigError(
                f"--{flag}: {args.name} does not read it (read by {', '.join(readers)} only); "
                f"drop --{flag}"
            )
    for flag in ("out", "runs"):
        value = getattr(args, flag)
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            raise ConfigError(f"--{flag} {value}: is a file; name a folder")
    if args.tuned is not None and args.name != "sfedhp-tune":
        check_tuned(Path(args.tuned), args.dataset, args.setting)


def check_tuned(path: Path, dataset: str, setting: int) -> None:
    """``--tuned FILE`` for sfedhp-table1 / sfedhp-lambda: sfedhp-tune's choices for this
    dataset and setting, else a one-line error saying how to write them."""
    from fedhp.errors import ConfigError

    key = f"{dataset}-s{setting}"
    write = (
        f"write them with `fedhp reproduce sfedhp-tune --dataset {dataset} --setting {setting} "
        f"--tuned {path}`"
    )
    if not path.is_file():
        raise ConfigError(f"--tuned {path}: not found; {write}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--tuned {path}: not sfedhp-tune's JSON ({err}); {write}") from None
    entry = data.get(key) if isinstance(data, dict) else None
    choices = entry.get("choices") if isinstance(entry, dict) else None
    if not isinstance(choices, dict) or not choices:
        held = ", ".join(data) if isinstance(data, dict) and data else "nothing"
        raise ConfigError(
            f"--tuned {path}: holds no choices for {dataset} setting {setting} ({key}; it holds "
            f"{held}); {write}"
        )


def _parameter_counts(options: Any) -> str:
    """A model's parameter (and BatchNorm buffer) counts with its default options on MNIST-
    and CIFAR-shaped inputs with 10 classes (a text model: on Shakespeare's windows)."""
    from fedhp.errors import ConfigError

    parts = []
    for label, shape in (("1x28x28", (1, 28, 28)), ("3x32x32", (3, 32, 32))):
        try:
            model = options.build(shape, 10)
        except ConfigError:
            continue
        extra = f" + {model.num_buffers:,} buffers" if model.num_buffers else ""
        parts.append(f"{model.num_params:,} parameters{extra} on {label}")
    if not parts:  # a sequence model: Shakespeare's 80-character windows, 81 classes
        try:
            model = options.build((80,), 81)
            parts.append(f"{model.num_params:,} parameters on 80-character windows, 81 classes")
        except ConfigError:
            pass
    if not parts:
        return "size: depends on the dataset's features (not an image model)"
    return "size: " + "; ".join(parts)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from fedhp.errors import ConfigError
    from fedhp.experiments import REPRODUCTIONS, ReproOptions

    if args.name not in REPRODUCTIONS:
        raise ConfigError(
            f"reproduce: unknown {args.name!r}; choose from {', '.join(REPRODUCTIONS)}"
        )
    warn_repeated(args.overrides)
    check_reproduce_flags(args)
    methods = None
    if args.methods is not None:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
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
        methods=methods,
        data_dir=args.data_dir,
        extra=[*args.overrides, *_plugin_overrides(args.plugin)],
        jobs=args.jobs,
        quick=args.quick,
        leak=args.leak,
        skews=args.skews.split(",") if args.skews else None,
    )
    check_methods(args.name, opts)
    if args.heterogeneity:  # issue 41: robust's heterogeneity grid (docs/robustness.md)
        from fedhp.experiments.robust import heterogeneity

        heterogeneity(args.name, opts, later=args.later_rows)
        return 0
    if args.later_rows:  # issue 41: the later rows follow --heterogeneity's test stage
        raise ConfigError("--later-rows: only with `reproduce robust --heterogeneity`")
    REPRODUCTIONS[args.name](opts)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fedhp.plugins import add_plugin_option

    parser = _Parser(
        prog="fedhp", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fedhp {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run one experiment")
    add_items(run)
    run.add_argument("--out", help="results folder (default runs/<algorithm>-<dataset>-<time>)")
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in DIR from its config.yaml and checkpoint.pt, verified first "
        "(only rounds=N and progress=... may be given)",
    )
    run.add_argument(
        "--from-previous",
        action="store_true",
        help="with --resume: continue from checkpoint.prev.pt, the checkpoint before the last "
        "(when checkpoint.pt is damaged; it is kept as checkpoint.set-aside.pt)",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, a folder holding a run is refused)",
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
    cmp.add_argument(
        "--out", required=True, help="figure to write: .png, .pdf or .svg, e.g. fig.png"
    )
    cmp.add_argument("--no-band", action="store_true", help="no mean ± std band per seed group")
    cmp.add_argument(
        "--format",
        metavar="FMT[,FMT]",
        help="also write the figure in these formats beside --out: png, pdf, svg (e.g. pdf,svg)",
    )
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
        "fedlps-table1 | fedlps-ablation | robust | robust-paper | dp | leaf-shakespeare",
    )
    rep.add_argument(
        "overrides", nargs="*", metavar="key=value", help="applied to every run (right after NAME)"
    )
    rep.add_argument("--dataset", choices=("mnist", "fmnist", "cifar10"), default="mnist")
    rep.add_argument("--setting", type=int, choices=(1, 2), default=1)
    rep.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        help="global rounds T (default 800; fedht-*: their own)",
    )
    rep.add_argument(
        "--seeds",
        type=_positive_int,
        default=1,
        help="how many seeds: N runs seeds 0..N-1, so --seeds 3 is seeds 0, 1, 2 (default 1; "
        "`fedhp sweep --seeds` lists the seeds themselves)",
    )
    rep.add_argument(
        "--model",
        choices=("dnn", "dnn-500-200", "mlr", "cnn", "cnn2", "vgg", "resnet18", "vgg11", "small"),
        default=None,
        help="default: dnn (784-100-10) for MNIST/FMNIST, vgg for CIFAR-10; fnrfl-table2: "
        "resnet18 | vgg11 | small (default resnet18, --quick: small); fedlps-*: cnn2",
    )
    rep.add_argument("--out", help="folder for table.md/table.json/figures")
    rep.add_argument("--runs", help="folder of the individual runs (default OUT/runs; reused)")
    rep.add_argument("--eval-every", type=_positive_int, default=10, help="evaluate every N rounds")
    rep.add_argument(
        "--threads", type=_positive_int, default=1, help="torch threads per run (default 1)"
    )
    rep.add_argument(
        "--jobs", type=_positive_int, default=1, help="runs at once, in worker processes"
    )
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
        "robust: 10 rounds, sign flip and ALIE at 20%% only (with --heterogeneity: 10 rounds, "
        "2 label shards only, cclip tau x1 only, 1 rule at HierFAVG, --seeds test seeds); "
        "robust-paper: 40 rounds, CM and CClip under BF and ALIE only; dp: "
        "40 rounds; leaf-shakespeare: 17 roles, 40-character windows, LSTM 32, 20 local steps, "
        "100 rounds, step sizes chosen on validation (CPU-sized; the paper's scale needs a GPU)",
    )
    rep.add_argument(
        "--leak", action="store_true", help="fnrfl-table2: the authors' protocol (D_pub = test set)"
    )
    rep.add_argument(
        "--heterogeneity",
        action="store_true",
        help="robust: issue 41's grid instead (IID / Dirichlet 0.5 / 0.1 / 2 label shards x "
        "attacks x rules x bucketing x client momentum, one configuration per algorithm chosen "
        "on validation, then tested over 3 seeds; docs/robustness.md)",
    )
    rep.add_argument(
        "--later-rows",
        action="store_true",
        help="robust --heterogeneity: then the chosen configurations and the mean under label "
        "flip 20%%, the attacks at 10%%, buckets of 5 and the DNN (test, the test seeds)",
    )
    rep.add_argument(
        "--skews", help="fnrfl-table2: comma-separated feature,label,quantity,label+feature,mixed"
    )
    rep.set_defaults(func=cmd_reproduce)
    from fedhp.sweep.cli import add_parser as add_sweep_parser

    add_sweep_parser(sub)  # fedhp sweep (docs/sweep.md)
    from fedhp.flower.deploy_cli import add_parser as add_flower_parser

    add_flower_parser(sub)  # fedhp flower certs|keys|app|deploy (docs/flower.md)
    return parser


def _version() -> str:
    """The installed package's version (the source tree's where it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("fedhp")
    except metadata.PackageNotFoundError:
        from fedhp.version import __version__

        return __version__


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """fedhp's warnings as one line on stderr; others as Python shows them."""
    if issubclass(category, FedhpWarning):
        print(f"fedhp: warning: {message}", file=sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedhp`` console script."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", FedhpWarning)
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:  # --help, --version (0) and argument errors (2, one line) end here
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
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 2
    try:
        code: int = args.func(args)
        return code
    except FedhpError as err:
        print(f"fedhp: error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # a path the command cannot read or write
        where = f"{err.filename}: " if err.filename else ""
        print(
            f"fedhp: error: {where}{err.strerror or err} (check the path and its permissions)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("fedhp: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
