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
per process. A broken plugin is a one-line :class:`PluginError`, never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from types import ModuleType

from fedhp.errors import FedhpError

ENTRY_POINT_GROUP = "fedhp.plugins"

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


def _where(err: BaseException, path: str) -> str:
    """``line N: Kind: message`` of the innermost frame in the plugin file (or just the error)."""
    if isinstance(err, SyntaxError):
        return f"line {err.lineno}: SyntaxError: {err.msg}"
    line = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename == path:
            line = f"line {frame.lineno}: "
    text = " ".join(str(err).split()) or "(no message)"
    return f"{line}{type(err).__name__}: {text}"


def _import_file(path: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        raise PluginError(f"plugin {path}: file not found (check the path given to --plugin)")
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    name = f"fedhp_plugin_{file.stem.replace('-', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path}: not a Python file")
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
        raise PluginError(f"plugin {name}: {type(err).__name__}: {err}") from None


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
        try:
            ep.load()
        except FedhpError as err:
            raise PluginError(f"plugin entry point {ep.name} ({ep.value}): {err}") from None
        except Exception as err:
            raise PluginError(
                f"plugin entry point {ep.name} ({ep.value}): {type(err).__name__}: {err}"
            ) from None


def load_plugins(specs: Iterable[str] = ()) -> None:
    """Import the installed entry points and then ``specs`` (each once per process)."""
    load_entry_points()
    for spec in specs:
        load_plugin(spec)
