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

__all__ = ["GridPoint", "batch_key", "parse_grid", "parse_seeds", "points_of", "split_values"]


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
        grid[key] = parsed
    return grid


def check_grid(grid: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """A grid given as a mapping (the Python API, the YAML ``sweep:`` section), checked."""
    out: dict[str, list[Any]] = {}
    for key, values in grid.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            values = [values]
        if len(values) == 0:
            raise ConfigError(f"grid {key}: no values; give at least one")
        if key in ("seed", "seeds"):
            raise ConfigError(f"grid {key}: give seeds with --seeds (sweep.seeds), not in the grid")
        out[str(key)] = list(values)
    return out


def parse_seeds(text: str | Sequence[int] | int | None) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` (a range, both ends in) or a list → the seeds, in order, once
    each; None → ``[0]``."""
    if text is None:
        return [0]
    if isinstance(text, int):
        return [text]
    if not isinstance(text, str):
        seeds = [int(s) for s in text]
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
