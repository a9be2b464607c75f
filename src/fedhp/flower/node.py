"""A Flower node's side of fedhp: its clients' data and state, and the round's local work.

A node loads the dataset and partitions it exactly as the in-process engine does (same seed),
keeps only its own clients' tensors, and runs the algorithm's :meth:`~fedhp.algorithms.base.
Algorithm.train` — the same code the in-process engine runs — on its part of each task. Its
per-client / per-edge state (e.g. sFedHP's ``theta`` and edge models) is kept in Flower's
``context.state`` between messages (a ClientApp process may be re-created); the loaded data and
model are cached per process, and the node's part of the data on disk
(:mod:`fedhp.flower.node_cache`) for the next process.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch
import yaml

from fedhp.algorithms import ALGORITHMS, Algorithm, State, Task
from fedhp.build import partition_data
from fedhp.comm import CommLedger, count_nonzero
from fedhp.config import RunConfig, validate_config
from fedhp.data.public import PublicData
from fedhp.data.types import ClientData
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import evaluate_personal
from fedhp.engine.experiment import ENGINE_SEED_OFFSET, MODEL_SEED_OFFSET
from fedhp.engine.federation import Federation
from fedhp.engine.sampler import BatchSampler
from fedhp.flower.messages import Content, MalformedReply
from fedhp.flower.node_cache import NodeData, cached_node_data
from fedhp.flower.shards import Shard, make_shards, node_count
from fedhp.models import MODELS
from fedhp.topology import Topology


@dataclass
class NodeRuntime:
    """Everything a node needs besides its state: config, shard, data, model, algorithm."""

    cfg: RunConfig
    shard: Shard
    algorithm: Algorithm
    ctx: RunContext

    def initial_state(self) -> State:
        """The node-held part of the algorithm's initial state (its rows only)."""
        init = self.ctx.model.init_params(self.cfg.seed + MODEL_SEED_OFFSET)
        state = self.algorithm.init_state(init)
        return {k: v for k, v in state.items() if k in self.algorithm.held_keys}

    def local_task(self, content: Content) -> Task:
        """The task in this node's local indices (its part of the round)."""
        a = content.arrays
        clients = _local(a["clients"], self.shard.clients, "clients")
        edges = _local(a["edges"], self.shard.edges, "edges") if "edges" in a else None
        agg = _local(a["agg"], self.shard.edges, "agg") if "agg" in a else None
        stragglers = None
        if "stragglers" in a:
            stragglers = _local(a["stragglers"], self.shard.clients, "stragglers")
        return Task(
            clients,
            edges,
            agg,
            broadcast={k[2:]: v for k, v in a.items() if k.startswith("b.")},
            per_client={k[2:]: v for k, v in a.items() if k.startswith("c.")},
            scalars={k[2:]: float(v) for k, v in content.meta.items() if k.startswith("s.")},
            stragglers=stragglers,
        )

    def train(self, state: State, content: Content) -> dict[str, torch.Tensor | str]:
        """Run the round's local work; returns the reply's arrays (and ``ledger`` JSON)."""
        ctx, algo = self.ctx, self.algorithm
        task = self.local_task(content)
        ctx.sampler.generator.set_state(content.arrays["gen"])
        ctx.ledger = CommLedger()
        update = algo.train(state, task)
        up = task.up_edges
        out: dict[str, torch.Tensor | str] = {
            "clients": ctx.global_clients(task.clients),
            "edges": ctx.global_edges(up) if up is not None else torch.zeros(0, dtype=torch.long),
            "gen": ctx.sampler.generator.get_state(),
        }
        out.update({f"c.{k}": v for k, v in update.per_client.items()})
        out.update({f"e.{k}": v for k, v in update.per_edge.items()})
        if update.losses is not None:
            out["losses"] = update.losses
        for key in algo.held_keys:
            out[f"nnz.{key}"] = algo.row_nonzeros(state, key)
        out["ledger"] = json.dumps(ctx.ledger.state_dict())
        return out

    def evaluate(
        self, state: State, broadcast: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Each hosted client's personalized model on its own test and training data;
        ``broadcast``: what the cloud sent along (the global model, where they need it)."""
        cfg, ctx = self.cfg, self.ctx
        full = {**state, **(broadcast or {})}
        models = self.algorithm.personal_models(full)
        if models is None:
            raise MalformedReply("this algorithm has no personalized models to evaluate")
        bufs = self.algorithm.personal_buffers(full)
        split = ctx.fed.val if cfg.eval_split == "val" else ctx.fed.test
        test = evaluate_personal(ctx.model, models, split, buffers=bufs)
        train = evaluate_personal(ctx.model, models, ctx.fed.train, buffers=bufs)
        return {
            "clients": self.shard.clients,
            "test.correct": test.correct,
            "test.loss": test.loss_sum,
            "test.count": test.count,
            "train.correct": train.correct,
            "train.loss": train.loss_sum,
            "train.count": train.count,
            "nnz": count_nonzero(models, cfg.comm.zero_threshold).to(torch.int64),
        }


def _local(ids: torch.Tensor, hosted: torch.Tensor, what: str) -> torch.Tensor:
    """Local positions of global ``ids`` among the sorted ``hosted`` ones."""
    ids = ids.to(torch.long)
    pos = torch.searchsorted(hosted, ids)
    if len(ids) and (int(pos.max()) >= len(hosted) or not torch.equal(hosted[pos], ids)):
        raise ValueError(f"message lists {what} this node does not host")
    return pos


_PARTITIONS: dict[str, tuple[list[ClientData], int, PublicData | None]] = {}


def _partition(cfg: RunConfig) -> tuple[list[ClientData], int, PublicData | None]:
    """Every client's data as the in-process engine partitions it (cached per process for the
    nodes it hosts; a process hosts one run at a time)."""
    key = json.dumps(
        [cfg.dataset, cfg.partition, cfg.federation.num_clients, cfg.seed, cfg.public.model_dump()]
    )
    if key not in _PARTITIONS:
        _PARTITIONS.clear()
        data, clients, public = partition_data(cfg)
        _PARTITIONS[key] = (clients, data.num_classes, public)
    return _PARTITIONS[key]


def _node_data(cfg: RunConfig, shard: Shard) -> NodeData:
    clients, num_classes, _ = _partition(cfg)
    counts = [c.num_train for c in clients]
    hosted = [clients[i] for i in shard.clients.tolist()]
    return hosted, num_classes, max(counts), min(counts)


def build_node(cfg: RunConfig, shard_index: int) -> NodeRuntime:
    """Load and partition the data as the in-process engine does; keep this node's clients."""
    options = ALGORITHMS.build(cfg.algorithm, "algorithm")
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    fedcfg = cfg.federation
    topology = Topology.build(fedcfg.num_clients, fedcfg.num_edges, fedcfg.edge_sizes)
    shards = make_shards(topology, node_count(cfg, options.hierarchical), options.hierarchical)
    if not 0 <= shard_index < len(shards):
        raise ValueError(f"shard {shard_index} out of range (the run has {len(shards)} nodes)")
    shard = shards[shard_index]
    spec = {
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "num_clients": fedcfg.num_clients,
        "seed": cfg.seed,
        "clients": shard.clients.tolist(),
        "public": cfg.public.model_dump(),
        "subsample": cfg.subsample.model_dump(),
    }
    hosted, num_classes, max_count, min_count = cached_node_data(
        spec, lambda: _node_data(cfg, shard), cfg.flower.node_cache
    )
    fed = Federation.from_clients(hosted, num_classes)
    if cfg.public.per_class:  # D_pub is public: every node has it (not in the node cache)
        fed = dataclasses.replace(fed, public=_partition(cfg)[2])
    model = MODELS.build(cfg.model, "model").build(fed.feature_shape, fed.num_classes)
    generator = torch.Generator(device="cpu").manual_seed(cfg.seed + ENGINE_SEED_OFFSET)
    sampler = BatchSampler(
        fed.train.counts,
        generator,
        fedcfg.sampling == "with_replacement",
        rows=shard.clients,
        total=fedcfg.num_clients,
        max_count=max_count,
        min_count=min_count,
    )
    local_edge_of = torch.searchsorted(shard.edges, topology.edge_of_client[shard.clients])
    ctx = RunContext(
        model=model,
        fed=fed,
        topology=Topology(local_edge_of, len(shard.edges)),
        ledger=CommLedger(),
        generator=generator,
        sampler=sampler,
        weighting=fedcfg.weighting,
        zero_threshold=cfg.comm.zero_threshold,
        client_ids=shard.clients,
        edge_ids=shard.edges,
    )
    return NodeRuntime(cfg, shard, options.build(ctx), ctx)


_RUNTIMES: dict[tuple[str, int], NodeRuntime] = {}


def node_runtime(config_text: str, shard_index: int) -> NodeRuntime:
    """The cached runtime of ``shard_index`` for this configuration (built on first use)."""
    key = (config_text, shard_index)
    if key not in _RUNTIMES:
        if any(text != config_text for text, _ in _RUNTIMES):
            _RUNTIMES.clear()  # one run per process at a time: drop other runs' data
        data: Any = yaml.safe_load(config_text)
        _RUNTIMES[key] = build_node(validate_config(data), shard_index)
    return _RUNTIMES[key]
