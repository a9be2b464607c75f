"""Opening a sweep's folder before it runs: every input checked, the runs planned (their size
said at once, their checking shown), and the runs the folder already holds reconciled with the
command's. A folder holds a set of runs identified by what they compute
(:mod:`fedhp.sweep.identity`): the same sweep typed otherwise resumes, more seeds or grid values
grow it (the grid and seeds become the union of both), and a real conflict is one line naming
the option and both values. Nothing is created before the inputs are valid, and a sweep that
fails before any run produced anything leaves the folder as it found it."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError, FedhpError
from fedhp.sweep.grid import points_of, union_grid
from fedhp.sweep.identity import first_difference, fixed_part, point_identity, show_value
from fedhp.sweep.plan import MANIFEST, RunSpec, hold_runs, plan_runs, read_manifest, run_digest
from fedhp.sweep.run import SweepSpec

__all__ = ["SELECT_METRICS", "open_sweep", "run_in_folder"]

SELECT_METRICS = tuple(
    f"{when}_{key}"
    for key in ("global_acc", "personal_acc", "global_balanced_acc")
    for when in ("final", "best")
)
"""What ``--select val`` can maximize: the accuracies summary.json reports."""

Say = Callable[[str], None]
LARGE = 1000
"""A sweep of this many runs or more says its size before it checks them, with a bar."""


def _say(text: str) -> None:
    print(f"fedhp sweep: {text}", file=sys.stderr, flush=True)


def check_options(spec: SweepSpec) -> None:
    """One-line errors for options that would be ignored or that name nothing."""
    if spec.metric is not None:
        if spec.select is None:
            raise ConfigError(
                f"--metric {spec.metric}: only --select val reads it (the table reports every "
                "accuracy); add --select val, or drop --metric"
            )
        if spec.metric not in SELECT_METRICS:
            raise ConfigError(
                f"--metric {spec.metric}: not a metric the runs report; choose from "
                f"{', '.join(SELECT_METRICS)}"
            )
    if spec.address is not None and spec.backend != "ray":
        raise ConfigError(
            f"--address {spec.address}: only --backend ray reads it; add --backend ray, or drop "
            "--address"
        )
    if spec.out.is_file():
        raise ConfigError(f"--out {spec.out}: is a file; name a folder for the sweep")


def _conflict(out: Path, what: str) -> ConfigError:
    return ConfigError(f"--out {out}: {what}; name another --out, or delete {out} to start over")


def _identity_of(entry: Mapping[str, Any], plugins: Sequence[str]) -> dict[str, Any] | None:
    """The identity (configuration, seed left out) of a run listed in a manifest, resolved from
    its overrides (None: they no longer resolve)."""
    from fedhp.config import config_to_dict, resolve_config

    try:
        cfg = resolve_config(None, list(entry.get("overrides") or []), plugins=plugins)
    except FedhpError:
        return None
    return point_identity(config_to_dict(cfg))


def _with_identities(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest written before runs carried their identity, with it (resolved per point)."""
    plugins = list(manifest.get("plugins") or [])
    grid_keys = list(manifest.get("grid") or {})
    from fedhp.sweep.identity import digest

    done: dict[tuple[str, str], tuple[str, str]] = {}
    for entry in manifest.get("runs") or []:
        if entry.get("identity"):
            continue
        where = (str(entry.get("split")), str(entry.get("point")))
        if where not in done:
            ident = _identity_of(entry, plugins)
            if ident is None:
                continue
            done[where] = (digest(ident), digest(fixed_part(ident, grid_keys)))
        point, fixed = done[where]
        entry.update(
            identity=run_digest(point, int(entry.get("seed", 0))),
            point_identity=point,
            fixed=fixed,
        )
    return manifest


