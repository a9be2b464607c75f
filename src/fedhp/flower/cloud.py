"""The cloud's side of a fedhp round on Flower: split the task over the nodes, collect and check
their replies, merge them and aggregate — with the algorithm's own ``plan``/``aggregate``.

Faults: a node that does not answer in time (died, timed out) or answers with an error is a failed
node for the round — its edges (or clients) take no part, the weights renormalize over the rest,
one line is logged; it is asked again the next round. A reply with wrong keys, shapes, dtypes or
NaN/Inf is rejected the same way and never aggregated. If no node returns a usable update the
round is skipped (model unchanged), as the in-process engine skips a round nobody can join.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import yaml
from flwr.app import RecordDict
from tqdm import tqdm

from fedhp.algorithms import State, Task, Update
from fedhp.algorithms.base import NNZ_PREFIX
from fedhp.config import RunConfig, config_to_dict
from fedhp.engine.evaluate import ClientEval
from fedhp.engine.experiment import Experiment
from fedhp.engine.faults import RoundSkipped
from fedhp.engine.runner import Row, evaluate_state, is_eval_round
from fedhp.flower.messages import (
    EVAL_PREFIX,
    EVALUATE_AFTER,
    QUERY_KEYS,
    RESTORE_PREFIX,
    STATE_PREFIX,
    Content,
    MalformedReply,
    expect,
    expect_ids,
    expect_keys,
    from_record,
    parse_ledger,
    payload_bytes,
    serialized_bytes,
    to_record,
)
from fedhp.flower.shards import Shard
from fedhp.reporting import MetricsWriter

BYTES_FILE = "flower_bytes.csv"
EVENTS_FILE = "flower_events.csv"

Reply = RecordDict | str
"""A node's reply content, or a description of the error it answered with."""


class Transport(Protocol):
    """Sends one message per shard and returns the replies that came back (by shard); a shard
    missing from the result did not answer in time."""

    def exchange(self, kind: str, rnd: int, requests: dict[int, RecordDict]) -> dict[int, Reply]:
        """``kind``: ``train`` or ``evaluate``; ``rnd``: the 0-based round."""
        ...


@dataclass
class PersonalResult:
    """Personalized evaluation assembled from the nodes' per-client sums."""

    test: ClientEval
    train: ClientEval
    density: float


@dataclass
class _Part:
    shard: Shard
    task: Task  # global indices, this shard's part


def log_line(line: str) -> None:
    tqdm.write(f"fedhp: {line}", file=sys.stderr)


def node_config(cfg: RunConfig) -> dict[str, Any]:
    """The configuration sent to the nodes: the run's, with ``threads`` filled in where the run
    leaves it unset (the cloud's torch thread count, i.e. what the in-process engine would use),
    so a node's arithmetic, and the numbers, are the in-process run's."""
    data = config_to_dict(cfg, on_flower=True)  # (the nodes read flower.sparse_wire, ...)
    if data.get("threads") is None:
        data["threads"] = torch.get_num_threads()
    return data


