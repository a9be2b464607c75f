"""The rows an algorithm sends and keeps beside its parameters: BatchNorm running statistics
(buffers, ``[.., B]`` beside the ``[.., P]`` parameters; averaged like the model or kept by each
client, ``buffers=average|local``), the keyed messages that carry both (fields ``"model"`` and
``"buffers"``, :meth:`BufferRows.with_buffers`), and
the clients' uploads built from them (:meth:`BufferRows.client_update`,
:meth:`BufferRows.send_up`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from fedhp.algorithms.task import Task, Update
from fedhp.comm import Message

if TYPE_CHECKING:
    from fedhp.algorithms.base import RowKind, State
    from fedhp.algorithms.options import AlgorithmOptions
    from fedhp.engine.context import RunContext


class BufferRows:
    """The :class:`~fedhp.algorithms.base.Algorithm` methods on buffer rows and messages."""

    options: AlgorithmOptions
    ctx: RunContext
    num_buffers: int
    client_outputs: ClassVar[tuple[str, ...]]
    edge_outputs: ClassVar[tuple[str, ...]]
    client_buffer_outputs: ClassVar[tuple[str, ...]]
    edge_buffer_outputs: ClassVar[tuple[str, ...]]

    if TYPE_CHECKING:  # (the Algorithm's)

        def global_model(self, state: State) -> torch.Tensor | None: ...

    @property
    def buffers_local(self) -> bool:
        """Each client keeps its own running statistics (``buffers=local``) on a BN model."""
        return self.num_buffers > 0 and self.options.buffers == "local"

    def buffer_node_keys(self) -> dict[str, RowKind]:
        """Node-held buffer entries of the state (used only when the model has buffers)."""
        return {"client_buffers": "client"} if self.options.buffers == "local" else {}

    def init_buffer_state(self, device: torch.device) -> State:
        """Buffer entries of the initial state: ``global_buffers [B]`` and, with
        ``buffers=local``, every client's own ``client_buffers [C, B]`` (none without BN)."""
        if not self.num_buffers:
            return {}
        init = self.ctx.model.init_buffers().to(device)
        state = {"global_buffers": init}
        if self.buffers_local:
            state["client_buffers"] = init.expand(self.ctx.num_clients, -1).clone()
        return state

    def start_buffers(
        self, state: State, clients: torch.Tensor, sent: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Writable running statistics ``[len(clients), B]`` that ``clients`` train from: their
        own (``local``) or the ``sent [n, B]`` rows (``average``); None without buffers."""
        if not self.num_buffers:
            return None
        if self.buffers_local:
            return state["client_buffers"][clients].clone()
        assert sent is not None
        return sent.clone()

    def keep_buffers(self, state: State, clients: torch.Tensor, bufs: torch.Tensor | None) -> None:
        """With ``buffers=local``, store the clients' trained running statistics."""
        if self.buffers_local and bufs is not None:
            state["client_buffers"][clients] = bufs

    def received_buffers(self, state: State, task: Task) -> torch.Tensor | None:
        """Writable running statistics ``[n, B]`` the task's clients train from: their own, or
        the broadcast ``global_buffers`` (:meth:`start_buffers`); None without buffers."""
        sent = task.broadcast.get("global_buffers")
        n = len(task.clients)
        return self.start_buffers(state, task.clients, None if sent is None else sent.expand(n, -1))

    def client_update(
        self,
        state: State,
        task: Task,
        trained: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        buffers: torch.Tensor | None,
        **rows: torch.Tensor,
    ) -> Update:
        """The :class:`Update` of the task's clients from their local SGD's ``trained``
        (:meth:`RunContext.local_sgd`: parameters, summed losses, steps): their ``params``, the
        method's own ``rows`` and their trained ``buffers`` (uploaded in both modes: the global
        model is evaluated with them; kept by the clients under ``buffers=local``)."""
        params, loss_sum, steps = trained
        per_client = {"params": params, **rows}
        if buffers is not None:
            self.keep_buffers(state, task.clients, buffers)
            per_client["buffers"] = buffers
        return Update(per_client=per_client, losses=loss_sum.unsqueeze(0), steps=steps)

    def send_up(
        self, update: Update, clients: torch.Tensor, start: torch.Tensor, *extra: str
    ) -> Message:
        """The uploads of ``clients`` (an :meth:`client_update`'s rows) as the cloud receives
        them: one message per client of the fields ``"model"`` (its ``params``, forged where
        malicious by the cloud's uplink, :meth:`~fedhp.engine.uplink.Uplink.forge`; ``start``:
        the model they started from), ``"buffers"`` where present and its ``extra`` rows
        (``[n, P]`` each, under their own names), billed on the client-cloud uplink."""
        ctx = self.ctx
        params = ctx.cloud_uplink.forge(
            update.per_client["params"], ctx.global_clients(clients), start
        )
        message = self.with_buffers(params, update.per_client.get("buffers"))
        message.update((k, update.per_client[k]) for k in extra)
        return ctx.send("client_cloud", "up", message, clients)

    def sent_buffers(self, state: State) -> dict[str, torch.Tensor]:
        """What goes down beside the global model: ``global_buffers`` when averaged."""
        if self.buffers_travel_down:
            return {"global_buffers": state["global_buffers"]}
        return {}

    @staticmethod
    def with_buffers(params: torch.Tensor, buffers: torch.Tensor | None) -> Message:
        """The message of ``params`` (field ``"model"``) and, where they travel, ``buffers``
        (field ``"buffers"``)."""
        if buffers is None:
            return Message(model=params)
        return Message(model=params, buffers=buffers)

    def received_broadcast(self, message: Message) -> dict[str, torch.Tensor]:
        """What a receiver of one :meth:`downlink` message gets: ``global`` and, where they
        travel, ``global_buffers`` (the billed, truncated values)."""
        received = {"global": message["model"]}
        if "buffers" in message:
            received["global_buffers"] = message["buffers"]
        return received

    @property
    def buffers_travel_down(self) -> bool:
        """The global running statistics travel down with the global model (``average``)."""
        return bool(self.num_buffers) and not self.buffers_local

    def downlink(self, state: State, count: int) -> Message | None:
        """``count`` copies of the message carrying the global model down (None: none)."""
        w = self.global_model(state)
        if w is None:
            return None
        sent = self.sent_buffers(state).get("global_buffers")
        return self.with_buffers(w.expand(count, -1), None if sent is None else sent.unsqueeze(0))

    def client_widths(self) -> dict[str, int]:
        """Keys of ``Update.per_client`` and their row widths (P, or B for buffers)."""
        out = {k: self.ctx.model.num_params for k in self.client_outputs}
        if self.num_buffers:
            out.update({k: self.num_buffers for k in self.client_buffer_outputs})
        return out

    def edge_widths(self) -> dict[str, int]:
        """Keys of ``Update.per_edge`` and their row widths (P, or B for buffers)."""
        out = {k: self.ctx.model.num_params for k in self.edge_outputs}
        if self.num_buffers:
            out.update({k: self.num_buffers for k in self.edge_buffer_outputs})
        return out

    def row_width(self, key: str) -> int:
        """Width of the rows of held state ``key`` (P, or B for buffer rows)."""
        return self.num_buffers if key in self.buffer_node_keys() else self.ctx.model.num_params

    def global_buffers(self, state: State) -> torch.Tensor | None:
        """The global model's running statistics ``[B]`` (None without BatchNorm)."""
        return state.get("global_buffers")

    def personal_buffers(self, state: State) -> torch.Tensor | None:
        """Running statistics ``[C, B]`` of the personalized models (None without BatchNorm);
        FedBN-style (:attr:`personal_from_buffers`): each client's own."""
        return state.get("client_buffers") if self.personal_from_buffers else None

    @property
    def personal_from_buffers(self) -> bool:
        """FedBN-style evaluation: with ``buffers=local`` a flat method's personalized model of
        client c is the global model normalized with c's own running statistics."""
        return self.buffers_local and "client_buffers" in self.buffer_node_keys()
