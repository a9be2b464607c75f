"""Every option used or refused (issue 42): which options a resolved run does not read, so that a
key the user set and nothing reads is a one-line error, and ``config.yaml`` holds only the
options the run reads.

Each component says which of its own options it leaves unread for a run through an ``unread``
method (``unread(run) -> {field: message}``; the dataset, partition, model and algorithm options,
:class:`~fedhp.robust.RobustOptions`, :class:`~fedhp.config.AttackConfig`); the sections whose
reading follows from the algorithm's class flags (``hierarchical``, ``federated``) or from a
switch of their own (``privacy.enabled``, ``backend``, ``state_storage``) are declared here.
tests/test_unread.py checks the declarations against the options a run really reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fedhp.config import COMPONENT_SECTIONS, RunConfig, cuda_graphs_unread
from fedhp.errors import ConfigError

Unread = dict[str, str]
"""Dotted option key → why nothing reads it and what to set instead (one line)."""


def component_registry(section: str) -> Any:
    """The registry of a component section (``dataset``, ``partition``, ``model``,
    ``algorithm``): the components, above :mod:`fedhp.config`, are found here by the name the
    configuration gives."""
    from fedhp.algorithms import ALGORITHMS
    from fedhp.data import DATASETS, PARTITIONERS
    from fedhp.models import MODELS

    registries = {
        "dataset": DATASETS,
        "partition": PARTITIONERS,
        "model": MODELS,
        "algorithm": ALGORITHMS,
    }
    return registries[section]


def _component(cfg: RunConfig, section: str) -> Any | None:
    """The section's component options, or None where they do not validate (the run's own
    validation names that problem)."""
    try:
        return component_registry(section).build(getattr(cfg, section), section)
    except ConfigError:
        return None


def component_unread(cfg: RunConfig) -> Unread:
    """The options of the dataset, partition, model and algorithm that they declare unread."""
    out: Unread = {}
    for section in COMPONENT_SECTIONS:
        options = _component(cfg, section)
        declare = getattr(options, "unread", None)
        if callable(declare):
            out.update({f"{section}.{key}": why for key, why in declare(cfg).items()})
    return out


def _all_of(prefix: str, model: Any, why: str, keep: tuple[str, ...] = ()) -> Unread:
    """Every option of the section ``model`` but those in ``keep``, each with ``why``."""
    return {f"{prefix}.{k}": why for k in type(model).model_fields if k not in keep}


def section_unread(cfg: RunConfig, on_flower: bool = False) -> Unread:
    """The top-level options this run leaves unread: sampling of the other kind of method,
    attack options no attack reads, robust options the level's rule does not use, privacy
    options with privacy off, Flower options in-process (unless ``on_flower``: a Flower
    deployment, whatever ``backend`` says), ``state_dir`` in memory."""
    methods = component_registry("algorithm")
    out: Unread = {}
    name = cfg.algorithm.get("name")
    method = methods.get(name) if name in methods else None
    if method is not None and not method.federated:
        why = f"{name} trains on the pooled data and samples no one"
        out["federation.client_fraction"] = f"{why}; drop it"
        out["federation.edges_per_round"] = f"{why}; drop it"
    elif method is not None and method.hierarchical:
        out["federation.client_fraction"] = (
            f"{name} is hierarchical and samples edges, not clients; set "
            "federation.edges_per_round instead"
        )
    elif method is not None:
        out["federation.edges_per_round"] = (
            f"{name} is flat and samples clients, not edges; set federation.client_fraction instead"
        )
    if cfg.faults.straggler == 0:
        out["faults.straggler_work"] = "there are no stragglers; set faults.straggler above 0"
    elif method is not None and not method.keeps_partial_work:
        keep = [n for n in methods.names() if methods.get(n).keeps_partial_work]
        out["faults.straggler_work"] = (
            f"{name} drops its stragglers' updates either way; only {', '.join(keep) or 'none'} "
            "keeps partial work" + (f" (algorithm.name={keep[0]}), or drop it" if keep else "")
        )
    out.update({f"faults.attack.{k}": w for k, w in cfg.faults.attack.unread().items()})
    for level in ("cloud", "edge"):
        rule = getattr(cfg.robust, level)
        out.update({f"robust.{level}.{k}": w for k, w in rule.unread(level).items()})
    if not cfg.privacy.enabled:
        why = "privacy is off; set privacy.enabled=true to use it, or drop it"
        out.update(_all_of("privacy", cfg.privacy, why, keep=("enabled",)))
    if not cfg.mlflow.enabled:
        why = "MLflow logging is off; set mlflow.enabled=true to use it, or drop it"
        out.update(_all_of("mlflow", cfg.mlflow, why, keep=("enabled",)))
    if cfg.backend == "inprocess" and not on_flower:
        why = "only the Flower backends read it; set backend=flower-sim to use it, or drop it"
        out.update(_all_of("flower", cfg.flower, why))
    if cfg.state_storage == "memory":
        out["state_dir"] = "the state is in memory; set state_storage=disk to use it, or drop it"
    if cfg.public.per_class == 0:
        out["public.source"] = "there is no D_pub (public.per_class=0); set public.per_class"
    method_options = _component(cfg, "algorithm")
    steps = None if method_options is None else bool(method_options.graph_steps())
    graphs = cuda_graphs_unread(cfg, steps)
    if graphs is not None:
        out["engine.cuda_graphs"] = graphs
    return out


def unread_options(cfg: RunConfig, on_flower: bool = False) -> Unread:
    """Every option of the resolved run that nothing reads, with why and what to set instead
    (``on_flower``: the run goes through Flower whatever ``backend`` says, as ``fedhp flower
    deploy`` runs it: the ``flower`` options are read)."""
    return {**section_unread(cfg, on_flower), **component_unread(cfg)}


def leaf_keys(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted keys a mapping of options sets (a mapping value: each of its keys)."""
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            yield from leaf_keys(value, dotted)
        else:
            yield dotted


