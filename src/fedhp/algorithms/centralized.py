"""Reference "algorithm": centralized training on the union of all clients' data.

The ceiling for the global model. No communication. The gradient budget matches the federated
methods: each of the ``local_steps`` steps per round draws ``batch_size × num_clients`` samples
uniformly (without replacement within a step) from the union of the clients' training sets, so one
round costs exactly as many per-sample gradient evaluations as ``num_clients`` clients taking
``local_steps`` minibatch steps of ``batch_size`` each (for the sFedHP tables: R·K = 100 steps of
20 × 20 = 400 samples). The union's empirical risk weights every training sample equally.

One round for one run and for a batch of runs (``fedhp sweep``'s lockstep): run s's model is row
s of one batched model ``[S, P]``, its pooled data and draws its own, its lr its row's step.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.buffers import BufferPolicy
from fedhp.algorithms.options import ALGORITHMS, AlgorithmOptions
from fedhp.algorithms.task import Task, Update
from fedhp.data.rows import slice_rows, take_rows
from fedhp.engine.context import RunContext
from fedhp.engine.run_rows import gathers, rows_key, stacked_data
from fedhp.models.base import loss_and_grad

if TYPE_CHECKING:
    from fedhp.config import RunConfig
    from fedhp.models.base import LossOptions


class Centralized(Algorithm):
    """One model trained by minibatch SGD on the pooled training data (global model only)."""

    options: CentralizedOptions

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        return {"global": p.clone(), **self.buffers.init_state(p.device)}

    def buffer_policy(self) -> BufferPolicy:  # one model: the pooled batches' statistics
        return BufferPolicy.of_run(self.ctx, "average")

    def plan(self, state: State, rnd: int) -> Task:
        """No one is sampled: the round's task holds no clients (the one model trains on the
        pooled data)."""
        return Task(torch.zeros(0, dtype=torch.int64, device=self.ctx.device))

    def train(self, state: State, task: Task) -> Update:
        """The round's ``local_steps`` SGD steps on the pooled data, in place on ``state``
        (``task`` holds no clients: the round is not federated; :meth:`run_round` calls it):
        :func:`fused_train`, with a batch's other runs of one :meth:`round_key` as one."""
        return self.ctx.together(fused_train, self.round_key(state), (self, state, task))

    def draw_indices(self) -> torch.Tensor:
        """The round's minibatches ``[local_steps, batch_size × num_clients]``: every step's
        indices into the pooled data drawn ahead on the host generator (the same draws in the
        same order as step by step) and moved to the device once: no host sync inside the loop."""
        ctx, opt = self.ctx, self.options
        n = int(ctx.fed.train.y.shape[0])
        batch = opt.batch_size * ctx.num_clients
        drawn = [
            torch.randperm(n, generator=ctx.generator)[:batch]
            if batch <= n
            else torch.randint(n, (batch,), generator=ctx.generator)
            for _ in range(opt.local_steps)
        ]
        return torch.stack(drawn).to(ctx.fed.train.x.device)

    def round_key(self, state: State) -> Hashable | None:
        """What runs must share to train their rounds as one (None: it trains alone): the steps,
        the pooled minibatch size, the model, its policy, the model's and the data's dtype, shape
        and device, the zero threshold. Gradient clipping, sparse features, BatchNorm statistics
        and a model whose one row may compute apart from several (``rows_independent`` false:
        a run alone is one row) train alone."""
        ctx, opt = self.ctx, self.options
        train, model = ctx.fed.train, ctx.model
        plain = opt.clip_grad_norm is None and not train.x.is_sparse and not self.buffers.width
        if not (plain and model.rows_independent):
            return None
        data = (tuple(train.x.shape[1:]), train.x.dtype, str(train.x.device))
        steps = (opt.local_steps, opt.batch_size * ctx.num_clients, ctx.policy, data)
        return rows_key("centralized", ctx, state["global"], steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        raise NotImplementedError("centralized is not federated: nothing to aggregate")

    def run_round(self, state: State, rnd: int) -> dict[str, float]:
        """The round: :meth:`train` on the pooled data (no clients, no aggregation)."""
        update = self.trained(state, self.plan(state, rnd))
        assert update.losses is not None
        return {"local_loss": float(update.losses) / self.options.local_steps}


def fused_train(items: Sequence[tuple[Centralized, State, Task]]) -> list[Update]:
    """The round of every run of ``items`` (one ``(algorithm, state, task)``, or a batch's with
    one :meth:`~Centralized.round_key`), run s's model row s; each run's state written and the
    steps' summed loss ``[1, 1]`` (float64) its update."""
    algos = [algo for algo, _, _ in items]
    lead = algos[0]
    x_all, y_all, drawn = _pooled(algos)
    params = torch.stack([state["global"] for _, state, _ in items])
    width = lead.buffers.width
    bufs = torch.stack([state["global_buffers"] for _, state, _ in items]) if width else None
    opts: LossOptions = {} if bufs is None else {"buffers": bufs}
    lrs = [algo.options.lr for algo in algos]
    loss_total = torch.zeros(len(items), dtype=torch.float64, device=params.device)
    for step in range(lead.options.local_steps):
        at = drawn[:, step]
        x, y = take_rows(x_all, at), y_all[at]
        for s, algo in enumerate(algos):  # each run's own counter of trained samples
            algo.ctx.model.count_trained(slice_rows(x, s, s + 1))
        loss, grad = loss_and_grad(lead.ctx.model, params.detach(), x, y, **opts)
        _descend(params, grad, lrs)
        loss_total += loss.double()
    alone = len(items) == 1  # (a batch's rows are copied out: each state its own storage)
    for s, (_, state, _) in enumerate(items):
        state["global"] = params[s] if alone else params[s].clone()
        if bufs is not None:
            state["global_buffers"] = bufs[s] if alone else bufs[s].clone()
    return [Update(losses=loss_total[s].reshape(1, 1)) for s in range(len(items))]


def _pooled(algos: Sequence[Centralized]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The runs' pooled training data (a batch's stacked once, :func:`stacked_data`) and every
    run's minibatches as rows of it, ``[S, local_steps, batch]``."""
    drawn = [algo.draw_indices() for algo in algos]  # each run's own generator
    if len(algos) == 1:
        train = algos[0].ctx.fed.train
        return train.x, train.y, drawn[0].unsqueeze(0)
    data = stacked_data([algo.ctx for algo in algos])
    starts = torch.tensor(data.starts, device=drawn[0].device).view(-1, 1, 1)
    return data.x, data.y, torch.stack(drawn) + starts


def _descend(params: torch.Tensor, grad: torch.Tensor, lrs: list[float]) -> None:
    """``w_s -= lr_s grad_s`` on every row, as alone: on the CPU each row's own ``add_`` with its
    step size; on a GPU one ``add_`` per block of neighbouring runs of one step size (a grid's
    seeds)."""
    blocks = (
        _same_lr_blocks(lrs) if gathers(params.device) else [(s, s + 1) for s in range(len(lrs))]
    )
    for a, b in blocks:
        params[a:b].add_(grad[a:b], alpha=-lrs[a])


def _same_lr_blocks(lrs: list[float]) -> list[tuple[int, int]]:
    """The blocks ``(a, b)`` of neighbouring runs with one step size."""
    starts = [s for s in range(len(lrs)) if s == 0 or lrs[s] != lrs[s - 1]]
    return list(zip(starts, [*starts[1:], len(lrs)], strict=True))


@ALGORITHMS.register("centralized")
class CentralizedOptions(AlgorithmOptions):
    """Centralized reference: SGD on the union of the clients' data (GM ceiling, no communication).

    Each round: ``local_steps`` steps of ``batch_size × num_clients`` samples from the union, the
    same sample-gradient budget as every client taking ``local_steps`` steps of ``batch_size``.
    One model: BatchNorm statistics are the pooled batches' (``buffers`` has no effect)."""

    supports_buffers = True
    federated = False

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``buffers``: one model, whose BatchNorm statistics are the pooled batches'."""
        return {
            "buffers": "centralized trains one model, so there are no clients' BatchNorm "
            "statistics to average or keep; drop it"
        }

    def build(self, ctx: RunContext) -> Algorithm:
        return Centralized(self, ctx)
