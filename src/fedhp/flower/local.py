"""A transport that runs the ClientApp's handler in this process (no Flower runtime, no Ray):
for tests and for checking the message path quickly. Messages still go through the same
records, and node state through a Flower :class:`~flwr.app.Context` per node."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, RecordDict

from fedhp.flower.client_app import handle
from fedhp.flower.cloud import Reply

Fault = Callable[[str, int, int, RecordDict], Reply | None]
"""``(kind, round, shard, reply) -> what the cloud gets instead`` (None: no reply)."""


class LocalTransport:
    """Every shard's node handled in this process, one :class:`Context` each; ``fault`` may
    replace, corrupt or drop replies (for tests). ``sent`` lists every message as ``(kind,
    round, shard)``."""

    def __init__(self, fault: Fault | None = None) -> None:
        self.contexts: dict[int, Context] = {}
        self.fault = fault
        self.sent: list[tuple[str, int, int]] = []

    def exchange(self, kind: str, rnd: int, requests: dict[int, RecordDict]) -> dict[int, Reply]:
        out: dict[int, Reply] = {}
        for shard, content in requests.items():
            self.sent.append((kind, rnd, shard))
            context = self.contexts.setdefault(
                shard,
                Context(run_id=0, node_id=shard, node_config={}, state=RecordDict(), run_config={}),
            )
            reply: Reply | None
            try:
                reply = handle(kind, content, context)
            except Exception as err:  # noqa: BLE001  (Flower turns these into error replies)
                reply = f"ClientApp exception: {err}"
            if self.fault is not None and isinstance(reply, RecordDict):
                reply = self.fault(kind, rnd, shard, reply)
            if reply is not None:
                out[shard] = reply
        return out