def refuse_unread(cfg: RunConfig, user: Mapping[str, Any], on_flower: bool = False) -> None:
    """A one-line :class:`ConfigError` for the first key the user set (``user``: the YAML and
    overrides before the defaults) that this run does not read."""
    unread = unread_options(cfg, on_flower)
    for key in leaf_keys(user):
        if key in unread:
            raise ConfigError(f"{key} is not read by this run: {unread[key]}")


def read_overrides(shared: Sequence[str], own: Sequence[str]) -> list[str]:
    """``shared`` (``key=value`` overrides a script gives the runs of several methods, e.g. a
    common ``algorithm.lr``) less those the run of ``[*shared, *own]`` does not read, which
    :func:`~fedhp.config.resolve_config` would refuse (Per-FedAvg steps by ``alpha`` and
    ``beta``, not ``lr``). ``own``: the run's other overrides, kept as they are. All of
    ``shared`` where the run does not resolve (the run itself then names the problem)."""
    from fedhp.config import resolve_config

    try:
        unread = unread_options(resolve_config(None, [*shared, *own], refuse_unread=False))
    except ConfigError:
        return list(shared)
    return [o for o in shared if o.partition("=")[0].strip() not in unread]


def drop_unread(data: dict[str, Any], unread: Mapping[str, str]) -> dict[str, Any]:
    """``data`` (a configuration as plain data) without the ``unread`` keys; a section left
    empty goes too."""
    out = dict(data)
    for key in unread:
        parts = key.split(".")
        node: Any = out
        trail: list[tuple[dict[str, Any], str]] = []
        for part in parts[:-1]:
            sub = node.get(part) if isinstance(node, dict) else None
            if not isinstance(sub, dict):
                node = None
                break
            node[part] = sub = dict(sub)  # copy on the way down
            trail.append((node, part))
            node = sub
        if isinstance(node, dict):
            node.pop(parts[-1], None)
            for parent, part in reversed(trail):
                if parent[part]:
                    break
                del parent[part]
    return out
