"""Runs in lockstep: S runs of one batch train in S threads, and their work meets.

Each run keeps everything of its own — its config, data, generators, state, aggregation, ledger,
checkpoints, divergence guard — exactly as it would alone. Its work meets the other runs' at
three points, widest first: a whole round of the methods whose round takes a batch of runs
(``ctx.together(round_fn, key, item)`` → :meth:`Lockstep.together`: one ``round_fn(items)``),
its local SGD (``ctx.local_sgd``, through its ``ctx.batch``: the engine's run level,
:mod:`fedhp.engine.local_rows`, trains the calls of one key as one), and otherwise its model's
training kernels (the engine calls a model through :func:`fedhp.models.base.sgd_step` and
:func:`~fedhp.models.base.loss_and_grad`, which go to the model's ``meeting``, the run's
:class:`Seat`, where it has one). All three are ordinary calls through the run's seat: nothing
of a model or an algorithm is replaced at run time. When every live run of the batch has called
its model's ``sgd_step`` or ``loss_and_grad``, the calls that agree in shape and step size
become ONE call on the rows of all of them (``[S·C, P]``: run s's clients are a block of rows),
and each run gets its own rows back. Since the clients of a batched model share no
parameters, row c of the fused call is row c of the run's own call: no sum, mean or
normalization crosses a run's rows (``tests/sweep/test_lockstep.py`` checks bit equality).

On a GPU this turns S launches of every kernel into one; the runs' host work between the
kernels (minibatch draws, edge exchanges, the ledger) is still paid run by run. On a CPU whose
kernels already run at the core's peak it costs more than it saves: the fused rows leave the
cache and are copied in and out (measured: docs/benchmarks.md, "Sweeps"), so ``--batching auto``
runs CPU batches one run after another.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhp.engine.local_rows import LocalCall, Trained, local_sgd_key, stacked_local_sgd
from fedhp.models.base import BatchedModel

__all__ = ["Lockstep", "train_together"]

ColumnHook = Callable[[int, int], None]


@dataclass
class _Call:
    """One run's pending call: a model kernel, or the algorithm's round below the cloud."""

    run: int
    kind: str  # "sgd_step" | "loss_and_grad" | "round" | "local_sgd"
    model: BatchedModel | None
    original: Callable[..., Any] | None
    flat: torch.Tensor | None = None
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    lr: float | None = None
    before: ColumnHook | None = None
    opts: dict[str, Any] = field(default_factory=dict)
    item: Any = None  # "round": the run's item of its method's round (``original``)
    key: Hashable | None = None
    local: LocalCall | None = None  # "local_sgd": the run's call of ctx.local_sgd
    result: Any = None
    error: BaseException | None = None
    done: bool = False

    def group_key(self) -> tuple[Any, ...]:
        """Calls with equal keys can be fused: same kernel, shapes past the client dimension,
        dtypes, device, step size and the same optional inputs; or calls of one method's
        round function with equal keys."""
        if self.kind == "round":
            return ("round", self.original, self.key)
        if self.kind == "local_sgd":
            return ("local_sgd", self.key)
        tensors = [self.flat, self.x, self.y, *self.opts.values()]
        shapes = tuple(
            (tuple(t.shape[1:]), t.dtype, t.device) if isinstance(t, torch.Tensor) else repr(t)
            for t in tensors
        )
        return (self.kind, shapes, self.lr, self.before is None, tuple(self.opts))


class Lockstep:
    """The rendezvous of ``runs`` threads; each run's :meth:`seat` brings its calls here.

    Exactly one run thread runs at a time: it holds the *turn* until it must wait (its model
    call needs its partners, or it has ended), then hands the turn to the next run that can go
    on, in order (runs whose calls are done, or not started). Only that thread is woken, so the
    threads never compete for the interpreter, and no two runs' torch calls overlap (measured:
    overlapping calls from two threads changed results in the last bits). When every live run
    waits, the last to arrive runs the pending calls — fused — and goes on; the others follow
    in turn.
    """

    def __init__(self, runs: int) -> None:
        self._lock = threading.Lock()  # guards the fields below (held briefly)
        self._wake = [threading.Event() for _ in range(runs)]
        self._ready: deque[int] = deque(range(runs))  # runs that may go on, in order
        self._live = runs
        self._pending: dict[int, _Call] = {}
        # The thread running the pending calls (in :meth:`_execute`), None between: a model
        # call made while they run (a stacked round's or a batch local SGD's own steps) runs
        # directly, not through the rendezvous again.
        self._executing: threading.Thread | None = None
        self.fused_calls = 0  # fused kernel calls and stacked rounds made (log and tests)
        self.stacked_rounds = 0  # of which rounds of several runs trained as one
        self.single_calls = 0  # calls that ran alone (no partner of the same shape)
        self.alone: dict[str, int] = {}  # rounds that met no run, by the method's class
        self._met = [0] * runs  # each run's rounds and local SGD calls trained with others

    def seat(self, run: int) -> Seat:
        """Run ``run``'s place in the batch: set as its ``ctx.batch`` (where its rounds and its
        local SGD meet the other runs') and its model's ``meeting`` (its model calls)."""
        return Seat(self, run)

    def begin(self) -> None:
        """Give the first turn (call once, after every run's thread has started)."""
        with self._lock:
            self._hand_on()

    def wait_turn(self, run: int) -> None:
        """Block run ``run``'s thread until it has the turn (at its start)."""
        self._wake[run].wait()
        self._wake[run].clear()

    def finish(self, run: int) -> None:
        """Run ``run`` has ended (or failed): the others no longer wait for it; the turn
        goes on."""
        with self._lock:
            self._live -= 1
            self._pending.pop(run, None)
            if self._pending and len(self._pending) >= self._live:
                self._ready.extend(self._execute())
            self._hand_on()

    def _hand_on(self) -> None:
        """Wake the next run that may go on (with the lock held)."""
        if self._ready:
            self._wake[self._ready.popleft()].set()

    def model_call(self, call: _Call) -> Any:
        """Run ``call`` (a run's model kernel) with the other runs' of the same shapes, as one."""
        if self._executing is threading.current_thread():
            _alone(call)  # (made by a stacked round or a batch's local SGD as it runs)
            return call.result
        return self._wait(call)

    def train(self, run: int, algorithm: Any, state: Any, task: Any) -> Any:
        """Run ``run``'s round below the cloud, ``algorithm.train(state, task)``: where its
        round (:meth:`together`) or its local SGD (:meth:`local_sgd`) meets the other runs',
        they train as one; a round that met no one is counted as trained alone."""
        met = self._met[run]
        update = algorithm.train(state, task)
        if self._met[run] == met and self._executing is not threading.current_thread():
            name = type(algorithm).__name__
            self.alone[name] = self.alone.get(name, 0) + 1
        return update

    def together(self, run: int, round_fn: Callable[..., Any], key: Hashable, item: Any) -> Any:
        """Run ``run``'s call of its method's round with the other runs' calls of the same
        ``round_fn`` and ``key``, as ONE ``round_fn(items)``; its own result."""
        if self._executing is threading.current_thread():
            return round_fn([item])[0]
        return self._wait(_Call(run, "round", None, round_fn, key=key, item=item))

    def local_sgd(self, run: int, local: LocalCall) -> Trained:
        """Run ``run``'s local SGD with the other runs' of the same key, as one."""
        if self._executing is threading.current_thread():
            return _local_alone(local)
        call = _Call(run, "local_sgd", None, None, local=local, key=local_sgd_key(local))
        result: Trained = self._wait(call)
        return result

    def _wait(self, call: _Call) -> Any:
        """Register ``call`` (its thread has the turn); run every pending call if it was the
        last awaited, else hand the turn on and sleep until the call is done and the turn
        comes back."""
        with self._lock:
            self._pending[call.run] = call
            last = len(self._pending) >= self._live
            if last:
                done = self._execute()
                self._ready.extend(r for r in done if r != call.run)
            else:
                self._hand_on()
        if not last:
            self.wait_turn(call.run)
        assert call.done
        if call.error is not None:
            raise call.error
        return call.result

    def _execute(self) -> list[int]:
        """Run every pending call, fused by group (with the lock held, by the thread that has
        the turn); the runs whose calls ran, in order."""
        groups: dict[tuple[Any, ...], list[_Call]] = {}
        for call in sorted(self._pending.values(), key=lambda c: c.run):
            key = (call.run,) if _row_alone(call) else call.group_key()
            groups.setdefault(key, []).append(call)
        runs = sorted(self._pending)
        self._pending.clear()
        self._executing = threading.current_thread()
        try:
            for group in groups.values():
                try:
                    if len(group) == 1:
                        self.single_calls += 1
                        _alone(group[0])
                    else:
                        self.fused_calls += 1
                        if group[0].kind in ("round", "local_sgd"):
                            self.stacked_rounds += 1
                            for call in group:
                                self._met[call.run] += 1
                        _fused(group)
                except BaseException as err:  # each run raises it in its own thread
                    for call in group:
                        call.error = err
                for call in group:
                    call.done = True
        finally:
            self._executing = None
        return runs


def _row_alone(call: _Call) -> bool:
    """A model call of ONE row on a model whose rows are not independent (``torch.func.vmap``
    over a convolution): among other rows it would run other kernels than alone, so it runs
    alone."""
    model = call.model
    return (
        call.kind != "round"
        and model is not None
        and not model.rows_independent
        and (_rows(call.flat).shape[0] == 1)
    )


@dataclass
class Seat:
    """A run's place in a :class:`Lockstep` batch: its ``ctx.batch``
    (:class:`~fedhp.engine.context.RunBatch`) and its model's ``meeting``
    (:class:`~fedhp.models.base.KernelMeeting`)."""

    lockstep: Lockstep
    run: int

    def local_sgd(self, call: LocalCall) -> Trained:
        return self.lockstep.local_sgd(self.run, call)

    def train(self, algorithm: Any, state: Any, task: Any) -> Any:
        return self.lockstep.train(self.run, algorithm, state, task)

    def together(self, round_fn: Callable[..., Any], key: Hashable, item: Any) -> Any:
        return self.lockstep.together(self.run, round_fn, key, item)

    def meet(self, model: BatchedModel, kernel: str, *args: Any, **opts: Any) -> Any:
        """``model``'s ``kernel`` call with the other runs' of the same shapes, as one
        (:class:`~fedhp.models.base.KernelMeeting`)."""
        if kernel == "sgd_step":
            flat, x, y, lr, before = args
            call = _Call(self.run, kernel, model, model.sgd_step, flat, x, y, lr, before)
        else:
            flat, x, y = args
            opts = {k: v for k, v in opts.items() if v is not None}
            call = _Call(self.run, kernel, model, model.loss_and_grad, flat, x, y, opts=opts)
        return self.lockstep.model_call(call)


def _local_alone(local: LocalCall) -> Trained:
    """A run's local SGD as it runs outside a batch."""
    ctx = local.ctx
    return ctx.local_sgd(
        local.params, local.clients, local.work, local.extra_grad, drawn=local.drawn, alone=True
    )


def _alone(call: _Call) -> None:
    if call.kind == "local_sgd":
        assert call.local is not None
        call.result = _local_alone(call.local)
        return
    assert call.original is not None
    if call.kind == "round":
        call.result = call.original([call.item])[0]
    elif call.kind == "sgd_step":
        call.result = call.original(call.flat, call.x, call.y, call.lr, call.before)
    else:
        call.result = call.original(call.flat, call.x, call.y, **call.opts)


def _fused(group: list[_Call]) -> None:
    """One kernel call on the rows of every call of ``group``; each gets its rows back (or one
    call of their method's round function on all their items)."""
    lead = group[0]
    if lead.kind == "local_sgd":
        results = stacked_local_sgd([_local(c) for c in group])
        for call, trained in zip(group, results, strict=True):
            call.result = trained
        return
    assert lead.original is not None
    if lead.kind == "round":
        for call, result in zip(group, lead.original([c.item for c in group]), strict=True):
            call.result = result
        return
    flats = [_rows(c.flat) for c in group]
    bounds = [sum(f.shape[0] for f in flats[:i]) for i in range(len(flats) + 1)]
    rows = [slice(bounds[i], bounds[i + 1]) for i in range(len(group))]
    flat = torch.cat(flats)
    x = torch.cat([_rows(c.x) for c in group])
    y = torch.cat([_rows(c.y) for c in group])
    if lead.kind == "sgd_step":
        before = None if lead.before is None else _fused_hook(group, flat, rows)
        loss = lead.original(flat, x, y, lead.lr, before)
        for own, part, call in zip(flats, rows, group, strict=True):
            own.copy_(flat[part])
            call.result = loss[part]
        return
    opts = {k: torch.cat([c.opts[k] for c in group]) for k in lead.opts}
    loss, grad = lead.original(flat, x, y, **opts)
    for call, part in zip(group, rows, strict=True):
        if "buffers" in opts:  # (updated in place by the model: back into each run's rows)
            call.opts["buffers"].copy_(opts["buffers"][part])
        call.result = (loss[part], grad[part])


def _local(call: _Call) -> LocalCall:
    assert call.local is not None
    return call.local


def _rows(t: torch.Tensor | None) -> torch.Tensor:
    """A kernel call's tensor (present on every model call)."""
    assert t is not None
    return t


def _fused_hook(group: list[_Call], flat: torch.Tensor, rows: list[slice]) -> ColumnHook:
    """The fused step's column hook: each run's own hook on its own (not yet stepped) rows,
    then those columns into the fused rows, before the model steps them."""

    def before(lo: int, hi: int) -> None:
        for call, part in zip(group, rows, strict=True):
            assert call.before is not None
            call.before(lo, hi)
            flat[part, lo:hi].copy_(_rows(call.flat)[:, lo:hi])

    return before


def train_together(
    items: Sequence[tuple[Any, Any, Any]],
    around: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None,
) -> tuple[list[Any], Lockstep]:
    """Each ``(algorithm, state, task)``'s round below the cloud (``algorithm.trained``) in one
    lockstep batch, a thread each as a sweep's batch runs them (their rounds and local SGD
    meet; their model calls run as each run's own): the updates, and the batch (its counts).
    ``around(slot)``: a context each run's round runs in (a benchmark's launch counter)."""
    step = Lockstep(len(items))
    updates: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    torch_threads = torch.get_num_threads()

    def work(slot: int, algorithm: Any, state: Any, task: Any) -> None:
        torch.set_num_threads(torch_threads)  # (a new thread's OpenMP default otherwise)
        step.wait_turn(slot)
        try:
            with around(slot) if around is not None else contextlib.nullcontext():
                updates[slot] = algorithm.trained(state, task)
        except BaseException as err:  # (raised below, in the caller's thread)
            errors.append(err)
        finally:
            step.finish(slot)

    threads = []
    for slot, (algorithm, state, task) in enumerate(items):
        algorithm.ctx.batch = step.seat(slot)
        threads.append(threading.Thread(target=work, args=(slot, algorithm, state, task)))
    try:
        for thread in threads:
            thread.start()
        step.begin()
        for thread in threads:
            thread.join()
    finally:
        for algorithm, _, _ in items:
            algorithm.ctx.batch = None
    if errors:
        raise errors[0]
    return updates, step
