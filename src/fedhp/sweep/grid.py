"""A sweep's grid: ``--grid key=v1,v2`` options, ``--seeds``, their product as grid points, and
which runs may share a batch (same structure: everything but the seed and float values)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from fedhp.errors import ConfigError

__all__ = [
    "GridPoint",
    "batch_key",
    "check_grid",
    "parse_grid",
    "parse_seeds",
    "points_of",
    "same_value",
    "split_values",
    "union_grid",
]

MAX_SEED = 2**31 - 1


def split_values(text: str) -> list[str]:
    """``"1,2,[3,4]"`` → ``["1", "2", "[3,4]"]``: commas at bracket depth 0 separate values."""
    out, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += char
    out.append(current.strip())
    return out


def _scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text else text
    except yaml.YAMLError:
        return text


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["algorithm.lam=15,20", ...]`` → ``{"algorithm.lam": [15, 20], ...}`` (values as YAML;
    one-line errors for a missing ``=``, an empty list or a key given twice)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,... (e.g. algorithm.lam=15,20)")
        if key in grid:
            raise ConfigError(f"--grid {key}: given twice; list all its values in one --grid")
        parsed = [_scalar(v) for v in split_values(values) if v != ""]
        if not parsed:
            raise ConfigError(f"--grid {key}: no values; give at least one (e.g. {key}=1,2)")
        _refuse_repeats(f"--grid {key}", parsed)
        grid[key] = parsed
    return grid


def same_value(a: Any, b: Any) -> bool:
    """One grid value written twice: equal, numbers compared as numbers (``15`` and ``15.0``),
    else of one type (``true`` is not ``1``)."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
    return bool(a == b) and (numbers or type(a) is type(b))


def _refuse_repeats(where: str, values: Sequence[Any]) -> None:
    """A one-line error for a value given twice (two points would be one run)."""
    for i, value in enumerate(values):
        for earlier in values[:i]:
            if same_value(earlier, value):
                both = (
                    _text(earlier)
                    if _text(earlier) == _text(value)
                    else (f"{_text(earlier)} and {_text(value)}")
                )
                raise ConfigError(
                    f"{where}: {both} given twice (one value, one run); give each value once"
                )


def check_grid(grid: Any) -> dict[str, list[Any]]:
    """A grid given as a mapping (the Python API, the YAML ``sweep:`` section), checked: each
    key a list of distinct values."""
    if not isinstance(grid, Mapping):
        raise ConfigError(
            f"grid: expected a mapping of option to values, e.g. {{'algorithm.lam': [15, 20]}}; "
            f"got {type(grid).__name__}"
        )
    out: dict[str, list[Any]] = {}
    for key, values in grid.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"grid: the key {key!r} is not an option name such as algorithm.lam")
        if key in ("seed", "seeds"):
            raise ConfigError(f"grid {key}: give seeds with --seeds (sweep.seeds), not in the grid")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise ConfigError(
                f"grid {key}: {values!r} is not a list of values; write [{_text(values)}] "
                f"(e.g. {{{key!r}: [{_text(values)}]}})"
            )
        if len(values) == 0:
            raise ConfigError(f"grid {key}: no values; give at least one")
        _refuse_repeats(f"grid {key}", list(values))
        out[key] = list(values)
    return out


def union_grid(
    old: Mapping[str, Sequence[Any]], new: Mapping[str, Sequence[Any]]
) -> dict[str, list[Any]]:
    """The grid of a sweep grown by ``new``: per key, ``old``'s values, then ``new``'s values
    that are not among them (:func:`same_value`); ``old``'s keys first."""
    out = {key: list(values) for key, values in old.items()}
    for key, values in new.items():
        have = out.setdefault(key, [])
        have += [v for v in values if not any(same_value(v, h) for h in have)]
    return out


def parse_seeds(text: str | Sequence[int] | int | None) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` (a range, both ends in) or a list → the seeds, in order, once
    each; None → ``[0]``."""
    if text is None:
        return [0]
    if isinstance(text, bool) or not isinstance(text, int | str | Sequence):
        raise ConfigError(
            f"seeds: expected a list of integers such as [0, 1, 2] or a text such as '0-4'; "
            f"got {type(text).__name__}"
        )
    if isinstance(text, int):
        seeds = [text]
    elif not isinstance(text, str):
        bad = [s for s in text if isinstance(s, bool) or not isinstance(s, int)]
        if bad:
            raise ConfigError(f"seeds: {bad[0]!r} is not an integer; give seeds such as [0, 1, 2]")
        seeds = list(text)
    else:
        seeds = []
        for part in split_values(text):
            lo, dash, hi = part.partition("-")
            try:
                seeds += list(range(int(lo), int(hi) + 1)) if dash and lo else [int(part)]
            except ValueError:
                raise ConfigError(
                    f"--seeds {text!r}: expected integers such as 0,1,2 or a range 0-4"
                ) from None
    if not seeds:
        raise ConfigError("--seeds: no seeds; give at least one (e.g. --seeds 0,1,2)")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: a seed is repeated; give each seed once")
    out = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if out:
        raise ConfigError(f"--seeds: {out[0]} is out of range; seeds are 0 to {MAX_SEED}")
    return seeds


def _text(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()
    return text.replace(" ", "")


@dataclass(frozen=True)
class GridPoint:
    """One combination of grid values: ``values`` by dotted key."""

    values: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """``algorithm.lam=15,algorithm.lr=0.1`` (``base`` for an empty grid)."""
        if not self.values:
            return "base"
        return ",".join(f"{k}={_text(v)}" for k, v in self.values.items())

    @property
    def folder(self) -> str:
        """The point's folder name: its id with path separators replaced."""
        return self.id.replace("/", "_").replace(" ", "")

    def overrides(self) -> list[str]:
        """The point as ``key=value`` overrides."""
        return [f"{k}={_text(v)}" for k, v in self.values.items()]


def points_of(grid: Mapping[str, Sequence[Any]]) -> list[GridPoint]:
    """Every combination of the grid's values (the first key varies slowest)."""
    keys = list(grid)
    return [
        GridPoint(dict(zip(keys, combo, strict=True)))
        for combo in itertools.product(*grid.values())
    ]


def _structure(value: Any) -> Any:
    """The config with float leaves blanked (they may differ inside a batch)."""
    if isinstance(value, Mapping):
        return {k: _structure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_structure(v) for v in value]
    if isinstance(value, float):
        return "<float>"
    return value


def batch_key(config: Mapping[str, Any]) -> str:
    """What runs of one batch must share: the resolved config but its seed and float values
    (lr, λ, μ, β, ...). Integers, strings and lists (rounds, K, R, batch size, model width,
    algorithm, dataset) are structure: a grid over them splits the sweep into batches."""
    shape = {k: v for k, v in config.items() if k not in ("seed", "progress")}
    return json.dumps(_structure(shape), sort_keys=True, default=str)
