"""``fedhp flower ...``: development certificates, SuperNode keys, the Flower app project, and a
whole loopback deployment (SuperLink + SuperNodes as processes, TLS and node authentication on).

Nothing here imports flwr or torch until a command runs, so ``fedhp --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhp.cli_args import add_items, split_positionals

if TYPE_CHECKING:
    from fedhp.config import RunConfig


def require_flower() -> None:
    """A one-line error when Flower (and the ``cryptography`` it brings) is not installed."""
    import importlib.util

    from fedhp.errors import FedhpError

    if importlib.util.find_spec("flwr") is None or importlib.util.find_spec("cryptography") is None:
        raise FedhpError("fedhp flower: Flower is not installed; pip install 'fedhp[flower]'")


def resolve_run_config(
    items: list[str], out: str, plugins: Sequence[str] = ()
) -> tuple[RunConfig, dict[str, str | int | float | bool], int]:
    """The validated fedhp config, the Flower run config (``fedhp-config``, ``fedhp-out``,
    ``fedhp-resume`` false: declared so that ``flwr run --run-config 'fedhp-resume=true'`` can
    override it) and the number of SuperNodes the run needs, checked before any process starts.
    ``plugins`` (``--plugin``) travel in ``fedhp-config`` as absolute paths: the ServerApp and
    every ClientApp import them (the files must exist at those paths where they run)."""
    import yaml

    from fedhp.algorithms import ALGORITHMS
    from fedhp.build import check_components
    from fedhp.config import config_to_dict, resolve_config
    from fedhp.errors import ConfigError
    from fedhp.flower.shards import node_count

    config_path, overrides = split_positionals(items)
    cfg = resolve_config(config_path, overrides, plugins=plugins, on_flower=True)
    check_components(cfg)
    options = ALGORITHMS.build(cfg.algorithm, "algorithm")
    if not options.federated:
        raise ConfigError(
            f"algorithm.name: {cfg.algorithm.get('name')} is a non-federated reference row and "
            "cannot run on a Flower deployment; use fedhp run"
        )
    if cfg.device != "cpu":
        raise ConfigError("device: a Flower deployment runs on the CPU; use device=cpu")
    nodes = node_count(cfg, options.hierarchical)
    text = yaml.safe_dump(config_to_dict(cfg, on_flower=True), sort_keys=False)
    run_config: dict[str, str | int | float | bool] = {
        "fedhp-config": text,
        "fedhp-out": str(Path(out).resolve()),
        "fedhp-resume": False,
    }
    return cfg, run_config, nodes


def writable_folder(folder: Path, what: str) -> Path:
    """``folder`` made (with its parents), or a one-line error naming ``what`` (the argument)
    where it is a file or cannot be written."""
    from fedhp.errors import ConfigError

    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{what} {folder}: is a file, not a folder; name a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"{what} {folder}: cannot be created ({err.strerror or err}); name a folder you can "
            "write to"
        ) from None
    return folder


def cmd_certs(args: argparse.Namespace) -> int:
    require_flower()
    from fedhp.flower.certs import DEFAULT_HOSTS, write_certificates

    writable_folder(Path(args.dir), "flower certs DIR")
    hosts = tuple(args.host) if args.host else DEFAULT_HOSTS
    paths = write_certificates(Path(args.dir), hosts=hosts, days=args.days)
    print(f"CA: {paths.ca_cert} (key {paths.ca_key}); SuperLink: {paths.server_cert}, ", end="")
    print(f"{paths.server_key} for {', '.join(hosts)}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    require_flower()
    from fedhp.flower.certs import write_node_keys

    if args.nodes >= 1:  # (write_node_keys names a bad count)
        writable_folder(Path(args.dir), "flower keys DIR")
    for key in write_node_keys(Path(args.dir), args.nodes, prefix=args.prefix):
        print(f"{key.private} (SuperNode) / {key.public} (flwr supernode register)")
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    require_flower()
    from fedhp.flower.packaging import write_app

    _, run_config, nodes = resolve_run_config(args.items, args.out, args.plugin)
    app = write_app(Path(args.dir), run_config)
    print(f"Flower app: {app}/pyproject.toml; results will go to {run_config['fedhp-out']}")
    print(f"it needs {nodes} SuperNodes (flower.nodes)")
    print(f"run it with: flwr run {app} <connection>")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    require_flower()
    from fedhp.flower.deploy import LoopbackFederation
    from fedhp.flower.packaging import write_app
    from fedhp.flower.processes import Stopped, stop_on_signals

    items = list(args.items)
    if args.nodes is not None:
        items.append(f"flower.nodes={args.nodes}")
    _, run_config, nodes = resolve_run_config(items, args.out, args.plugin)
    workdir = Path(args.workdir) if args.workdir else Path(args.out) / "flower-deploy"
    try:
        with stop_on_signals(), LoopbackFederation(workdir, nodes=nodes) as fed:
            print(f"SuperLink on {fed.address} (TLS, node authentication), {nodes} SuperNodes")
            app = write_app(workdir / "app", run_config)
            result = fed.run(app, timeout=args.timeout)
    except Stopped as stop:  # (the federation stopped its SuperNodes, then its SuperLink)
        print(
            f"fedhp: {stop}; the deployment's processes are stopped (the run's checkpoint, if "
            f"any, is in {args.out}/)",
            file=sys.stderr,
        )
        return stop.code
    line = f"run {result.run_id}: {result.status} in {result.seconds:.1f}s"
    summary = Path(args.out) / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        if "seconds_per_round" in data:
            line += f"; {data['seconds_per_round']:.2f} s/round"
    print(line)
    print(f"results: {args.out}/; logs: {workdir}/logs/ (the run's output: {result.log.name})")
    return 0 if result.ok else 1


def add_parser(sub: Any) -> None:
    """Add ``flower`` and its subcommands to the ``fedhp`` subparsers ``sub``."""
    from fedhp.plugins import add_plugin_option

    flower = sub.add_parser(
        "flower", help="Flower deployment: dev certificates, node keys, app project, loopback run"
    )
    fsub = flower.add_subparsers(dest="flower_command", required=True, parser_class=type(flower))
    certs = fsub.add_parser("certs", help="write a development CA and a SuperLink certificate")
    certs.add_argument("dir", help="folder for ca.crt, ca.key, server.pem, server.key")
    host_help = "SuperLink host name or IP (repeatable; default 127.0.0.1 and localhost)"
    certs.add_argument("--host", action="append", help=host_help)
    certs.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    certs.set_defaults(func=cmd_certs)
    keys = fsub.add_parser("keys", help="write SuperNode authentication key pairs")
    keys.add_argument("dir", help="folder for <prefix>-<i> and <prefix>-<i>.pub")
    keys.add_argument("--nodes", type=int, required=True, help="number of key pairs")
    keys.add_argument("--prefix", default="node", help="file name prefix (default node)")
    keys.set_defaults(func=cmd_keys)
    app = fsub.add_parser("app", help="write the Flower app project for `flwr run`")
    app.add_argument("dir", help="folder for the app's pyproject.toml")
    add_items(app)
    app.add_argument(
        "--out", required=True, help="results folder (a path on the SuperLink's machine)"
    )
    add_plugin_option(app)
    app.set_defaults(func=cmd_app)
    dep = fsub.add_parser(
        "deploy", help="run on a loopback deployment: SuperLink + SuperNodes as processes"
    )
    add_items(dep)
    dep.add_argument("--out", required=True, help="results folder")
    dep.add_argument("--nodes", type=int, help="SuperNodes (default flower.nodes or num_edges)")
    dep.add_argument("--workdir", help="certs, keys, logs (default OUT/flower-deploy)")
    dep.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait for the run (default 3600)"
    )
    add_plugin_option(dep)
    dep.set_defaults(func=cmd_deploy)
