"""Plugins: your own algorithms, datasets, models and partitions, in your own file or package.

A plugin is a Python file (``my_alg.py``) or an importable module (``mypkg.fedhp_algos``) whose
import registers components, e.g. ``@ALGORITHMS.register("myalg")``. It is named

* on the command line: ``fedhp run --plugin my_alg.py algorithm.name=myalg``;
* in a run's YAML: ``plugins: [my_alg.py]`` (relative paths: from the YAML file's folder);
* from Python: ``fedhp.run(..., plugins=["my_alg.py"])``;
* by an installed package, through the ``fedhp.plugins`` entry-point group (loaded always).

The resolved configuration keeps every plugin (files as absolute paths), so whatever rebuilds the
run from it — ``--resume``, the Flower nodes, reproduction workers — loads them too
(:func:`fedhp.config.validate_config` calls :func:`load_plugins`). Each plugin is imported once
per process. A broken plugin is a one-line :class:`PluginError`, never a traceback; one written
against an older surface (a name or module that moved or was withdrawn, :data:`SUPERSEDED`,
:data:`MOVED_MODULES`, :data:`WITHDRAWN`, :data:`WITHDRAWN_METHODS`) is told what replaces it.
The names a plugin may use are :mod:`fedhp.extend`'s (docs/extending.md).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from types import ModuleType

from fedhp.errors import FedhpError

ENTRY_POINT_GROUP = "fedhp.plugins"

SUPERSEDED: dict[str, str] = {
    # what a plugin used before (``module.name`` or ``Class.attribute``) -> what replaces it;
    # a name that leaves the plugin surface or one of its homes gets a row (and CHANGELOG.md)
    "fedhp.algorithms.base.ExtraGrad": "import it from fedhp.extend",
    "fedhp.algorithms.base.LossGrad": "import it from fedhp.extend",
    "fedhp.algorithms.base.LocalOptimizer": "import it from fedhp.extend",
    "fedhp.algorithms.base.DenseDeviceCost": "import it from fedhp.algorithms.device_cost",
    "fedhp.algorithms.base.CapabilityMode": "import it from fedhp.algorithms.device_cost",
    "fedhp.algorithms.base.capabilities_field": "import it from fedhp.algorithms.device_cost",
    "fedhp.algorithms.device_cost.SizedByCapability": "hold a SizedCostModel "
    "(fedhp.algorithms.device_cost) as a component",
    "fedhp.engine.protocol.LocalWork": "import LocalWork from fedhp.extend (the options "
    "protocol is fedhp.engine.protocol.LocalWorkOptionsLike)",
    "AlgorithmOptions.attack_ready": 'declare uploads = {"cloud": "model"} on the options class',
    "AlgorithmOptions.robust_levels": 'declare uploads = {"cloud": "model"} on the options class',
    "AlgorithmOptions.private_levels": 'declare uploads = {"cloud": "model"} on the options class',
}
MOVED_MODULES: dict[str, str] = {
    # modules a plugin imported that are gone -> where their contents went (CHANGELOG.md)
    "fedhp.algorithms.flat": "FlatRounds is part of FedAvg: subclass FedAvg (fedhp.extend)",
    "fedhp.engine.robust": "the robust rules are in fedhp.engine.robust_rules",
    "fedhp.engine.policy": "the execution policy is in fedhp.models.policy",
}
WITHDRAWN: dict[str, str] = {
    # members an older surface's plugin used (``ctx.`` RunContext's, ``self.`` an Algorithm's)
    # -> what replaces them (CHANGELOG.md); found in the plugin's source before it is imported
    "ctx.local_sgd_epochs": "call ctx.local_sgd(start, clients, LocalWork(lr, batch_size, "
    "epochs=E), extra_grad)",
    "ctx.local_sgd_masked": "call ctx.local_sgd(start, clients, work, extra_grad, mask=mask)",
    "ctx.upload": "pass the uploads through ctx.cloud_uplink (docs/extending.md 6b)",
    "ctx.cloud_mean": "call ctx.cloud_uplink.aggregate(rows, weights, start)",
    "ctx.dp_denominator": "ctx.cloud_uplink applies DP (docs/extending.md 6b)",
    "ctx.sample_clients": "call ctx.participation.sample_clients()",
    "ctx.sample_edges": "call ctx.participation.sample_edges()",
    "ctx.clients_of_edges": "call ctx.participation.clients_of_edges(edges)",
    "ctx.round_stragglers_under": "call ctx.participation.stragglers_under(edges)",
    "self.local_update": "call self.ctx.local_sgd(start, clients, self.options.work(), extra_grad)",
    "self.init_buffer_state": "call self.buffers.init_state(device)",
    "self.start_buffers": "call self.buffers.start(state, clients, sent)",
    "self.keep_buffers": "call self.buffers.keep(state, clients, trained)",
    "self.sent_buffers": "call self.buffers.sent(state)",
    "self.wire": "send a fedhp.comm.Message (named fields)",
    "self.unwire": "read the fields of the fedhp.comm.Message received",
}
ROUND_OVER_RUNS = (
    "write the round over a list of (algorithm, state, task) and call it from train through "
    "self.ctx.together(round_fn, key, (self, state, task)) (docs/extending.md, 6c)"
)
WITHDRAWN_METHODS: dict[str, str] = {
    # methods an older surface's algorithm defined that nothing calls any more -> what replaces
    # them (CHANGELOG.md); found in the plugin's source before it is imported
    "stack_key": ROUND_OVER_RUNS,
    "stacked_train": ROUND_OVER_RUNS,
}
_NO_MODULE = re.compile(r"No module named '(fedhp[\w.]*)'")
_CANNOT_IMPORT = re.compile(r"cannot import name '(\w+)' from '(fedhp[\w.]*)'")
_UNANNOTATED = re.compile(r"non-annotated attribute was detected: `(\w+) =")

_LOADED: dict[str, tuple[ModuleType, float]] = {}  # plugin -> (module, file mtime)
_ENTRY_POINTS_LOADED: list[bool] = []


class PluginError(FedhpError):
    """A plugin file or module is missing, does not import, or registers a name already taken."""


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """The ``--plugin FILE|MODULE`` option (repeatable) of the commands that build runs."""
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE|MODULE",
        help="import this .py file or module first, so the algorithms, datasets, models and "
        "partitions it registers can be named (repeatable; docs/extending.md)",
    )


def is_file_plugin(spec: str) -> bool:
    """Whether ``spec`` names a file (``*.py`` or a path) rather than a module."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def resolve_plugin(spec: str, base: Path | None = None) -> str:
    """``spec`` as kept in the resolved configuration: files as absolute paths (relative ones
    from ``base``, default the working directory), module names unchanged."""
    if not is_file_plugin(spec):
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return str(path.resolve())


