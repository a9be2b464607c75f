"""From a validated :class:`~fedhp.config.RunConfig` to everything a run needs."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fedhp.algorithms import ALGORITHMS, Algorithm, AlgorithmOptions
from fedhp.comm import CommLedger
from fedhp.config import RunConfig
from fedhp.data import DATASETS, PARTITIONERS
from fedhp.data.public import PublicData, carve_public
from fedhp.data.subsample import subsample
from fedhp.data.types import ClientData, DatasetArrays
from fedhp.engine.context import RunContext
from fedhp.engine.faults import FaultModel
from fedhp.engine.federation import Federation
from fedhp.engine.sampler import BatchSampler
from fedhp.errors import ConfigError
from fedhp.models import MODELS, BatchedModel
from fedhp.topology import Topology

# Offsets that give each random stream its own seed derived from the run's one seed.
MODEL_SEED_OFFSET = 0
ENGINE_SEED_OFFSET = 1_000_003


@dataclass
class Experiment:
    """A run ready to start: data resident, model and algorithm built."""

    cfg: RunConfig
    model: BatchedModel
    options: AlgorithmOptions
    algorithm: Algorithm
    ctx: RunContext


def check_components(cfg: RunConfig) -> None:
    """Validate every component section before any data is loaded (one-line errors)."""
    DATASETS.build(cfg.dataset, "dataset")
    PARTITIONERS.build(cfg.partition, "partition")
    MODELS.build(cfg.model, "model")
    ALGORITHMS.build(cfg.algorithm, "algorithm")
    fed = cfg.federation
    Topology.build(fed.num_clients, fed.num_edges, fed.edge_sizes)


def resolve_device(name: str) -> torch.device:
    """The torch device named in the config, or a one-line error if it is unavailable."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: unknown device {name!r}; use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: CUDA is not available on this machine; use device=cpu")
    return device


def partition_data(cfg: RunConfig) -> tuple[DatasetArrays, list[ClientData], PublicData | None]:
    """Load the dataset, keep the ``subsample`` asked for, carve D_pub out of it (``public``),
    partition the rest among the clients: the one code path of the in-process engine and the
    Flower nodes."""
    data = DATASETS.build(cfg.dataset, "dataset").load()
    data = subsample(data, cfg.subsample.train, cfg.subsample.test, cfg.seed)
    data, public = carve_public(data, cfg.public.per_class, cfg.public.source, cfg.seed)
    partitioner = PARTITIONERS.build(cfg.partition, "partition")
    return data, list(partitioner.split(data, cfg.federation.num_clients, cfg.seed)), public


def build_experiment(cfg: RunConfig) -> Experiment:
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
    topology = Topology.build(topo_cfg.num_clients, topo_cfg.num_edges, topo_cfg.edge_sizes)
    model = MODELS.build(cfg.model, "model").build(fed.feature_shape, fed.num_classes)
    options = ALGORITHMS.build(cfg.algorithm, "algorithm")
    generator = torch.Generator(device="cpu").manual_seed(cfg.seed + ENGINE_SEED_OFFSET)
    # The global generators too (what dropout draws from; checkpoints save and restore them):
    # torch seeds them differently in every process, which made dropout runs irreproducible.
    torch.manual_seed(cfg.seed + ENGINE_SEED_OFFSET + 2)
    sampler_gen = generator if device.type == "cpu" else torch.Generator(device=device)
    if device.type != "cpu":
        sampler_gen.manual_seed(cfg.seed + ENGINE_SEED_OFFSET + 1)
    ctx = RunContext(
        model=model,
        fed=fed,
        topology=Topology(topology.edge_of_client.to(device), topology.num_edges),
        ledger=CommLedger(),
        generator=generator,
        sampler=BatchSampler(
            fed.train.counts, sampler_gen, topo_cfg.sampling == "with_replacement"
        ),
        weighting=topo_cfg.weighting,
        client_fraction=topo_cfg.client_fraction,
        edges_per_round=topo_cfg.edges_per_round,
        zero_threshold=cfg.comm.zero_threshold,
        faults=FaultModel(cfg.faults, cfg.seed, fed.num_clients, topology.num_edges),
    )
    return Experiment(cfg, model, options, options.build(ctx), ctx)
