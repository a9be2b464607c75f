"""A sweep's runs and batches: each (grid point, seed) is a :class:`RunSpec` (its overrides and
its run folder, picklable for Ray), grouped into batches of runs that share their structure
(:func:`~fedhp.sweep.grid.batch_key`), at most ``runs_per_batch`` each."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError, FedhpError
from fedhp.sweep.grid import GridPoint, batch_key

__all__ = [
    "MANIFEST",
    "RunSpec",
    "make_batches",
    "plan_runs",
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


def plan_runs(
    base: Sequence[str],
    points: Sequence[GridPoint],
    seeds: Sequence[int],
    folder: Path,
    split: str = "test",
    plugins: Sequence[str] = (),
    force_split: bool = True,
) -> list[RunSpec]:
    """Every (point, seed) run in ``folder/<point>/seed<k>``, each config resolved and checked
    now (a value the option refuses is a one-line error naming the grid key). With
    ``force_split`` every run evaluates on ``split`` (``eval_split=<split>`` last, the stages of
    ``--select val``); else on the split its config names (``eval_split`` of the base)."""
    from fedhp.config import config_to_dict

    runs = []
    for point in points:
        for seed in seeds:
            forced = [f"eval_split={split}"] if force_split else []
            overrides = [*base, *point.overrides(), f"seed={seed}", *forced]
            spec = RunSpec(
                point.id,
                dict(point.values),
                seed,
                split,
                overrides,
                str(folder / point.folder / f"seed{seed}"),
                plugins=list(plugins),
            )
            try:
                cfg = run_config(spec)
                config = config_to_dict(cfg)
            except FedhpError as err:
                where = f"grid point {point.id}" if point.values else "the sweep's base config"
                raise ConfigError(f"{where}: {err}") from None
            if split == "val":
                _check_val_split(config, point)
            runs.append(
                RunSpec(
                    spec.point,
                    spec.values,
                    seed,
                    split,
                    overrides,
                    spec.out_dir,
                    rounds=cfg.rounds,
                    key=batch_key(config),
                    plugins=list(plugins),
                    eval_split=cfg.eval_split,
                )
            )
    return runs


def _check_val_split(config: dict[str, Any], point: GridPoint) -> None:
    """``--select val`` needs validation data: a one-line error now (not once the first run
    loads its data, with the sweep's folder written) where the partition's options give none."""
    partition = config.get("partition") or {}
    sizes = [partition[k] for k in ("val_per_class", "val_fraction") if k in partition]
    if sizes and not any(sizes):
        where = f" (grid point {point.id})" if point.values else ""
        raise ConfigError(
            f"--select val: the runs{where} have no validation data; set "
            "partition.val_per_class (or partition.val_fraction) above 0"
        )


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