def _held(out: Path, manifest: dict[str, Any], split: str) -> dict[str, Any]:
    """The manifest of what the folder holds: its runs of ``split`` that produced something (a
    summary or a checkpoint; the other stage's runs of a ``--select val`` sweep are kept
    listed), and the grid values and seeds of those runs."""
    runs = [e for e in manifest.get("runs") or [] if isinstance(e, Mapping)]
    held = [e for e in runs if e.get("split", "test") != split or _produced([out / e["out_dir"]])]
    ran = [e for e in held if e.get("split", "test") == split]
    grid = {
        key: [v for v in values if any(_same(e, key, v) for e in ran)]
        for key, values in (manifest.get("grid") or {}).items()
    }
    seeds = [s for s in manifest.get("seeds") or [] if any(e.get("seed") == s for e in ran)]
    return {**manifest, "runs": held if ran else [], "grid": grid, "seeds": seeds}


def _same(entry: Mapping[str, Any], key: str, value: Any) -> bool:
    from fedhp.sweep.grid import same_value

    values = entry.get("values") or {}
    return key in values and same_value(values[key], value)


def _check_same_kind(spec: SweepSpec, old: Mapping[str, Any]) -> None:
    """The folder's sweep and this one select alike and run over the same grid keys."""
    if (old.get("select") or None) != spec.select:
        shown = {None: "no --select", "val": "--select val"}
        raise _conflict(
            spec.out,
            f"holds a sweep with {shown.get(old.get('select'), old.get('select'))}; this command "
            f"has {shown.get(spec.select, spec.select)}",
        )
    old_keys, new_keys = list(old.get("grid") or {}), list(spec.grid)
    if sorted(old_keys) != sorted(new_keys):
        raise _conflict(
            spec.out,
            f"holds a sweep over {', '.join(old_keys) or 'no grid'}; this command's grid is over "
            f"{', '.join(new_keys) or 'nothing'} (grow a sweep with more values or seeds of the "
            "same keys)",
        )


def _differ(out: Path, old: Mapping[str, Any], new: Mapping[str, Any], shared: bool) -> None:
    diff = first_difference(old, new, shared_only=shared)
    if diff is None:
        return
    key, was, now = diff
    raise _conflict(
        out,
        f"holds a sweep with {key}={show_value(was)}; this command gives {key}={show_value(now)}",
    )


def _check_runs(spec: SweepSpec, old: Mapping[str, Any], runs: Sequence[RunSpec]) -> None:
    """A run new to the folder must share what its sweep's runs share (the options outside the
    grid) and must not take the folder of another run: else a one-line error naming the option
    and both values."""
    entries = [e for e in old.get("runs") or [] if isinstance(e, Mapping)]
    known = {str(e.get("identity")) for e in entries}
    fixed = {str(e.get("fixed")): e for e in entries if e.get("fixed")}
    by_dir = {str(spec.out / str(e.get("out_dir"))): e for e in entries}
    plugins = list(old.get("plugins") or [])
    grid_keys = list(spec.grid)
    checked: set[str] = set()
    for run in runs:
        if run.identity in known:
            continue
        other = by_dir.get(run.out_dir)
        if other is not None:
            was = _identity_of(other, plugins)
            now = _identity_of({"overrides": run.overrides}, run.plugins)
            if was is not None and now is not None:
                _differ(spec.out, was, now, shared=False)
            raise _conflict(spec.out, f"already holds another run in {other.get('out_dir')}")
        if run.fixed in fixed or run.fixed in checked:
            continue
        now = _identity_of({"overrides": run.overrides}, run.plugins)
        for entry in fixed.values():
            was = _identity_of(entry, plugins)
            if was is not None and now is not None:
                _differ(spec.out, fixed_part(was, grid_keys), fixed_part(now, grid_keys), True)
        checked.add(run.fixed)


