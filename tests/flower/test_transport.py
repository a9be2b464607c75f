"""GridTransport: replies mapped back to shards by the message they answer; error replies
(including the SuperLink's own answer for a node it knows is gone) and missing replies (a node
that died or timed out, a message Flower could not push) reported as such; the wait ends at the
timeout or when the runtime stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedhp.errors import FedhpError
from fedhp.flower.server_app import GridTransport

SUPERLINK_NODE_ID = 1  # Flower's id for replies the SuperLink writes itself


class FakeGrid:
    """Node 11 answers with content; the message to node 12 gets the SuperLink's error reply
    (sender: the SuperLink, not node 12); node 13 stays silent; an unrelated node 99 answers too
    (ignored). With ``unpushable``, that message index cannot be pushed (id None)."""

    def __init__(self, unpushable: int | None = None) -> None:
        self.sent: list[Message] = []
        self.unpushable = unpushable

    def push_messages(self, messages: Iterable[Message]) -> list[str | None]:
        self.sent = list(messages)
        return [None if i == self.unpushable else f"m{i}" for i in range(len(self.sent))]

    def pull_messages(self, ids: Iterable[str]) -> list[Any]:
        ok = RecordDict({"r": ConfigRecord({"ok": 1})})

        def reply(node: int, to: str, error: Any = None) -> Any:
            meta = SimpleNamespace(src_node_id=node, reply_to_message_id=to)
            return SimpleNamespace(
                metadata=meta, has_error=lambda: error is not None, error=error, content=ok
            )

        unavailable = SimpleNamespace(code=0, reason="node unavailable")
        out = [reply(11, "m0"), reply(SUPERLINK_NODE_ID, "m1", unavailable)]
        return [r for r in out if r.metadata.reply_to_message_id in set(ids)] + [reply(99, "zz")]


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    # Outside a Flower runtime, messages need the task identity the runtime would set.
    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


def _requests() -> dict[int, RecordDict]:
    return {i: RecordDict({"q": ConfigRecord({"i": i})}) for i in range(3)}


def test_grid_transport_maps_replies_errors_and_silence() -> None:
    grid = FakeGrid()
    transport = GridTransport(grid, {0: 11, 1: 12, 2: 13}, timeout=0.3)  # type: ignore[arg-type]
    start = time.monotonic()
    out = transport.exchange("train", 4, _requests())
    assert 0.3 <= time.monotonic() - start < 5  # waited for node 13 until the timeout
    assert [m.metadata.dst_node_id for m in grid.sent] == [11, 12, 13]
    assert all(m.metadata.message_type == "train" for m in grid.sent)
    assert all(m.metadata.group_id == "4" for m in grid.sent)
    assert isinstance(out[0], RecordDict)
    assert out[1] == "0: node unavailable"
    assert set(out) == {0, 1}  # node 13 did not answer: missing


def test_grid_transport_message_that_could_not_be_pushed_is_missing() -> None:
    transport = GridTransport(FakeGrid(unpushable=0), {0: 11, 1: 12}, timeout=0.2)  # type: ignore[arg-type]
    out = transport.exchange("evaluate", 0, {i: r for i, r in _requests().items() if i < 2})
    assert set(out) == {1} and out[1] == "0: node unavailable"


def test_grid_transport_gives_up_when_the_runtime_stops() -> None:
    stop = threading.Event()
    transport = GridTransport(FakeGrid(), {0: 11, 1: 12, 2: 13}, 600, stop)  # type: ignore[arg-type]
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    with pytest.raises(FedhpError, match="stopped"):
        transport.exchange("train", 0, _requests())
    assert time.monotonic() - start < 10