class FlowerDriver:
    """A :class:`~fedhp.engine.runner.RoundDriver` running rounds over Flower nodes."""

    def __init__(
        self,
        exp: Experiment,
        transport: Transport,
        shards: list[Shard],
        out_dir: Path | None,
        log: Callable[[str], None] = log_line,
    ) -> None:
        self.exp = exp
        self.algo = exp.algorithm
        self.transport = transport
        self.shards = shards
        self.log = log
        sent = node_config(exp.cfg)
        self.config_text = yaml.safe_dump(sent, sort_keys=False)
        if exp.cfg.threads is None:
            log(
                f"flower: threads unset: each node uses {sent['threads']} torch threads, as the "
                "in-process engine would (same numbers); with several nodes per machine, "
                "threads=1 is faster"
            )
        self.configured: set[int] = set()
        self.num_params = exp.model.num_params
        self.events: list[Row] = []
        self.bytes_rows: list[Row] = []
        self._pending: Row = {}
        self._bytes = MetricsWriter(out_dir / BYTES_FILE) if out_dir is not None else None
        self._events = MetricsWriter(out_dir / EVENTS_FILE) if out_dir is not None else None
        if out_dir is not None:
            for name in (BYTES_FILE, EVENTS_FILE):
                (out_dir / name).unlink(missing_ok=True)
        self._round = 0
        self._early: dict[int, dict[str, torch.Tensor]] = {}  # evaluations sent with train
        self._early_round = -1
        self._restore: State = {}  # a resumed run's node-held rows, for nodes not yet given them
        self._to_restore: set[int] = set()

    # -- RoundDriver -------------------------------------------------------------------------

    def cloud_state(self, state: State, restored: bool) -> State:
        """Drop the node-held entries; keep their per-row non-zero counts. ``restored`` (a
        resumed run): every node gets its rows of the checkpoint with its next message."""
        out = {k: v for k, v in state.items() if k not in self.algo.held_keys}
        for key in self.algo.held_keys:
            out[NNZ_PREFIX + key] = self.algo.row_nonzeros(state, key)
        kept = [k for k in self.algo.held_keys if k not in self.algo.round_local_keys()]
        if restored and kept:
            self._restore = {k: state[k].detach().cpu().clone() for k in kept}
            self._to_restore = {shard.index for shard in self.shards}
        return out

    def full_state(self, state: State, skip: frozenset[str] = frozenset()) -> State | None:
        """The cloud's ``state`` with the node-held rows (less those in ``skip``) asked from every
        node (a ``query`` message); None, logged, if a node does not return them."""
        full = {k: v for k, v in state.items() if not k.startswith(NNZ_PREFIX)}
        keys = {k: kind for k, kind in self.algo.held_keys.items() if k not in skip}
        if not keys:
            return full
        meta: dict[str, int | float | str] = {"round": self._round}
        if len(keys) < len(self.algo.held_keys):
            meta[QUERY_KEYS] = ",".join(keys)
        requests = {
            shard.index: self._request(shard, {}, {**meta, "shard": shard.index})
            for shard in self.shards
        }
        replies = self.transport.exchange("query", self._round, requests)
        rows = {k: self._node_rows(k) for k in keys}
        complete = True
        for shard in self.shards:
            content = self._usable(shard.index, replies.get(shard.index), "no checkpoint")
            if content is None:
                complete = False
                continue
            try:
                expect_keys(content.arrays, {STATE_PREFIX + k for k in keys})
                for key, kind in keys.items():
                    ids = shard.clients if kind == "client" else shard.edges
                    value = expect(
                        content.arrays,
                        STATE_PREFIX + key,
                        (len(ids), self.algo.row_width(key)),
                        torch.float32,
                    )
                    rows[key][ids] = value
            except MalformedReply as why:
                self._event(shard.index, "rejected", f"malformed state ({why}); no checkpoint")
                complete = False
        self._record_bytes("query", requests, replies, {})
        if not complete:
            return None
        full.update(rows)
        return full

    def run_round(self, state: State, rnd: int) -> Row:
        self._round = rnd
        self._early, self._early_round = {}, rnd
        evaluate_after = (
            self.algo.evaluates_on_nodes
            and not self.algo.evaluation_needs_global
            and is_eval_round(self.exp.cfg, rnd)
        )
        task = self.algo.plan(state, rnd)
        gen = self.exp.ctx.sampler.generator
        gen_state = gen.get_state()
        parts: dict[int, _Part] = {}
        requests: dict[int, RecordDict] = {}
        for shard in self.shards:
            part = _split(task, shard)
            if part is None:
                continue
            parts[shard.index] = _Part(shard, part)
            arrays = {"clients": part.clients, "gen": gen_state}
            optional = {"edges": part.edges, "agg": part.agg_edges, "stragglers": part.stragglers}
            arrays.update({k: v for k, v in optional.items() if v is not None})
            arrays.update({f"b.{k}": v for k, v in part.broadcast.items()})
            arrays.update({f"c.{k}": v for k, v in part.per_client.items()})
            meta: dict[str, int | float | str] = {"round": rnd, "shard": shard.index}
            meta.update({f"s.{k}": v for k, v in part.scalars.items()})
            if evaluate_after:
                meta[EVALUATE_AFTER] = 1
            requests[shard.index] = self._request(shard, arrays, meta)
        replies = self.transport.exchange("train", rnd, requests)
        good: dict[int, Content] = {}
        for index, entry in parts.items():
            content = self._usable(index, replies.get(index))
            if content is None:
                continue
            try:
                self._check_train(content, entry, gen_state, evaluate_after)
                if evaluate_after:
                    early = _eval_arrays(content.arrays, EVAL_PREFIX, entry.shard)
            except MalformedReply as why:
                self._event(index, "rejected", f"malformed update ({why}); not aggregated")
                continue
            good[index] = content
            if evaluate_after:
                self._early[index] = early
        self._agree(good)
        self._early = {i: v for i, v in self._early.items() if i in good}
        self._record_bytes("train", requests, replies, good)
        if not good:
            self._write_bytes(self._pending)
            raise RoundSkipped("no Flower node returned a usable update")
        gen.set_state(good[min(good)].arrays["gen"])
        merged_task, update = self._merge(task, parts, good)
        for index, content in good.items():
            self.exp.ctx.ledger.merge_round(parse_ledger(content.meta.get("ledger")))
            shard = parts[index].shard
            for key, kind in self.algo.held_keys.items():
                ids = shard.clients if kind == "client" else shard.edges
                state[NNZ_PREFIX + key][ids] = content.arrays[f"nnz.{key}"]
        stats = self.algo.aggregate(state, merged_task, update)
        self._bytes_accounting_note()
        return stats

    def evaluate(self, state: State) -> tuple[Row, list[Row]]:
        personal = self._personal(state) if self.algo.evaluates_on_nodes else None
        return evaluate_state(self.exp, state, personal)

    def close(self) -> None:
        pass

    # -- helpers -----------------------------------------------------------------------------

    def _node_rows(self, key: str) -> torch.Tensor:
        """An empty [rows, P] table for node-held entry ``key`` (all clients or all edges)."""
        ctx = self.exp.ctx
        rows = ctx.num_clients if self.algo.held_keys[key] == "client" else ctx.topology.num_edges
        return torch.zeros(rows, self.algo.row_width(key), dtype=torch.float32)

    def _request(
        self, shard: Shard, arrays: dict[str, torch.Tensor], meta: dict[str, int | float | str]
    ) -> RecordDict:
        """A message for ``shard``; the first one after a node failed (or the first ever) carries
        the configuration, the first one after resuming the node's rows of the checkpoint."""
        if shard.index not in self.configured:
            meta["config"] = self.config_text
        if shard.index in self._to_restore:
            for key in self._restore:
                ids = shard.clients if self.algo.held_keys[key] == "client" else shard.edges
                arrays[RESTORE_PREFIX + key] = self._restore[key][ids]
        return to_record(arrays, meta, self.exp.cfg.flower.sparse_wire)

    def _event(self, shard: int, event: str, detail: str) -> None:
        row: Row = {"round": self._round + 1, "shard": shard, "event": event, "detail": detail}
        self.events.append(row)
        if self._events is not None:
            self._events.append(row)
        self.log(f"round {self._round + 1}: node {shard}: {detail}")

    def _usable(
        self, index: int, reply: Reply | None, consequence: str = "its edges sit out"
    ) -> Content | None:
        """Decoded reply, or None (logged, with ``consequence``) when the node failed."""
        if reply is None:
            self.configured.discard(index)
            self._event(index, "missing", f"no reply (node down or timed out); {consequence}")
            return None
        if isinstance(reply, str):
            self.configured.discard(index)
            self._event(index, "error", f"error reply ({reply}); {consequence}")
            return None
        try:
            content = from_record(reply)
        except MalformedReply as why:
            self._event(index, "rejected", f"malformed reply ({why}); not aggregated")
            return None
        self.configured.add(index)
        self._to_restore.discard(index)
        return content

    def _check_train(
        self, content: Content, part: _Part, gen_state: torch.Tensor, evaluate_after: bool
    ) -> None:
        algo, task, shard = self.algo, part.task, part.shard
        up = task.up_edges
        keys = {"clients", "edges", "gen", "losses"}
        keys |= {f"c.{k}" for k in algo.client_widths()} | {f"e.{k}" for k in algo.edge_widths()}
        keys |= {f"nnz.{k}" for k in algo.held_keys}
        a = content.arrays
        if evaluate_after:
            keys |= {EVAL_PREFIX + k for k in _EVAL_NAMES}
        expect_keys(a, keys)
        expect_ids(a, "clients", task.clients)
        expect_ids(a, "edges", up if up is not None else torch.zeros(0, dtype=torch.long))
        n_c, n_e = len(task.clients), 0 if up is None else len(up)
        for k, width in algo.client_widths().items():
            expect(a, f"c.{k}", (n_c, width), torch.float32)
        for k, width in algo.edge_widths().items():
            expect(a, f"e.{k}", (n_e, width), torch.float32)
        losses = a["losses"]
        if losses.dim() != 2:
            raise MalformedReply("'losses' must be [groups, clients]")
        expect(a, "losses", (losses.shape[0], n_c), torch.float32)
        expect(a, "gen", tuple(gen_state.shape), torch.uint8)
        for key, kind in algo.held_keys.items():
            rows = len(shard.clients) if kind == "client" else len(shard.edges)
            nnz = expect(a, f"nnz.{key}", (rows,), torch.int64)
            if rows and (int(nnz.min()) < 0 or int(nnz.max()) > algo.row_width(key)):
                raise MalformedReply(f"'nnz.{key}' out of range")
        parse_ledger(content.meta.get("ledger"))

    def _agree(self, good: dict[int, Content]) -> None:
        """Every node consumed the engine generator identically and reports the same number of
        loss groups; one that does not (compared with the lowest shard) is rejected."""
        if not good:
            return
        ref = good[min(good)].arrays
        for index in sorted(good):
            a = good[index].arrays
            if not torch.equal(a["gen"], ref["gen"]):
                why = "drew a different random stream"
            elif a["losses"].shape[0] != ref["losses"].shape[0]:
                why = "reported a different number of loss groups"
            else:
                continue
            del good[index]
            self._event(index, "rejected", f"{why}; not aggregated")

    def _merge(
        self, task: Task, parts: dict[int, _Part], good: dict[int, Content]
    ) -> tuple[Task, Update]:
        """The task restricted to the nodes that answered (their ``per_client`` rows too), and
        their merged update (rows in global order: shards are contiguous and ordered)."""
        order = sorted(good)

        def cat(key: str) -> torch.Tensor:
            return torch.cat([good[i].arrays[key] for i in order])

        clients = cat("clients")
        edges = agg = None
        if task.edges is not None:
            edges = torch.cat([_must(parts[i].task.edges) for i in order])
        if task.agg_edges is not None:
            agg = torch.cat([_must(parts[i].task.agg_edges) for i in order])
        per_client = {
            k: torch.cat([parts[i].task.per_client[k] for i in order]) for k in task.per_client
        }
        merged = Task(clients, edges, agg, task.broadcast, per_client, task.scalars)
        update = Update(
            per_client={k: cat(f"c.{k}") for k in self.algo.client_widths()},
            per_edge={k: cat(f"e.{k}") for k in self.algo.edge_widths()},
            losses=torch.cat([good[i].arrays["losses"] for i in order], dim=1),
        )
        return merged, update

    def _personal(self, state: State) -> PersonalResult:
        """Every node's evaluation of its clients' personalized models (those sent with this
        round's train replies, the others asked for now); assembled for all clients."""
        early = self._early if self._early_round == self._round else {}
        w = self.algo.global_model(state) if self.algo.evaluation_needs_global else None
        requests: dict[int, RecordDict] = {}
        for shard in self.shards:
            if shard.index in early:
                continue
            meta: dict[str, int | float | str] = {"round": self._round, "shard": shard.index}
            broadcast = {} if w is None else {"b.global": w}
            requests[shard.index] = self._request(shard, broadcast, meta)
        replies = self.transport.exchange("evaluate", self._round, requests) if requests else {}
        c = self.exp.ctx.num_clients
        sums = {k: torch.zeros(c, dtype=torch.float64) for k in _EVAL_KEYS}
        nnz = torch.zeros(c, dtype=torch.int64)
        good: dict[int, Content] = {}
        evaluated = set(early)
        for shard in self.shards:
            a = early.get(shard.index)
            if a is None and shard.index in requests:
                content = self._usable(shard.index, replies.get(shard.index))
                if content is None:
                    continue
                try:
                    a = _eval_arrays(content.arrays, "", shard)
                except MalformedReply as why:
                    self._event(shard.index, "rejected", f"malformed evaluation ({why})")
                    continue
                good[shard.index] = content
            if a is None:
                continue
            evaluated.add(shard.index)
            for key in _EVAL_KEYS:
                sums[key][shard.clients] = a[key]
            nnz[shard.clients] = a["nnz"]
        if requests:
            self._record_bytes("evaluate", requests, replies, good)
        missing = c - int(sum(len(s.clients) for s in self.shards if s.index in evaluated))
        if missing:
            self.log(f"round {self._round + 1}: personalized accuracy without {missing} clients")

        def part(prefix: str) -> ClientEval:
            return ClientEval(
                sums[f"{prefix}.correct"], sums[f"{prefix}.loss"], sums[f"{prefix}.count"]
            )

        density = float(nnz.sum()) / (c * self.num_params)
        return PersonalResult(part("test"), part("train"), density)

    def _record_bytes(
        self,
        kind: str,
        requests: dict[int, RecordDict],
        replies: dict[int, Reply],
        good: dict[int, Content],
    ) -> None:
        """What Flower carried this exchange, next to fedhp's own accounting of the round."""
        up = [r for r in replies.values() if isinstance(r, RecordDict)]
        row: Row = {
            "round": self._round + 1,
            "kind": kind,
            "messages_down": len(requests),
            "payload_bytes_down": sum(payload_bytes(r) for r in requests.values()),
            "serialized_bytes_down": sum(serialized_bytes(r) for r in requests.values()),
            "messages_up": len(up),
            "payload_bytes_up": sum(payload_bytes(r) for r in up),
            "serialized_bytes_up": sum(serialized_bytes(r) for r in up),
            "replies_used": len(good),
        }
        self._pending = row
        if kind != "train":  # the train row is written once the ledger's bytes are added
            self._write_bytes(row)

    def _bytes_accounting_note(self) -> None:
        """Add fedhp's ledger bytes of the cloud link for this round to the train row."""
        row = self._pending
        current = self.exp.ctx.ledger.current()
        link = "edge_cloud" if self.algo.options.hierarchical else "client_cloud"
        for d in ("down", "up"):
            row[f"fedhp_bytes_{d}"] = int(current.get(f"bytes_{link}_{d}", 0))
            row[f"fedhp_dense_bytes_{d}"] = int(current.get(f"dense_bytes_{link}_{d}", 0))
        self._write_bytes(row)

    def _write_bytes(self, row: Row) -> None:
        self.bytes_rows.append(row)
        if self._bytes is not None:
            self._bytes.append(row)


