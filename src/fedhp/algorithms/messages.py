"""The keyed messages an algorithm sends and receives: the global model (field ``"model"``) and,
where they travel, its running statistics (``"buffers"``, as its :class:`BufferPolicy` says)
down; the clients' uploads (:meth:`MessageRows.client_update`, :meth:`MessageRows.send_up`) up;
the widths of the rows a Flower deployment moves."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedhp.algorithms.buffers import BufferPolicy
from fedhp.algorithms.task import OLD_ROW_KEYS, Task, Trained, Update
from fedhp.comm import Message
from fedhp.engine.uplink import CENTRE_KEYS, MOMENTUM_KEY

if TYPE_CHECKING:
    from fedhp.algorithms.base import RowKind, State
    from fedhp.engine.context import RunContext


class MessageRows:
    """The :class:`~fedhp.algorithms.base.Algorithm` methods on messages and uploaded rows."""

    ctx: RunContext
    buffers: BufferPolicy
    client_outputs: tuple[str, ...]  # (the Algorithm's, declared by its options class)
    edge_outputs: tuple[str, ...]
    client_buffer_outputs: tuple[str, ...]
    edge_buffer_outputs: tuple[str, ...]

    if TYPE_CHECKING:  # (the Algorithm's)

        def global_model(self, state: State) -> torch.Tensor | None: ...

    def buffer_node_keys(self) -> dict[str, RowKind]:
        """Node-held buffer entries of the state (used only when the model has buffers)."""
        return self.buffers.node_keys()

    def uplink_node_keys(self) -> dict[str, RowKind]:
        """The entries of :meth:`uplink_state` held below the cloud: the clients' momenta and
        the edges' centres."""
        ctx = self.ctx
        out: dict[str, RowKind] = {}
        if ctx.client_momentum > 0:
            out[MOMENTUM_KEY] = "client"
        if ctx.edge_uplink.centred:
            out[CENTRE_KEYS["edge"]] = "edge"
        return out

    def uplink_state(self, init_params: torch.Tensor) -> dict[str, torch.Tensor]:
        """What the uplink pipelines keep across rounds (issue 41), zeros at the start: the
        clients' momenta ``[C, P]`` (``algorithm.client_momentum`` > 0, :data:`MOMENTUM_KEY`)
        and, at each level whose rule is centred (``cclip``), its previous aggregate update
        (:data:`CENTRE_KEYS`: ``[P]`` at the cloud, ``[E, P]`` at the edges). Empty without
        them, so such runs have the state they always had. For the methods that honour them
        (``AlgorithmOptions.keeps_centres``, the clients' models uploaded)."""
        ctx, out = self.ctx, {}
        width = init_params.shape[-1]
        zeros = init_params.new_zeros
        if ctx.client_momentum > 0:
            out[MOMENTUM_KEY] = zeros(ctx.num_clients, width)
        if ctx.cloud_uplink.centred:
            out[CENTRE_KEYS["cloud"]] = zeros(width)
        if ctx.edge_uplink.centred:
            out[CENTRE_KEYS["edge"]] = zeros(ctx.topology.num_edges, width)
        return out

    def client_update(
        self,
        state: State,
        task: Task,
        trained: Trained,
        buffers: torch.Tensor | None,
        **rows: torch.Tensor,
    ) -> Update:
        """The :class:`Update` of the task's clients from their local SGD's ``trained``
        (:meth:`RunContext.local_sgd`: parameters, summed losses, steps): their ``model``, the
        method's own ``rows`` and their trained ``buffers`` (uploaded in both modes: the global
        model is evaluated with them; kept by the clients under ``buffers=local``)."""
        params, loss_sum, steps = trained
        per_client = {"model": params, **rows}
        if buffers is not None:
            self.buffers.keep(state, task.clients, buffers)
            per_client["buffers"] = buffers
        return Update(per_client=per_client, losses=loss_sum.unsqueeze(0), steps=steps)

    def send_up(
        self,
        update: Update,
        clients: torch.Tensor,
        start: torch.Tensor,
        *extra: str,
        momenta: torch.Tensor | None = None,
    ) -> Message:
        """The uploads of ``clients`` (an :meth:`client_update`'s rows) as the cloud receives
        them: one message per client of the fields ``"model"`` (its ``model`` row — with
        ``momenta``, the state's ``[C, P]`` momenta, ``start`` + each client's momentum,
        :meth:`~fedhp.engine.uplink.Uplink.accumulate` —, forged where malicious by the cloud's
        uplink, :meth:`~fedhp.engine.uplink.Uplink.forge`; ``start``: the model they started
        from), ``"buffers"`` where present and its ``extra`` rows (``[n, P]`` each, under their
        own names), billed on the client-cloud uplink."""
        ctx = self.ctx
        uplink = ctx.cloud_uplink
        params = uplink.accumulate(update.per_client["model"], start, momenta, clients)
        params = uplink.forge(params, ctx.global_clients(clients), start)
        message = self.with_buffers(params, update.per_client.get("buffers"))
        message.update((k, update.per_client[k]) for k in extra)
        return ctx.send("client_cloud", "up", message, clients)

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

    def downlink(self, state: State, count: int) -> Message | None:
        """``count`` copies of the message carrying the global model down (None: none)."""
        w = self.global_model(state)
        if w is None:
            return None
        sent = self.buffers.sent(state).get("global_buffers")
        return self.with_buffers(w.expand(count, -1), None if sent is None else sent.unsqueeze(0))

    def client_widths(self) -> dict[str, int]:
        """Keys of ``Update.per_client`` and their row widths (P, or B for buffers); an old
        key in ``client_outputs`` (:data:`OLD_ROW_KEYS`) under its current name."""
        out = {OLD_ROW_KEYS.get(k, k): self.ctx.model.num_params for k in self.client_outputs}
        if self.buffers.width:
            out.update({k: self.buffers.width for k in self.client_buffer_outputs})
        return out

    def edge_widths(self) -> dict[str, int]:
        """Keys of ``Update.per_edge`` and their row widths (P, or B for buffers; old keys as
        in :meth:`client_widths`)."""
        out = {OLD_ROW_KEYS.get(k, k): self.ctx.model.num_params for k in self.edge_outputs}
        if self.buffers.width:
            out.update({k: self.buffers.width for k in self.edge_buffer_outputs})
        return out

    def row_width(self, key: str) -> int:
        """Width of the rows of held state ``key`` (P, or B for buffer rows)."""
        return self.buffers.width if key in self.buffer_node_keys() else self.ctx.model.num_params

    def global_buffers(self, state: State) -> torch.Tensor | None:
        """The global model's running statistics ``[B]`` (None without BatchNorm)."""
        return state.get("global_buffers")

    def personal_buffers(self, state: State) -> torch.Tensor | None:
        """Running statistics ``[C, B]`` of the personalized models (None without BatchNorm);
        FedBN-style (:attr:`personal_from_buffers`): each client's own."""
        return self.buffers.own(state) if self.personal_from_buffers else None

    @property
    def personal_from_buffers(self) -> bool:
        """FedBN-style evaluation: with ``buffers=local`` a method with a global model has as
        client c's personalized model the global model normalized with c's own statistics."""
        return self.buffers.local and self.buffers.shared
