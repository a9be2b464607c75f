"""The fedhp ClientApp, ``fedhp.flower.client_app:app``: a Flower node hosting one shard (edges
with their clients, or a shard of clients) and running the algorithm's local work on it.

The fedhp configuration comes from the message (sent the first time a node is addressed) or from
Flower's run config (``fedhp-config``); the node keeps it, with its per-client/per-edge state, in
``context.state``.
"""

from __future__ import annotations

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedhp.algorithms import State
from fedhp.flower.messages import (
    EVAL_PREFIX,
    EVALUATE_AFTER,
    QUERY_KEYS,
    RESTORE_PREFIX,
    STATE_PREFIX,
    Content,
    from_record,
    to_record,
)
from fedhp.flower.node import NodeRuntime, node_runtime

STATE = "fedhp.state"
NODE = "fedhp.node"
RUN_CONFIG_KEY = "fedhp-config"


def _config_text(msg: Content, context: Context) -> str:
    sent = msg.meta.get("config")
    if isinstance(sent, str):
        return sent
    stored = context.state.config_records.get(NODE)
    if stored is not None and isinstance(stored.get("config"), str):
        return str(stored["config"])
    from_run = context.run_config.get(RUN_CONFIG_KEY)
    if isinstance(from_run, str):
        return from_run
    raise RuntimeError(
        f"fedhp: this node has no fedhp configuration (neither in the message nor in the run "
        f"config's {RUN_CONFIG_KEY!r})"
    )


def _load_state(context: Context, rt: NodeRuntime, config_text: str) -> State:
    """The node's state from ``context.state`` (fresh if absent or from another run/shard)."""
    node = context.state.config_records.get(NODE)
    arrays = context.state.array_records.get(STATE)
    same = (
        node is not None
        and node.get("config") == config_text
        and node.get("shard") == rt.shard.index
        and arrays is not None
        and set(arrays) == set(rt.algorithm.held_keys)
    )
    if not same:
        return rt.initial_state()
    assert arrays is not None
    return {k: torch.from_numpy(arrays[k].numpy().copy()) for k in arrays}


def _restored_state(msg: Content, rt: NodeRuntime) -> State | None:
    """The node's rows of a checkpoint, when the cloud sends them (the first message after a
    resume); checked against the node's own initial state. A checkpoint may leave out entries
    no round reads before rebuilding them (``Algorithm.round_local_keys``)."""
    sent = {
        k[len(RESTORE_PREFIX) :]: v for k, v in msg.arrays.items() if k.startswith(RESTORE_PREFIX)
    }
    if not sent:
        return None
    initial = rt.initial_state()
    if not set(sent) <= set(initial):
        raise RuntimeError(
            f"fedhp: restore rows {sorted(sent)}, expected (some of) {sorted(initial)}"
        )
    for key, value in sent.items():
        if value.shape != initial[key].shape or value.dtype != initial[key].dtype:
            raise RuntimeError(f"fedhp: restore rows {key!r} have the wrong shape or dtype")
    return sent


def _save_state(context: Context, state: State, rt: NodeRuntime, config_text: str) -> None:
    record = ArrayRecord()
    for key, value in state.items():
        record[key] = Array.from_numpy_ndarray(value.detach().cpu().numpy())
    context.state[STATE] = record
    context.state[NODE] = ConfigRecord({"config": config_text, "shard": rt.shard.index})


def handle(kind: str, content: RecordDict, context: Context) -> RecordDict:
    """A node's reply content to a ``train``, ``evaluate`` or ``query`` message."""
    msg = from_record(content)
    config_text = _config_text(msg, context)
    shard = msg.meta.get("shard")
    if not isinstance(shard, int):
        raise RuntimeError("fedhp: message without a shard index")
    rt = node_runtime(config_text, shard)
    restored = _restored_state(msg, rt)
    state = _load_state(context, rt, config_text)
    if restored is not None:
        state.update(restored)
    if kind == "query":
        _save_state(context, state, rt, config_text)
        asked = msg.meta.get(QUERY_KEYS)
        keys = str(asked).split(",") if asked is not None else list(rt.algorithm.held_keys)
        rows = {f"{STATE_PREFIX}{k}": state[k] for k in keys}
        return to_record(rows, {}, rt.cfg.flower.sparse_wire)
    if kind == "train":
        out = rt.train(state, msg)
        _save_state(context, state, rt, config_text)
        ledger = out.pop("ledger")
        arrays = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        if msg.meta.get(EVALUATE_AFTER):  # this round is evaluated: save a message
            arrays.update({f"{EVAL_PREFIX}{k}": v for k, v in rt.evaluate(state).items()})
        return to_record(arrays, {"ledger": ledger}, rt.cfg.flower.sparse_wire)
    if kind == "evaluate":
        if restored is not None or not isinstance(
            context.state.config_records.get(NODE), ConfigRecord
        ):
            _save_state(context, state, rt, config_text)
        broadcast = {k[2:]: v for k, v in msg.arrays.items() if k.startswith("b.")}
        return to_record(rt.evaluate(state, broadcast), {}, rt.cfg.flower.sparse_wire)
    raise RuntimeError(f"fedhp: unknown message type {kind!r}")


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the round's local work of this node's edges/clients."""
    return Message(handle("train", msg.content, context), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate this node's clients' personalized models on their own data."""
    return Message(handle("evaluate", msg.content, context), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Return this node's part of the algorithm state (for the cloud's checkpoint)."""
    return Message(handle("query", msg.content, context), reply_to=msg)