_EVAL_KEYS = tuple(
    f"{split}.{k}" for split in ("test", "train") for k in ("correct", "loss", "count")
)
_EVAL_NAMES = ("clients", "nnz", *_EVAL_KEYS)


def _eval_arrays(
    arrays: dict[str, torch.Tensor], prefix: str, shard: Shard
) -> dict[str, torch.Tensor]:
    """A node's evaluation of its clients (keys ``prefix + name``), checked, without the prefix;
    :class:`MalformedReply` if keys, ids, shapes or dtypes are off."""
    found = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    if prefix:  # the evaluation rides on a train reply (whose keys were checked already)
        found = {k: v for k, v in found.items() if k in _EVAL_NAMES}
    expect_keys(found, set(_EVAL_NAMES))
    expect_ids(found, "clients", shard.clients)
    for key in _EVAL_KEYS:
        expect(found, key, (len(shard.clients),), torch.float64)
    expect(found, "nnz", (len(shard.clients),), torch.int64)
    return found


def _must(value: torch.Tensor | None) -> torch.Tensor:
    assert value is not None
    return value


def _split(task: Task, shard: Shard) -> Task | None:
    """``shard``'s part of ``task`` (global indices), or None when it has no part."""

    def hosted(ids: torch.Tensor | None, among: torch.Tensor) -> torch.Tensor | None:
        return None if ids is None else ids[torch.isin(ids, among.to(ids.device))]

    mask = torch.isin(task.clients, shard.clients.to(task.clients.device))
    edges, agg = hosted(task.edges, shard.edges), hosted(task.agg_edges, shard.edges)
    if not bool(mask.any()) and (edges is None or len(edges) == 0):
        return None
    return Task(
        task.clients[mask],
        edges,
        agg,
        dict(task.broadcast),
        {k: v[mask] for k, v in task.per_client.items()},
        dict(task.scalars),
        hosted(task.stragglers, shard.clients),
    )
