"""From a validated :class:`~fedhp.config.RunConfig` to everything a run needs: the layer between
the configuration and the engine (config → build → engine), the one place that looks the
components up in their registries."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from fedhp.algorithms import ALGORITHMS, Algorithm, AlgorithmOptions
from fedhp.comm import CommLedger
from fedhp.config import RunConfig, cuda_graphs_unread
from fedhp.data import DATASETS, PARTITIONERS
from fedhp.data.public import PublicData, carve_public
from fedhp.data.subsample import subsample
from fedhp.data.types import ClientData, DatasetArrays
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.attacks import UPDATE_ATTACKS, Attack, flip_labels, malicious_clients
from fedhp.engine.context import RunContext
from fedhp.engine.experiment import ENGINE_SEED_OFFSET, Experiment
from fedhp.engine.faults import FaultModel
from fedhp.engine.federation import Federation
from fedhp.engine.graphs import StepGraphs
from fedhp.engine.participation import Participation
from fedhp.engine.sampler import BatchSampler
from fedhp.engine.uplink import client_level, safeguards
from fedhp.errors import ConfigError
from fedhp.models import MODELS
from fedhp.models.policy import build_policy
from fedhp.topology import Topology


def check_components(cfg: RunConfig) -> None:
    """Validate every component section before any data is loaded (one-line errors)."""
    DATASETS.build(cfg.dataset, "dataset")
    PARTITIONERS.build(cfg.partition, "partition")
    MODELS.build(cfg.model, "model")
    check_sequences(str(cfg.dataset.get("name")), str(cfg.model.get("name")))
    options = ALGORITHMS.build(cfg.algorithm, "algorithm")
    check_adversarial(cfg, options, topology_of(cfg))


def _declares(registry: Any, name: str, attr: str, default: bool) -> bool:
    """A component's class-level flag ``attr`` (``default`` where its class has none)."""
    try:
        cls = registry.get(name)
    except Exception:  # an unknown name: its own validation names it
        return False
    return bool(getattr(cls, attr, default))


def sequence_models() -> list[str]:
    """The registered models that take sequences of character indices (options declaring
    ``takes_sequences = True``; ``lstm``)."""
    return [n for n in MODELS.names() if _declares(MODELS, n, "takes_sequences", n == "lstm")]


def check_sequences(dataset: str, model: str) -> None:
    """A dataset of character-index sequences (``gives_sequences``; ``shakespeare``) needs a
    model that takes them: one-line error naming those models, before any data is loaded."""
    if not _declares(DATASETS, dataset, "gives_sequences", dataset == "shakespeare"):
        return
    takes = sequence_models()
    if model not in takes:
        raise ConfigError(
            f"model.name: {model!r} does not take the sequences of character indices that "
            f"dataset.name={dataset} gives; use model.name={takes[0] if takes else 'lstm'} "
            f"(the models that do: {', '.join(takes) or 'none registered'})"
        )