def superseded(err: BaseException) -> str | None:
    """``NAME is the old surface: <what replaces it> (CHANGELOG.md)`` where ``err`` is a plugin
    using a name that moved or was withdrawn (:data:`SUPERSEDED`); else None."""
    text = str(err)
    gone = _NO_MODULE.search(text)
    if gone is not None and gone.group(1) in MOVED_MODULES:
        module = gone.group(1)
        return f"{module} is the old surface: {MOVED_MODULES[module]} (CHANGELOG.md)"
    found = _CANNOT_IMPORT.search(text)
    if found is not None:
        name, module = found.groups()
        new = SUPERSEDED.get(f"{module}.{name}")
    else:
        found = _UNANNOTATED.search(text)
        if found is None:
            return None
        name = found.group(1)
        new = SUPERSEDED.get(f"AlgorithmOptions.{name}")
    return None if new is None else f"{name} is the old surface: {new} (CHANGELOG.md)"


def _owner(node: ast.expr) -> str | None:
    """``"ctx"`` for ``ctx`` or ``<anything>.ctx``, ``"self"`` for ``self``, else None."""
    if isinstance(node, ast.Name) and node.id in ("ctx", "self"):
        return node.id
    return "ctx" if isinstance(node, ast.Attribute) and node.attr == "ctx" else None


