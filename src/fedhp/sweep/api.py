"""``fedhp.sweep(...)``: the Python face of ``fedhp sweep`` (docs/sweep.md)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError
from fedhp.sweep.grid import check_grid, parse_seeds
from fedhp.sweep.run import SweepSpec

__all__ = [
    "SweepResult",
    "default_sweep_dir",
    "seeds_of",
    "split_sweep_section",
    "sweep",
    "sweep_spec",
]

SECTION_KEYS = (
    "grid",
    "seeds",
    "out",
    "select",
    "metric",
    "runs_per_batch",
    "backend",
    "address",
    "batching",
    "format",
)
"""What a YAML file's ``sweep:`` section may set (the command's flags)."""


@dataclass
class SweepResult:
    """A finished sweep: its folder, the manifest (runs, grid, the selected point) and the
    table's rows (mean ± standard error over seeds per grid point)."""

    out_dir: Path
    manifest: dict[str, Any]
    table: list[dict[str, Any]]

    @property
    def selected(self) -> dict[str, Any] | None:
        """The grid point chosen on the validation split (``select="val"``), else None."""
        value: dict[str, Any] | None = self.manifest.get("selected")
        return value

    def run_dirs(self) -> list[Path]:
        """Every run folder (open one with :func:`fedhp.load_run`)."""
        return [self.out_dir / r["out_dir"] for r in self.manifest["runs"]]


def _seed_in(overrides: Sequence[str]) -> str | None:
    """The last ``seed=`` of ``overrides`` (its text), or None."""
    found = None
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.strip() == "seed":
            found = value.strip()
    return found


def seeds_of(
    file_base: Sequence[str], given_base: Sequence[str], seeds: Any, flag: str = "seeds"
) -> Any:
    """The sweep's seeds where its base also names a ``seed``: ``seed=`` given beside the seeds
    (``given_base``: the command line's, the API's keywords) is a one-line error; a CONFIG
    file's beside them a warning (each run's seed replaces it); without seeds, the base's seed
    is the sweep's one seed."""
    import warnings

    from fedhp.errors import FedhpWarning

    given, in_file = _seed_in(given_base), _seed_in(file_base)
    if seeds is not None:
        if given is not None:
            raise ConfigError(
                f"seed={given} beside {flag}: each run's seed comes from {flag} and would replace "
                f"it; drop seed={given}, or give {flag} {given}"
            )
        if in_file is not None:
            warnings.warn(
                f"the config file's seed: {in_file} is not used: each run's seed comes from {flag}",
                FedhpWarning,
                stacklevel=2,
            )
        return seeds
    chosen = given if given is not None else in_file
    return chosen


def default_sweep_dir(base: Sequence[str], plugins: Sequence[str] = ()) -> Path:
    """``sweeps/<algorithm>-<dataset>-<time>``."""
    from fedhp.config import resolve_config

    cfg = resolve_config(None, list(base), plugins=plugins)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("sweeps") / f"{cfg.algorithm.get('name')}-{cfg.dataset.get('name')}-{stamp}"


def split_sweep_section(path: Path | None) -> tuple[list[str], dict[str, Any]]:
    """A YAML file's options as ``key=value`` overrides (plugin paths taken from the file's
    folder) and its ``sweep:`` section, checked."""
    from fedhp.api import overrides_from_kwargs
    from fedhp.config import load_yaml
    from fedhp.plugins import resolve_plugin

    if path is None:
        return [], {}
    data = load_yaml(path)
    section = data.pop("sweep", None) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: sweep: must be a mapping of {', '.join(SECTION_KEYS)}")
    unknown = [k for k in section if k not in SECTION_KEYS]
    if unknown:
        raise ConfigError(
            f"{path}: sweep.{unknown[0]}: unknown; the sweep section takes "
            f"{', '.join(SECTION_KEYS)}"
        )
    plugins = data.pop("plugins", None) or []
    if plugins and not isinstance(plugins, list):
        raise ConfigError(f"{path}: plugins: must be a list of files or modules")
    folder = path.resolve().parent
    data = dict(data)
    overrides = overrides_from_kwargs(data)
    section = dict(section)
    section["plugins"] = [resolve_plugin(p, folder) if isinstance(p, str) else p for p in plugins]
    return overrides, section


def sweep_spec(
    base: Sequence[str],
    grid: Mapping[str, Sequence[Any]],
    *,
    out: str | Path,
    seeds: str | Sequence[int] | int | None = None,
    plugins: Sequence[str] = (),
    **options: Any,
) -> SweepSpec:
    """A checked :class:`~fedhp.sweep.run.SweepSpec`."""
    if not isinstance(out, str | Path):
        raise ConfigError(f"out: expected a folder name (str or Path); got {type(out).__name__}")
    spec = SweepSpec(
        out=Path(out),
        grid=check_grid(grid),
        seeds=parse_seeds(seeds),
        base=list(base),
        plugins=list(plugins),
        **options,
    )
    spec.check()
    return spec


