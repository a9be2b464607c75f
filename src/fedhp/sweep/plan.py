"""A sweep's runs and batches: each (grid point, seed) is a :class:`RunSpec` (its overrides, its
run folder and its identity, picklable for Ray), grouped into batches of runs that share their
structure (:func:`~fedhp.sweep.grid.batch_key`), at most ``runs_per_batch`` each.

A run the sweep folder already holds (the same identity, :mod:`fedhp.sweep.identity`) keeps its
folder and the overrides it ran with, however the command is typed now."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError, FedhpError
from fedhp.sweep.grid import GridPoint, batch_key
from fedhp.sweep.identity import digest, fixed_part, point_identity

__all__ = [
    "MANIFEST",
    "RunSpec",
    "carry_over",
    "hold_runs",
    "make_batches",
    "plan_runs",
    "run_digest",
    "read_manifest",
    "run_config",
    "spec_of",
]

MANIFEST = "sweep.json"


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: grid point ``point`` (its ``values``), ``seed``, the split it is
    evaluated on, its ``key=value`` overrides (the sweep's base, the point, the seed, the split)
    and its run folder."""

    point: str
    values: dict[str, Any]
    seed: int
    split: str
    overrides: list[str]
    out_dir: str
    rounds: int = 0
    key: str = field(default="", compare=False)
    plugins: list[str] = field(default_factory=list)
    eval_split: str = ""
    """The split the run really evaluates on (its resolved ``eval_split``)."""
    identity: str = ""
    """A digest of what the run computes (its configuration without cosmetic options)."""
    point_identity: str = ""
    """The same without the seed: the runs of one grid point share it."""
    fixed: str = ""
    """A digest of what every run of the sweep shares (the identity without the grid's keys)."""

    @property
    def folder(self) -> Path:
        return Path(self.out_dir)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the manifest's ``runs`` entries, without the batch key)."""
        out = asdict(self)
        out.pop("key")
        return out


def run_config(spec: RunSpec) -> Any:
    """The validated :class:`~fedhp.config.RunConfig` of ``spec``."""
    from fedhp.config import resolve_config

    return resolve_config(None, spec.overrides, plugins=spec.plugins)


@dataclass(frozen=True)
class _Resolved:
    """What planning needs of one grid point's configuration (cached per process)."""

    rounds: int
    eval_split: str
    key: str
    point_identity: str
    fixed: str
    val_sizes: tuple[Any, ...]


_RESOLVED: dict[tuple[Any, ...], _Resolved] = {}
CACHE_SIZE = 200_000


def _resolve(
    overrides: Sequence[str], plugins: Sequence[str], grid_keys: Sequence[str]
) -> _Resolved:
    """Resolve and check one point's configuration (its seed left at the default)."""
    from fedhp.config import config_to_dict, resolve_config

    cache_key = (tuple(overrides), tuple(plugins), tuple(grid_keys))
    hit = _RESOLVED.get(cache_key)
    if hit is not None:
        return hit
    cfg = resolve_config(None, list(overrides), plugins=plugins)
    config = config_to_dict(cfg)
    ident = point_identity(config)
    partition = config.get("partition") or {}
    resolved = _Resolved(
        cfg.rounds,
        cfg.eval_split,
        batch_key(config),
        digest(ident),
        digest(fixed_part(ident, grid_keys)),
        tuple(partition[k] for k in ("val_per_class", "val_fraction") if k in partition),
    )
    if len(_RESOLVED) >= CACHE_SIZE:
        _RESOLVED.clear()
    _RESOLVED[cache_key] = resolved
    return resolved


def run_digest(point_digest: str, seed: int) -> str:
    """A run's identity: its point's and its seed."""
    return digest(f"{point_digest}|seed={seed}")


def plan_runs(
    base: Sequence[str],
    points: Sequence[GridPoint],
    seeds: Sequence[int],
    folder: Path,
    split: str = "test",
    plugins: Sequence[str] = (),
    force_split: bool = True,
    progress: Callable[[int], None] | None = None,
    manifest: Mapping[str, Any] | None = None,
) -> list[RunSpec]:
    """Every (point, seed) run in ``folder/<point>/seed<k>``, each config resolved and checked
    now (a value the option refuses is a one-line error naming the grid key; two points that
    resolve to one configuration, too). With ``force_split`` every run evaluates on ``split``
    (``eval_split=<split>`` last, the stages of ``--select val``); else on the split its config
    names (``eval_split`` of the base). A run the sweep folder (``folder``'s parent) already
    holds keeps its point, folder and overrides (:func:`carry_over`; ``manifest``: the folder's,
    instead of reading it). ``progress``: called with the runs of each point planned."""
    runs = []
    seen: dict[str, str] = {}
    forced = [f"eval_split={split}"] if force_split else []
    for point in points:
        given = point.overrides()
        overrides = [*base, *given, *forced]
        try:
            resolved = _resolve(overrides, plugins, list(point.values))
        except FedhpError as err:
            where = f"grid point {point.id}" if point.values else "the sweep's base config"
            raise ConfigError(f"{where}: {err}") from None
        if resolved.point_identity in seen:
            raise ConfigError(
                f"--grid: grid points {seen[resolved.point_identity]} and {point.id} are one "
                "configuration once resolved (the same runs); give each value once"
            )
        seen[resolved.point_identity] = point.id
        if split == "val" and resolved.val_sizes and not any(resolved.val_sizes):
            where = f" (grid point {point.id})" if point.values else ""
            raise ConfigError(
                f"--select val: the runs{where} have no validation data; set "
                "partition.val_per_class (or partition.val_fraction) above 0"
            )
        point_dir = os.path.join(folder, point.folder)
        for seed in seeds:
            runs.append(
                RunSpec(
                    point.id,
                    dict(point.values),
                    seed,
                    split,
                    [*base, *given, f"seed={seed}", *forced],
                    os.path.join(point_dir, f"seed{seed}"),
                    rounds=resolved.rounds,
                    key=resolved.key,
                    plugins=list(plugins),
                    eval_split=resolved.eval_split,
                    identity=run_digest(resolved.point_identity, seed),
                    point_identity=resolved.point_identity,
                    fixed=resolved.fixed,
                )
            )
        if progress is not None:
            progress(len(seeds))
    return carry_over(runs, folder.parent, manifest)