def withdrawn_use(source: str) -> str | None:
    """``line N: MEMBER is the old surface: <what replaces it> (CHANGELOG.md)`` for the first
    use in ``source`` of a member the surface withdrew (:data:`WITHDRAWN`; a name the plugin
    defines itself does not count); None if there is none (or it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr not in own:
            member = f"{_owner(node.value)}.{node.attr}"
            if member in WITHDRAWN:
                found.append((node.lineno, member, WITHDRAWN[member]))
        if isinstance(node, ast.ClassDef):  # a method nothing calls any more
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in WITHDRAWN_METHODS:
                    found.append((item.lineno, item.name, WITHDRAWN_METHODS[item.name]))
    if not found:
        return None
    line, member, new = min(found)
    return f"line {line}: {member} is the old surface: {new} (CHANGELOG.md)"


def _origin(module: str) -> str | None:
    """The file of ``module``, without importing it (None: not found)."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return None if found is None else found.origin


def _check_source(path: str | None, label: str) -> None:
    """Stop with one line if the plugin source at ``path`` uses a withdrawn member."""
    if path is None or not path.endswith(".py"):
        return
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    old = withdrawn_use(source)
    if old is not None:
        raise PluginError(f"{label}: {old}")


def _where(err: BaseException, path: str) -> str:
    """``line N: Kind: message`` of the innermost frame in the plugin file (or just the error;
    for a name of an older surface, what replaces it)."""
    if isinstance(err, SyntaxError):
        return f"line {err.lineno}: SyntaxError: {err.msg}"
    line = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename == path:
            line = f"line {frame.lineno}: "
    text = " ".join(str(err).split()) or "(no message)"
    return f"{line}{superseded(err) or f'{type(err).__name__}: {text}'}"


def _import_file(path: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        raise PluginError(f"plugin {path}: file not found (check the path given to --plugin)")
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    name = f"fedhp_plugin_{file.stem.replace('-', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path}: not a Python file")
    _check_source(str(file), f"plugin {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic and dataclasses look their module up while importing
    try:
        spec.loader.exec_module(module)
    except FedhpError as err:
        sys.modules.pop(name, None)
        raise PluginError(f"plugin {path}: {err}") from None
    except Exception as err:
        sys.modules.pop(name, None)
        raise PluginError(f"plugin {path}: {_where(err, str(file))}") from None
    return module


def _import_module(name: str) -> ModuleType:
    _check_source(_origin(name), f"plugin {name}")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is not None and name.startswith(err.name):
            raise PluginError(
                f"plugin {name}: no such module (give a .py file or an importable module name)"
            ) from None
        raise PluginError(f"plugin {name}: ModuleNotFoundError: {err}") from None
    except FedhpError as err:
        raise PluginError(f"plugin {name}: {err}") from None
    except Exception as err:
        text = superseded(err) or f"{type(err).__name__}: {err}"
        raise PluginError(f"plugin {name}: {text}") from None


def _mtime(path: str) -> float:
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return -1.0


def load_plugin(spec: str) -> ModuleType:
    """Import one plugin (a file path or module name) once per process; a file changed since
    (edited in a notebook session, say) is imported again, replacing its registrations."""
    key = resolve_plugin(spec)
    if not is_file_plugin(key):
        if key not in _LOADED:
            _LOADED[key] = (_import_module(key), 0.0)
        return _LOADED[key][0]
    mtime = _mtime(key)
    if key in _LOADED:
        module, loaded = _LOADED[key]
        if loaded == mtime:
            return module
        from fedhp.registry import Registry

        for registry in Registry.every:
            registry.forget_module(module.__name__)
    _LOADED[key] = (_import_file(key), mtime)
    return _LOADED[key][0]


def load_entry_points() -> None:
    """Import every installed package's ``fedhp.plugins`` entry point (once per process)."""
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED.append(True)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        _check_source(_origin(ep.module), f"plugin entry point {ep.name} ({ep.value})")
        try:
            ep.load()
        except FedhpError as err:
            raise PluginError(f"plugin entry point {ep.name} ({ep.value}): {err}") from None
        except Exception as err:
            text = superseded(err) or f"{type(err).__name__}: {err}"
            raise PluginError(f"plugin entry point {ep.name} ({ep.value}): {text}") from None


def load_plugins(specs: Iterable[str] = ()) -> None:
    """Import the installed entry points and then ``specs`` (each once per process)."""
    load_entry_points()
    for spec in specs:
        load_plugin(spec)
