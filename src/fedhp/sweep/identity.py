"""What a sweep's run computes, as data to compare: its resolved configuration (defaults filled,
keys sorted) without the options that change no result (:data:`COSMETIC`). Two runs with the same
identity are one run, however their options were typed; a sweep folder holds a set of runs keyed
by it (docs/sweep.md, "Growing a sweep")."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COSMETIC",
    "digest",
    "first_difference",
    "fixed_part",
    "flat",
    "point_identity",
    "show_value",
]

COSMETIC = ("progress", "threads", "checkpoint_every", "tensorboard", "mlflow")
"""Options that change how a run is shown or kept, not what it computes: the progress bar, the
torch threads, how often it checkpoints (a resumed run is bit-exact whatever the interval) and
the TensorBoard scalars and MLflow records it also writes."""
COMPONENTS = ("dataset", "partition", "model", "algorithm")


def point_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """A resolved configuration (:func:`fedhp.config.config_to_dict`) without its seed and the
    cosmetic options; the plugins as a set (sorted)."""
    out = {k: v for k, v in config.items() if k not in (*COSMETIC, "seed")}
    if isinstance(out.get("plugins"), list):
        out["plugins"] = sorted(str(p) for p in out["plugins"])
    return out


def digest(data: Any) -> str:
    """A short stable hash of JSON-ready ``data`` (keys sorted)."""
    text = data if isinstance(data, str) else json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _drop(data: dict[str, Any], path: Sequence[str]) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)


def fixed_part(identity: Mapping[str, Any], grid_keys: Sequence[str]) -> dict[str, Any]:
    """What every run of one sweep shares: the identity without the grid's keys (a grid over a
    component's ``name``, e.g. ``algorithm.name``, drops that whole section: its options come
    with the name)."""
    out = json.loads(json.dumps(identity, default=str))
    for key in grid_keys:
        parts = key.split(".")
        if len(parts) == 2 and parts[0] in COMPONENTS and parts[1] == "name":
            out.pop(parts[0], None)
        else:
            _drop(out, parts)
    return dict(out)


def flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists are leaves)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def show_value(value: Any) -> str:
    """A value as the command line writes it (``0.1``, ``[500,200]``, ``fedavg``, ``null``)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def first_difference(
    old: Mapping[str, Any], new: Mapping[str, Any], shared_only: bool = False
) -> tuple[str, Any, Any] | None:
    """The first dotted key (sorted) whose value differs between ``old`` and ``new`` and both
    values (``"(unset)"`` where one lacks it); None if none. ``shared_only``: keys both set."""
    a, b = flat(old), flat(new)
    keys = sorted(set(a) & set(b)) if shared_only else sorted(set(a) | set(b))
    for key in keys:
        va, vb = a.get(key, "(unset)"), b.get(key, "(unset)")
        if va != vb or type(va) is not type(vb) and not _numbers(va, vb):
            return key, va, vb
    return None


def _numbers(a: Any, b: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