_HELD: dict[Path, list[Mapping[str, Any]]] = {}
"""Per sweep folder, the runs its manifest listed when this process opened it (a sweep rewrites
its manifest before it plans its test runs)."""


def hold_runs(sweep_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Remember the runs ``manifest`` lists for :func:`carry_over` in this process."""
    _HELD[sweep_dir.resolve()] = [e for e in manifest.get("runs") or [] if isinstance(e, Mapping)]


def carry_over(
    runs: Sequence[RunSpec], sweep_dir: Path, manifest: Mapping[str, Any] | None = None
) -> list[RunSpec]:
    """``runs`` with those the sweep folder's manifest already lists (same identity, same
    split) in their listed folder with their listed overrides (so the run found there counts as
    finished or resumable), and every run of a point listed there under that point's name and
    folder."""
    if manifest is None:
        manifest = read_manifest(sweep_dir) or {}
    entries = [*(manifest.get("runs") or []), *_HELD.get(sweep_dir.resolve(), [])]
    if not entries:
        return list(runs)
    by_run: dict[tuple[str, str], Mapping[str, Any]] = {}
    by_point: dict[tuple[str, str], Mapping[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or not entry.get("identity"):
            continue
        split = str(entry.get("split", "test"))
        by_run.setdefault((split, str(entry["identity"])), entry)
        by_point.setdefault((split, str(entry.get("point_identity"))), entry)
    out = []
    for run in runs:
        old = by_run.get((run.split, run.identity))
        if old is not None:
            run = replace(
                run,
                point=str(old["point"]),
                values=dict(old.get("values") or {}),
                overrides=list(old["overrides"]),
                out_dir=str(sweep_dir / str(old["out_dir"])),
                key=_old_key(old, run),
            )
        elif (same := by_point.get((run.split, run.point_identity))) is not None:
            point_dir = Path(str(same["out_dir"])).parent
            run = replace(
                run,
                point=str(same["point"]),
                values=dict(same.get("values") or {}),
                out_dir=str(sweep_dir / point_dir / f"seed{run.seed}"),
            )
        out.append(run)
    return out


def _old_key(entry: Mapping[str, Any], run: RunSpec) -> str:
    """The batch key of a run carried over with its own overrides (they may set cosmetic
    options, e.g. ``threads``, otherwise than this command)."""
    if list(entry["overrides"]) == run.overrides:
        return run.key
    seed = f"seed={run.seed}"
    overrides = [o for o in entry["overrides"] if o != seed]
    try:
        return _resolve(overrides, run.plugins, list(run.values)).key
    except FedhpError:
        return run.key


def spec_of(overrides: Sequence[str], folder: Path, plugins: Sequence[str] = ()) -> RunSpec:
    """A run given by its overrides and folder alone (``fedhp reproduce``'s runs): its point is
    its folder's name."""
    from fedhp.config import config_to_dict

    spec = RunSpec(folder.name, {}, 0, "test", list(overrides), str(folder), plugins=list(plugins))
    cfg = run_config(spec)
    return RunSpec(
        spec.point,
        {},
        cfg.seed,
        cfg.eval_split,
        spec.overrides,
        spec.out_dir,
        rounds=cfg.rounds,
        key=batch_key(config_to_dict(cfg)),
        plugins=list(plugins),
    )


def make_batches(runs: Sequence[RunSpec], runs_per_batch: int | None) -> list[list[RunSpec]]:
    """Runs grouped by structure (in first-seen order), each group cut into batches of at most
    ``runs_per_batch`` runs (None: a group is one batch)."""
    groups: dict[str, list[RunSpec]] = {}
    for run in runs:
        groups.setdefault(run.key, []).append(run)
    batches = []
    for group in groups.values():
        size = runs_per_batch or len(group)
        batches += [group[i : i + size] for i in range(0, len(group), size)]
    return batches


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The sweep's manifest in ``folder`` (None: none there)."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"{path}: unreadable sweep manifest ({err}); name another --out"
        ) from None
    return data