def sweep(
    config: str | Path | Mapping[str, Any] | None = None,
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    out: str | Path | None = None,
    seeds: Sequence[int] | str | None = None,
    select: str | None = None,
    metric: str | None = None,
    runs_per_batch: int | None = None,
    backend: str | None = None,
    address: str | None = None,
    batching: str | None = None,
    format: str | None = None,
    progress: bool = True,
    plugins: Sequence[str] = (),
    **overrides: Any,
) -> SweepResult:
    """Run a sweep as ``fedhp sweep`` does and return its :class:`SweepResult`.

    ``config``: a YAML file (its ``sweep:`` section gives what the arguments leave unset), a
    mapping (laid over the defaults like a YAML file) or None; ``overrides`` as in
    :func:`fedhp.run` (``rounds=20``, ``algorithm__lr=0.1``); ``grid``:
    ``{"algorithm.lam": [15, 20]}``; ``seeds``: ``[0, 1, 2]`` (default ``[0]``); ``out``: the
    sweep's folder (default ``sweeps/<algorithm>-<dataset>-<time>``); ``format``: the figures'
    formats beside PNG (``"pdf,svg"``, as ``--format``); the rest as the command's flags
    (docs/sweep.md)."""
    from fedhp.api import overrides_from_kwargs
    from fedhp.sweep.folder import run_in_folder
    from fedhp.sweep.report import load_table

    _check_types(config, grid, plugins, progress, runs_per_batch)
    section: dict[str, Any] = {}
    file_base: list[str] = []
    if isinstance(config, Mapping):
        file_base = overrides_from_kwargs({k: v for k, v in config.items() if k != "plugins"})
        plugins = [*(config.get("plugins") or []), *plugins]
    else:
        file_base, section = split_sweep_section(Path(config) if config is not None else None)
        plugins = [*section.pop("plugins", []), *plugins]
    given_base = overrides_from_kwargs(overrides)
    base = [*file_base, *given_base]
    given = {
        "out": out,
        "seeds": seeds,
        "select": select,
        "metric": metric,
        "runs_per_batch": runs_per_batch,
        "backend": backend,
        "address": address,
        "batching": batching,
    }
    options = {k: v for k, v in section.items() if k != "grid"}
    options.update({k: v for k, v in given.items() if v is not None})
    figure_formats(options, format)
    options["seeds"] = seeds_of(file_base, given_base, options.get("seeds"))
    if options.get("out") is None:
        options["out"] = default_sweep_dir(base, plugins)
    full_grid = {**check_grid(section.get("grid") or {}), **check_grid(grid or {})}
    spec = sweep_spec(base, full_grid, plugins=plugins, progress=progress, **options)
    spec, manifest = run_in_folder(spec)
    return SweepResult(spec.out, manifest, load_table(spec.out))


def figure_formats(options: dict[str, Any], given: str | None) -> None:
    """``options["formats"]`` from ``given`` (``--format``, the API's ``format``) or the YAML
    section's ``format`` (the command's wins): PNG always, the others as named (one-line errors
    from :func:`fedhp.reporting.parse_formats`)."""
    from fedhp.reporting import parse_formats

    text = given if given is not None else options.pop("format", None)
    options.pop("format", None)
    if text is not None:
        if not isinstance(text, str):
            raise ConfigError(f"format: expected a text like 'pdf,svg'; got {text!r}")
        options["formats"] = ["png", *parse_formats(text)]


def _check_types(config: Any, grid: Any, plugins: Any, progress: Any, runs_per_batch: Any) -> None:
    """:func:`sweep`'s arguments of the wrong type: a one-line :class:`ConfigError` naming the
    argument (not a ``TypeError`` from deep inside)."""
    if config is not None and not isinstance(config, str | Path | Mapping):
        raise ConfigError(
            f"config: expected a YAML file (str or Path), a mapping of options or None; got "
            f"{type(config).__name__}"
        )
    if grid is not None:
        check_grid(grid)
    if isinstance(plugins, str) or not all(isinstance(p, str) for p in plugins):
        raise ConfigError("plugins: expected a list of files or modules, e.g. ['my_plugin.py']")
    if not isinstance(progress, bool):
        raise ConfigError(f"progress: expected True or False; got {progress!r}")
    if runs_per_batch is not None and (
        isinstance(runs_per_batch, bool) or not isinstance(runs_per_batch, int)
    ):
        raise ConfigError(f"runs_per_batch: expected an integer; got {runs_per_batch!r}")
