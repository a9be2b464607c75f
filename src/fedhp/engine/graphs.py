"""CUDA graphs: a run's repeated local steps captured once and replayed (``engine.cuda_graphs``).

A small federation on a GPU is bound by kernel launches, not arithmetic (docs/gpu.md: the
default run's round is 4,160 launches and 0.024 s of kernels in 0.070 s). A CUDA graph records
the kernels of a function once and replays all of them with one launch. :class:`StepGraphs`
does that for the functions handed to it (the engine's :func:`fedhp.engine.ops.graph_steps`:
a method's θ-like steps), one graph per key::

    out = graphs.run(key, fn, (theta, centre, x, y), writes=(0,))

is ``fn(theta, centre, x, y)`` — ``theta`` updated in place, ``out`` returned — computed by
copying the arguments into the graph's own (static) tensors, replaying, and copying the written
arguments and the result back out. What capture freezes, a captured ``fn`` must respect:

* it reads and writes its tensor arguments only (and tensors that live, unchanged in place,
  as long as the run: the model's constants); everything else it reads is frozen at capture;
* its Python-side decisions (shapes, branches, float hyperparameters) follow from ``key`` and
  the arguments' shapes, strides and dtypes (which :meth:`StepGraphs.run` adds to the key);
* no host synchronization (``.item()``, ``nonzero``, ``bool(tensor)``), no draw from a host
  generator and no Python side effect (counters are kept by the caller);
* it returns a tensor or None.

The first call of a key captures it (after warm-up calls on a side stream, as CUDA asks) and
checks the replay against an eager call on copies of the same arguments; a key whose capture
fails or whose replay differs runs eagerly from then on, with one warning line. A disabled
:class:`StepGraphs` (the default, and every CPU run) calls ``fn`` directly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from fedhp.errors import FedhpWarning

StepFn = Callable[..., torch.Tensor | None]

RTOL, ATOL = 1e-5, 1e-6
"""How close a replay must come to the eager call it replaces (a replay runs the captured
kernels on the same values: it is normally equal bit for bit)."""


class Replayer(Protocol):
    """Records a function once and replays what it recorded."""

    def capture(self, fn: Callable[[], torch.Tensor | None]) -> torch.Tensor | None:
        """Record ``fn()`` and return its result tensor (whose storage each replay rewrites)."""

    def replay(self) -> None:
        """Run what was recorded again, on the same tensors."""


class CudaGraph:
    """:class:`Replayer` on ``torch.cuda.CUDAGraph``: ``warmup`` calls on a side stream, then
    the capture (``torch.cuda.graph``)."""

    def __init__(self, warmup: int = 2) -> None:
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None

    def capture(self, fn: Callable[[], torch.Tensor | None]) -> torch.Tensor | None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            out = fn()
        return out

    def replay(self) -> None:
        assert self.graph is not None
        self.graph.replay()


class Rerun:
    """:class:`Replayer` without a device: a "replay" calls the recorded function again on the
    same tensors and writes its result into the first result's storage — what a CUDA graph's
    replay computes, so the static-tensor bookkeeping of :class:`StepGraphs` can be run and
    tested on the CPU."""

    def __init__(self) -> None:
        self.fn: Callable[[], torch.Tensor | None] | None = None
        self.out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor | None]) -> torch.Tensor | None:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        assert self.fn is not None
        out = self.fn()
        if self.out is not None and out is not None:
            self.out.copy_(out)


@dataclass
class _Graph:
    """One captured key: its replayer, the static arguments it reads and writes, its result."""

    replayer: Replayer
    static: tuple[torch.Tensor, ...]
    out: torch.Tensor | None


def _layout(t: torch.Tensor) -> tuple[object, ...]:
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


@dataclass
class StepGraphs:
    """A run's captured step functions, one per key (see the module docstring). ``enabled``:
    the steps of the run alone; ``stacked``: those of the stacked rounds it takes part in (a
    lockstep batch's, :meth:`stacked_only`); where off, :meth:`run` calls the function
    directly. ``make`` builds a key's replayer (:class:`CudaGraph`; :class:`Rerun` to exercise
    the bookkeeping on the CPU)."""

    enabled: bool = False
    stacked: bool = False
    make: Callable[[], Replayer] = CudaGraph
    graphs: dict[Hashable, _Graph] = field(default_factory=dict)
    eager: dict[Hashable, str] = field(default_factory=dict)  # key → why it runs eagerly
    replays: int = 0  # replays made (tests, logs)

    def stacked_only(self) -> None:
        """Steps of the run alone eager from now on (a lockstep batch: its model calls meet the
        other runs' and cannot be recorded alone); stacked rounds, which run in one thread
        while the others wait, keep their graphs."""
        self.enabled = False

    def run(
        self,
        key: Hashable,
        fn: StepFn,
        args: Sequence[torch.Tensor],
        writes: Sequence[int] = (),
        stacked: bool = False,
    ) -> torch.Tensor | None:
        """``fn(*args)``, replayed from its graph where on (``stacked``: a stacked round's
        steps); ``writes``: the positions of the arguments ``fn`` updates in place (copied back
        after a replay)."""
        if not (self.stacked if stacked else self.enabled):
            return fn(*args)
        full = (key, tuple(_layout(a) for a in args))
        if full in self.eager:
            return fn(*args)
        graph = self.graphs.get(full)
        if graph is None:
            return self._capture(full, fn, args, writes)
        return self._replay(graph, args, writes)

    def _replay(
        self, graph: _Graph, args: Sequence[torch.Tensor], writes: Sequence[int]
    ) -> torch.Tensor | None:
        for static, arg in zip(graph.static, args, strict=True):
            static.copy_(arg)
        graph.replayer.replay()
        self.replays += 1
        for i in writes:
            args[i].copy_(graph.static[i])
        return None if graph.out is None else graph.out.clone()

    def _capture(
        self, key: Hashable, fn: StepFn, args: Sequence[torch.Tensor], writes: Sequence[int]
    ) -> torch.Tensor | None:
        """Capture ``key``, then its first call: replayed and checked against an eager call on
        copies of ``args`` (eager from now on where the capture fails or the two differ)."""
        static = tuple(a.clone() for a in args)
        replayer = self.make()
        try:
            out = replayer.capture(lambda: fn(*static))
        except Exception as err:  # noqa: BLE001 - any failure means: run this key eagerly
            self._give_up(key, f"cannot be captured ({_first_line(err)})")
            return fn(*args)
        graph = _Graph(replayer, static, out)
        expected = [a.clone() for a in args]
        expected_out = fn(*expected)
        got_out = self._replay(graph, args, writes)
        worst = max(
            [_gap(args[i], expected[i]) for i in writes] + [_gap(got_out, expected_out)],
            default=0.0,
        )
        if worst > 0.0:
            for i in writes:  # the eager values, as if the graph had never been tried
                args[i].copy_(expected[i])
            self.replays -= 1
            self._give_up(key, f"replays {worst:.3g} away from its eager run")
            return expected_out
        self.graphs[key] = graph
        return got_out

    def _give_up(self, key: Hashable, why: str) -> None:
        """Run ``key`` eagerly from now on, and say why in one warning line."""
        self.eager[key] = why
        caller = key[0] if isinstance(key, tuple) and key else key
        name = caller[0] if isinstance(caller, tuple) and caller else caller
        warnings.warn(
            f"engine.cuda_graphs: {name!s:.80} {why}; it runs without a graph",
            FedhpWarning,
            stacklevel=4,
        )


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:160]


def _gap(got: torch.Tensor | None, expected: torch.Tensor | None) -> float:
    """0 where ``got`` is ``expected`` within :data:`RTOL`/:data:`ATOL` (NaNs equal), else the
    largest difference (inf for a shape or presence mismatch)."""
    if got is None or expected is None:
        return 0.0 if got is expected else float("inf")
    if got.shape != expected.shape:
        return float("inf")
    if torch.allclose(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True):
        return 0.0
    return float((got.double() - expected.double()).abs().nan_to_num(float("inf")).max())