def open_sweep(spec: SweepSpec, say: Say | None = _say) -> tuple[SweepSpec, list[RunSpec]]:
    """Check ``spec``, plan its runs and reconcile them with what ``spec.out`` holds; returns
    the sweep to run (its grid and seeds grown to the union with the folder's) and the runs new
    to the folder. Writes nothing but the grown manifest of a folder that holds this sweep."""
    from tqdm import tqdm

    spec.check()
    check_options(spec)
    old = read_manifest(spec.out)
    if old is None and spec.out.is_dir() and any(spec.out.iterdir()):
        raise ConfigError(f"--out {spec.out}: is not empty and holds no sweep; name a new folder")
    grid, seeds = dict(spec.grid), list(spec.seeds)
    if old is not None:
        old = _held(spec.out, old, "val" if old.get("select") == "val" else "test")
        if not old["runs"]:
            old = None  # (nothing ran there: a sweep that failed at its start)
    if old is not None:
        _check_same_kind(spec, old)
        old = _with_identities(old)
        grid = union_grid(old.get("grid") or {}, spec.grid)
        seeds = [*old.get("seeds", []), *(s for s in seeds if s not in old.get("seeds", []))]
    count = math.prod(len(v) for v in grid.values()) * len(seeds)
    large = count >= LARGE
    if say is not None and not spec.quiet and large:
        held = f"; --out holds {len(old.get('runs') or [])} runs" if old else ""
        say(
            f"{math.prod(len(v) for v in grid.values()):,} grid points x {len(seeds):,} seeds = "
            f"{count:,} runs{held}; checking their configurations"
        )
    grown = SweepSpec(**{**spec.__dict__, "grid": grid, "seeds": seeds})
    split, sub = ("val", "val") if spec.select == "val" else ("test", "runs")
    shown = spec.progress and large
    bar = tqdm(total=count, desc="checking", unit="run", delay=0.5, disable=not shown)
    try:
        runs = plan_runs(
            spec.base,
            points_of(grid),
            seeds,
            spec.out / sub,
            split,
            spec.plugins,
            spec.select == "val",
            bar.update,
            old or {},
        )
    finally:
        bar.close()
    if old is None:
        if (spec.out / MANIFEST).is_file():  # a sweep that failed at its start: replaced
            _write_manifest(spec.out, {"version": 1, **grown.identity(), "runs": []})
        return grown, runs
    _check_runs(grown, old, runs)
    known = {str(e.get("identity")) for e in old.get("runs") or []}
    new = [r for r in runs if r.identity not in known]
    if say is not None and not spec.quiet:
        say(
            f"--out {spec.out} holds {len(runs) - len(new):,} of this sweep's {len(runs):,} runs "
            f"(kept, or resumed where unfinished); {len(new):,} new"
        )
    hold_runs(spec.out, old)
    _write_manifest(spec.out, {**old, **grown.identity()})
    return grown, new


def _write_manifest(out: Path, manifest: Mapping[str, Any]) -> None:
    """The folder's manifest, its sweep now this command's (what ``run_sweep`` checks)."""
    import json

    from fedhp.reporting import write_json_atomic

    write_json_atomic(out / MANIFEST, json.loads(json.dumps(manifest)))


def _produced(folders: Sequence[Path]) -> bool:
    names = ("summary.json", "checkpoint.pt")
    return any((f / n).is_file() for f in folders for n in names)


def run_in_folder(spec: SweepSpec, say: Say | None = _say) -> tuple[SweepSpec, dict[str, Any]]:
    """:func:`open_sweep`, then run the sweep; if it fails before any new run produced a
    summary or a checkpoint, the folder is left as it was found (removed if this call made it,
    its manifest restored otherwise). Returns the sweep run and its manifest."""
    from fedhp.sweep.run import run_sweep

    existed = spec.out.exists()
    before = (spec.out / MANIFEST).read_bytes() if (spec.out / MANIFEST).is_file() else None
    grown, new = open_sweep(spec, say)
    try:
        return grown, run_sweep(grown)
    except BaseException:
        if not _produced([Path(r.out_dir) for r in new]):
            if not existed:
                shutil.rmtree(spec.out, ignore_errors=True)
            elif before is not None:
                (spec.out / MANIFEST).write_bytes(before)
        raise
