"""The plumbing of a flat client–cloud round, shared by FedAvg's family (FedAvg, FedProx, MOON,
FedNova, Ditto): the method writes its math (``train``: the clients' local work from the
received global model), this base does the rest.

* ``plan`` (cloud): the sampled clients receive the global model (and, with BatchNorm under
  ``buffers=average``, its running statistics), billed as one broadcast;
* ``aggregate`` (cloud): each client's uploaded model (``start`` + its momentum under
  ``client_momentum``; forged where malicious) is billed and folded into the sample- or
  uniformly-weighted mean part by part (:class:`UploadFold`, streamed rounds), or aggregated by
  the cloud's rule (robust, DP) over the whole round;
* FedLPS's device model when asked (``capabilities``, :class:`DenseDeviceCost`).
"""

from __future__ import annotations

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.device_cost import DenseDeviceCost
from fedhp.algorithms.options import LocalWorkOptions
from fedhp.algorithms.task import Task, Update, UploadFold
from fedhp.engine.uplink import CENTRE_KEYS, MOMENTUM_KEY


class FlatRounds(DenseDeviceCost):
    """A flat round whose clients upload ``params`` (and ``buffers``), averaged into
    ``global`` (and ``global_buffers``) by the cloud."""

    options: LocalWorkOptions
    folds_uploads = True
    client_outputs = ("params",)
    client_buffer_outputs = ("buffers",)

    def init_state(self, init_params: torch.Tensor) -> State:
        return {
            "global": init_params.clone(),
            **self.buffers.init_state(init_params.device),
            **self.device_cost_state(),
            **self.uplink_state(init_params),
        }

    def round_samples(self, clients: torch.Tensor) -> torch.Tensor:
        """Samples of the local work: all of a client's data per epoch, or ``batch_size`` per
        step (:meth:`~fedhp.algorithms.options.LocalWorkOptions.sample_counts`)."""
        return self.options.sample_counts(self.ctx.fed.train.counts[clients])

    def plan(self, state: State, rnd: int) -> Task:
        self.refresh_device_cost(state, rnd)
        return self.plan_broadcast_global(state)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        fold = self.open_fold(state, task)
        self.fold_in(state, fold, task, update)
        return self.close_fold(state, task, fold)

    def open_fold(self, state: State, task: Task) -> UploadFold:
        """The round's means, or the cloud's uplink (robust rule, DP) over the uploaded models
        (a centred rule from its previous aggregate, kept in the state)."""
        ctx = self.ctx
        start = {"global": task.broadcast["global"]}
        weights = ctx.client_weights(task.clients)
        centre = state.get(CENTRE_KEYS["cloud"])
        centres = {"global": centre} if centre is not None else None
        return UploadFold(weights, ctx.cloud_uplink, start, ctx.num_clients, centres)

    def fold_in(self, state: State, fold: UploadFold, part: Task, update: Update) -> None:
        """Bill the part's uploads (with client momentum: ``start`` + the clients' momenta) and
        add them to the sample- or uniformly-weighted means."""
        start = part.broadcast["global"]
        up = self.send_up(update, part.clients, start, momenta=state.get(MOMENTUM_KEY))
        fold.add({"global": up["model"], "global_buffers": up.get("buffers")}, update)

    def close_fold(self, state: State, task: Task, fold: UploadFold) -> dict[str, float]:
        state.update(fold.result())
        stats = self.local_work_stats(task, fold.update())
        stats.update(self.account_device_cost(state, task.clients))
        return stats