def check_adversarial(cfg: RunConfig, options: AlgorithmOptions, topology: Topology) -> None:
    """One-line errors for attack, robust and privacy options the run cannot honour (issue 20):
    a level the method does not aggregate by a mean, too few rows for Krum, DP without its
    preconditions."""
    name = cfg.algorithm.get("name")
    fed, attack, privacy = cfg.federation, cfg.faults.attack, cfg.privacy
    momentum = client_momentum_of(options)
    uses = (
        attack.enabled
        or privacy.enabled
        or momentum > 0
        or any(r.name != "mean" for r in (cfg.robust.cloud, cfg.robust.edge))
    )
    if uses and cfg.backend != "inprocess":
        raise ConfigError(
            "backend: attacks, robust rules, client momentum and privacy need backend=inprocess"
        )
    acts = safeguards_of(options)
    if momentum > 0 and options.uploads.get(client_level(options.hierarchical)) != "model":
        raise ConfigError(
            f"algorithm.client_momentum: {name} does not upload the models its clients trained, "
            "so there is no update to keep a momentum of; use 0"
        )
    if attack.enabled and attack.name in UPDATE_ATTACKS and not acts["attack"]:
        ready = ", ".join(
            n for n in ALGORITHMS.names() if safeguards_of(ALGORITHMS.get(n))["attack"]
        )
        raise ConfigError(
            f"faults.attack.name: {name} does not pass its uploads through the attack "
            f"({ready} do); use label_flip"
        )
    sizes = torch.bincount(topology.edge_of_client, minlength=topology.num_edges)
    for level in ("cloud", "edge"):
        rule = getattr(cfg.robust, level)
        if rule.name == "mean":
            continue
        rows = {"edge": int(sizes.min()), "cloud": cloud_rows(cfg, options, topology)}
        if level not in acts["robust"]:
            raise ConfigError(
                f"robust.{level}.name: {name} has no {level} mean a robust rule can replace "
                "(use mean)"
            )
        if rule.centred and level not in options.keeps_centres:
            keeps = ", ".join(
                n for n in ALGORITHMS.names() if level in ALGORITHMS.get(n).keeps_centres
            )
            raise ConfigError(
                f"robust.{level}.name: {rule.name} measures from the previous aggregate, which "
                f"{name} does not keep at the {level} ({keeps or 'none'} do); use clip"
            )
        if rule.bucket > rows[level]:
            raise ConfigError(
                f"robust.{level}.bucket: buckets of {rule.bucket} rows but the {level} receives "
                f"{rows[level]}; use bucket <= {rows[level]}"
            )
        rule.check(-(-rows[level] // rule.bucket), f"robust.{level}")  # rows after bucketing
    if cfg.state_storage == "disk" and (cfg.backend != "inprocess" or cfg.device != "cpu"):
        raise ConfigError("state_storage: disk needs backend=inprocess and device=cpu")
    if not privacy.enabled:
        return
    where = privacy.where
    if where not in acts["privacy"]:
        raise ConfigError(
            f"privacy.where: {name} cannot add DP noise at the {where} "
            f"(it can at: {', '.join(sorted(acts['privacy'])) or 'nowhere'})"
        )
    if fed.weighting != "uniform":
        raise ConfigError(
            "federation.weighting: client-level DP bounds each client's share; use uniform"
        )
    if getattr(cfg.robust, where).name != "mean":
        raise ConfigError(
            f"robust.{where}.name: DP noise at the {where} needs its mean there (use mean)"
        )
    if privacy.sampling == "poisson" and (options.hierarchical or fed.client_fraction >= 1):
        raise ConfigError(
            "privacy.sampling: poisson samples clients with federation.client_fraction < 1 in "
            "flat methods; use fixed"
        )


def cloud_rows(cfg: RunConfig, options: AlgorithmOptions, topology: Topology) -> int:
    """Rows the cloud aggregates each round: the sampled edges (hierarchical methods) or
    clients (flat ones)."""
    fed = cfg.federation
    if options.hierarchical:
        return fed.edges_per_round or topology.num_edges
    return max(1, round(fed.client_fraction * fed.num_clients))


def sampling_of(cfg: RunConfig, options: AlgorithmOptions) -> dict[str, Any]:
    """The sampling options the method reads (issue 42): ``client_fraction`` for flat methods,
    ``edges_per_round`` for hierarchical ones, neither for a non-federated reference."""
    fed = cfg.federation
    if not options.federated:
        return {}
    if options.hierarchical:
        return {"edges_per_round": fed.edges_per_round}
    return {"client_fraction": fed.client_fraction}


def topology_of(cfg: RunConfig) -> Topology:
    """The run's client–edge topology."""
    fed = cfg.federation
    return Topology.build(fed.num_clients, fed.num_edges, fed.edge_sizes)


def safeguards_of(options: AlgorithmOptions | type[AlgorithmOptions]) -> dict[str, frozenset[str]]:
    """Where the run's attack, robust rules and DP can act for a method: derived from what it
    uploads at each level (``uploads``, :func:`fedhp.engine.uplink.safeguards`)."""
    cls = options if isinstance(options, type) else type(options)
    try:
        return safeguards(cls.uploads, cls.hierarchical)
    except ValueError as err:
        raise ConfigError(f"algorithm: {cls.__name__}.{err}") from None


def client_momentum_of(options: AlgorithmOptions) -> float:
    """β of the clients' momentum (``algorithm.client_momentum``; 0 where a method has none)."""
    return float(getattr(options, "client_momentum", 0.0))


def level_rule(cfg: RunConfig, level: str, device: torch.device) -> LevelRule | None:
    """The ``level``'s aggregation (None: the weighted mean, as without issue 20's options)."""
    robust = getattr(cfg.robust, level)
    privacy = cfg.privacy if cfg.privacy.enabled and cfg.privacy.where == level else None
    rule = LevelRule(robust, f"robust.{level}", privacy, cfg.seed, device)
    return None if rule.folds else rule


def resolve_device(name: str) -> torch.device:
    """The torch device named in the config, or a one-line error if it is unavailable."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: unknown device {name!r}; use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: CUDA is not available on this machine; use device=cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ConfigError(
            f"device: {name} does not exist (this machine has {count} CUDA devices: "
            f"cuda:0..cuda:{count - 1}); use one of them or device=cpu"
        )
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device: {name!r} is not supported; use cpu or cuda[:N]")
    return device


def partition_data(cfg: RunConfig) -> tuple[DatasetArrays, list[ClientData], PublicData | None]:
    """Load the dataset, keep the ``subsample`` asked for, carve D_pub out of it (``public``),
    partition the rest among the clients: the one code path of the in-process engine and the
    Flower nodes."""
    data = DATASETS.build(cfg.dataset, "dataset").load()
    data = subsample(data, cfg.subsample.train, cfg.subsample.test, cfg.seed)
    per_class = cfg.public.per_class
    source = cfg.public.source if per_class > 0 else "holdout"  # (no D_pub: source unread)
    data, public = carve_public(data, per_class, source, cfg.seed)
    partitioner = PARTITIONERS.build(cfg.partition, "partition")
    return data, list(partitioner.split(data, cfg.federation.num_clients, cfg.seed)), public


def build_experiment(cfg: RunConfig) -> Experiment[Algorithm, AlgorithmOptions]:
    """Load and partition the data, build topology, model, ledger and algorithm."""
    check_components(cfg)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    data, clients, public = partition_data(cfg)
    fed = Federation.from_clients(clients, data.num_classes, device)
    if data.true_params is not None or data.true_support is not None:
        fed = replace(fed, true_params=data.true_params, true_support=data.true_support)
    if public is not None:  # D_pub on the run's device, beside the clients' data
        fed = replace(fed, public=replace(public, x=public.x.to(device), y=public.y.to(device)))
    topo_cfg = cfg.federation
    topology = topology_of(cfg)
    malicious = malicious_clients(cfg.faults.attack, cfg.seed, topology.edge_of_client)
    if cfg.faults.attack.name == "label_flip" and bool(malicious.any()):
        fed = replace(fed, train=flip_labels(fed.train, malicious, fed.num_classes))
    model = MODELS.build(cfg.model, "model").build(fed.feature_shape, fed.num_classes)
    options = ALGORITHMS.build(cfg.algorithm, "algorithm")
    model.policy = build_policy(
        device,
        model.reference,
        fed.feature_shape,
        batch_size=int(getattr(options, "batch_size", 1) or 1),
        precision=cfg.precision,
        clients_per_chunk=cfg.engine.clients_per_chunk,
        memory_fraction=cfg.engine.memory_fraction,
        channels_last=cfg.engine.channels_last,
        cuda_graphs=cuda_graphs_unread(cfg, options.graph_steps()) is None
        and cfg.engine.cuda_graphs,
    )
    generator = torch.Generator(device="cpu").manual_seed(cfg.seed + ENGINE_SEED_OFFSET)
    # The global generators too (what dropout draws from; checkpoints save and restore them):
    # torch seeds them differently in every process, which made dropout runs irreproducible.
    torch.manual_seed(cfg.seed + ENGINE_SEED_OFFSET + 2)
    sampler_gen = generator if device.type == "cpu" else torch.Generator(device=device)
    if device.type != "cpu":
        sampler_gen.manual_seed(cfg.seed + ENGINE_SEED_OFFSET + 1)
    on_device = Topology(topology.edge_of_client.to(device), topology.num_edges)
    ctx = RunContext(
        model=model,
        fed=fed,
        topology=on_device,
        ledger=CommLedger(),
        generator=generator,
        sampler=BatchSampler(
            fed.train.counts, sampler_gen, topo_cfg.sampling == "with_replacement"
        ),
        weighting=topo_cfg.weighting,
        zero_threshold=cfg.comm.zero_threshold,
        participation=Participation(
            on_device,
            generator,
            fed.num_clients,
            fed.train.x.device,
            **sampling_of(cfg, options),
            sampling="poisson"
            if cfg.privacy.enabled and cfg.privacy.sampling == "poisson"
            else "fixed",
            faults=FaultModel(cfg.faults, cfg.seed, fed.num_clients, topology.num_edges),
        ),
        attack=Attack(cfg.faults.attack, malicious, cfg.seed) if malicious.any() else None,
        cloud_rule=level_rule(cfg, "cloud", device),
        edge_rule=level_rule(cfg, "edge", device),
        client_momentum=client_momentum_of(options),
        client_level=client_level(options.hierarchical),
        graphs=StepGraphs(enabled=model.policy.cuda_graphs, stacked=model.policy.cuda_graphs),
    )
    return Experiment(cfg, model, options, options.build(ctx), ctx)
