"""Who owns a BatchNorm model's running statistics, and how they move: :class:`BufferPolicy`.

A model with BatchNorm carries buffers, ``[.., B]`` beside its ``[.., P]`` parameters. Under
``buffers=average`` the cloud averages the clients' trained statistics like the model
(``global_buffers``) and sends them down with it, and a client trains from the ones it received.
Under ``buffers=local`` (FedBN) each client trains from and keeps its own rows, and the averaged
``global_buffers`` serve only the global model's evaluation. An algorithm holds one policy
(``Algorithm.buffers``) and passes the rows it hands out through local SGD and back; it never
decides where they come from or where they go."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fedhp.algorithms.options import BufferMode

if TYPE_CHECKING:
    from fedhp.algorithms.base import RowKind, State
    from fedhp.algorithms.task import Task
    from fedhp.engine.context import RunContext


class BufferPolicy:
    """The running statistics of an algorithm's models: ``mode`` (``average`` / ``local``),
    their ``width`` ``B`` (0 without BatchNorm: every method a no-op), ``num_clients`` rows of
    the clients' own under ``own_key`` (``local``), initialised by ``init`` (``[B]``), and
    ``shared``: whether there is a global model whose statistics are ``global_buffers``."""

    def __init__(
        self,
        mode: BufferMode,
        width: int,
        num_clients: int,
        init: Callable[[], torch.Tensor],
        own_key: str = "client_buffers",
        shared: bool = True,
    ) -> None:
        self.mode, self.width, self.num_clients = mode, width, num_clients
        self.init, self.own_key, self.shared = init, own_key, shared

    @classmethod
    def of_run(cls, ctx: RunContext, mode: BufferMode, **where: Any) -> BufferPolicy:
        """The policy of ``ctx``'s model and clients under ``mode`` (``where``: ``own_key``,
        ``shared``)."""
        model = ctx.model
        return cls(mode, model.num_buffers, ctx.num_clients, model.init_buffers, **where)

    @property
    def local(self) -> bool:
        """Each client keeps its own running statistics (a BatchNorm model, ``local``)."""
        return self.width > 0 and self.mode == "local"

    @property
    def travels_down(self) -> bool:
        """The global statistics travel down with the global model (``average``)."""
        return self.width > 0 and not self.local

    def node_keys(self) -> dict[str, RowKind]:
        """The state entries held below the cloud (used only when the model has buffers)."""
        return {self.own_key: "client"} if self.mode == "local" else {}

    def fresh_rows(self, device: torch.device) -> torch.Tensor:
        """Every client's initial statistics ``[C, B]`` (writable)."""
        return self.init().to(device).expand(self.num_clients, -1).clone()

    def init_state(self, device: torch.device) -> State:
        """The initial entries: ``global_buffers [B]`` (where ``shared``) and, under ``local``,
        the clients' own ``[C, B]``; none without BatchNorm."""
        if not self.width:
            return {}
        state = {"global_buffers": self.init().to(device)} if self.shared else {}
        if self.local:
            state[self.own_key] = self.fresh_rows(device)
        return state

    def start(
        self, state: State, clients: torch.Tensor, sent: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Writable statistics ``[len(clients), B]`` that ``clients`` train from: their own
        (``local``) or the ``sent [n, B]`` rows (``average``); None without BatchNorm."""
        if not self.width:
            return None
        if self.local:
            return state[self.own_key][clients].clone()
        assert sent is not None
        return sent.clone()

    def received(self, state: State, task: Task) -> torch.Tensor | None:
        """:meth:`start` for the task's clients from its broadcast ``global_buffers``."""
        sent = task.broadcast.get("global_buffers")
        n = len(task.clients)
        return self.start(state, task.clients, None if sent is None else sent.expand(n, -1))

    def keep(self, state: State, clients: torch.Tensor, trained: torch.Tensor | None) -> None:
        """Under ``local``, store the clients' trained statistics."""
        if self.local and trained is not None:
            state[self.own_key][clients] = trained

    def sent(self, state: State) -> dict[str, torch.Tensor]:
        """What goes down beside the global model: ``global_buffers`` under ``average``."""
        return {"global_buffers": state["global_buffers"]} if self.travels_down else {}

    def own(self, state: State) -> torch.Tensor | None:
        """The clients' own statistics ``[C, B]`` (None where they keep none)."""
        return state.get(self.own_key)
