"""Steps replayed as CUDA graphs (``engine.cuda_graphs``, src/fedhp/engine/graphs.py), checked on
the CPU with :class:`~fedhp.engine.graphs.Rerun`: a replay that calls the recorded function
again on the recorded (static) tensors, which is what a CUDA graph's replay computes. What only a
device can show — the capture itself and its speed — is in tests/engine/test_gpu.py and the GPU
check (``benchmarks/gpu_check.py --issue 40``, ``run-graphs``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedhp.algorithms import ALGORITHMS
from fedhp.build import build_experiment
from fedhp.config import cuda_graphs_unread, resolve_config
from fedhp.engine.graphs import Rerun, StepGraphs
from fedhp.engine.runner import run_experiment
from fedhp.errors import ConfigError, FedhpWarning


def axpy_sum(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x += 2 y`` in place; returns the row sums of the new ``x``."""
    x.add_(y, alpha=2.0)
    return x.sum(1)


class Recorder:
    """A :class:`Rerun` factory that keeps every replayer it makes (captures counted)."""

    def __init__(self) -> None:
        self.made: list[Rerun] = []

    def __call__(self) -> Rerun:
        self.made.append(Rerun())
        return self.made[-1]


def test_a_disabled_graph_set_calls_the_function_on_the_arguments_themselves() -> None:
    seen: list[torch.Tensor] = []
    x = torch.ones(2, 3)
    out = StepGraphs().run("k", lambda t: seen.append(t) or t.sum(), (x,))
    assert seen[0] is x and out == 6


def test_replays_compute_what_eager_calls_compute_and_capture_once_per_shape() -> None:
    make = Recorder()
    graphs = StepGraphs(enabled=True, make=make)
    gen = torch.Generator().manual_seed(0)
    for shape in [(3, 4), (3, 4), (3, 4), (5, 4), (5, 4)]:
        x, y = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
        want_x = x.clone()
        want = axpy_sum(want_x, y)
        got = graphs.run("axpy", axpy_sum, (x, y), writes=(0,))
        assert got is not None
        assert torch.equal(x, want_x) and torch.equal(got, want)
    assert len(make.made) == 2  # one capture per shape
    assert graphs.replays == 5 and not graphs.eager


def test_a_replayed_result_is_the_callers_own_tensor() -> None:
    """The graph's result lives in its static storage, rewritten by the next replay: each call
    must hand back a tensor of its own."""
    graphs = StepGraphs(enabled=True, make=Rerun)
    x = torch.zeros(2, 2)
    first = graphs.run("axpy", axpy_sum, (x, torch.ones(2, 2)), writes=(0,))
    second = graphs.run("axpy", axpy_sum, (x, torch.ones(2, 2)), writes=(0,))
    assert first is not None and second is not None
    assert first.tolist() == [4.0, 4.0] and second.tolist() == [8.0, 8.0]


def test_an_argument_not_declared_written_is_left_as_it_was() -> None:
    """Without ``writes`` the caller's tensors are not touched: the graph works on copies."""
    graphs = StepGraphs(enabled=True, make=Rerun)
    x = torch.zeros(2, 2)
    graphs.run("axpy", axpy_sum, (x, torch.ones(2, 2)))
    assert torch.equal(x, torch.zeros(2, 2))


def test_a_function_whose_replay_differs_runs_eagerly_with_one_warning() -> None:
    """A function that breaks the contract — here it reads a Python counter, which a capture
    would freeze — is caught by the first call's check against an eager call: the call returns
    the eager values and the key runs eagerly from then on."""
    calls = {"n": 0}

    def drifting(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        x.add_(float(calls["n"]))
        return x.sum(1)

    graphs = StepGraphs(enabled=True, make=Rerun)
    x = torch.zeros(1, 2)
    with pytest.warns(FedhpWarning, match=r"engine.cuda_graphs: drift .*runs without a graph"):
        graphs.run(("drift", 1), drifting, (x,), writes=(0,))
    # capture (1), eager check (2), replay (3): the eager check's value is kept
    assert x.tolist() == [[2.0, 2.0]] and len(graphs.eager) == 1 and not graphs.graphs
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        out = graphs.run(("drift", 1), drifting, (x,), writes=(0,))
    assert x.tolist() == [[6.0, 6.0]] and out is not None and out.tolist() == [12.0]


def test_a_capture_that_fails_runs_eagerly_with_one_warning() -> None:
    class Refuses(Rerun):
        def capture(self, fn: Any) -> Any:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")

    graphs = StepGraphs(enabled=True, make=Refuses)
    x = torch.zeros(1, 2)
    with pytest.warns(FedhpWarning, match="cannot be captured .operation not permitted"):
        out = graphs.run("k", axpy_sum, (x, torch.ones(1, 2)), writes=(0,))
    assert x.tolist() == [[2.0, 2.0]] and out is not None and out.tolist() == [4.0]
    assert graphs.replays == 0 and "more" not in next(iter(graphs.eager.values()))


SFEDHP = [
    "progress=false",
    "threads=1",
    "rounds=3",
    "eval_every=1",
    "checkpoint_every=0",
    "subsample.train=2000",
    "subsample.test=400",
    "partition.train_per_class=40",
    "partition.test_per_class=20",
    "algorithm.R=3",
    "algorithm.K=2",
]


def sfedhp_run(out: Path, graphs: StepGraphs | None, extra: list[str]) -> StepGraphs:
    exp = build_experiment(resolve_config(None, [*SFEDHP, *extra]))
    if graphs is not None:
        exp.ctx.graphs = graphs
    run_experiment(exp, out)
    return exp.ctx.graphs


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="default"),
        pytest.param(["algorithm.lam=10", "federation.edge_sizes=[2,3,7,8]"], id="uneven-edges"),
        pytest.param(["federation.edges_per_round=2", "algorithm.theta_init=warm"], id="sampled"),
        pytest.param(["algorithm.name=pfedme"], id="pfedme"),
        pytest.param(
            ["algorithm.name=pfedme", "engine.clients_per_chunk=3", "algorithm.theta_init=reset"],
            id="pfedme-parts",
        ),
    ],
)
def test_theta_steps_replayed_write_the_bytes_of_the_eager_run(
    tmp_path: Path, extra: list[str]
) -> None:
    """sFedHP's and pFedMe's θ steps through the graph bookkeeping (every argument copied into
    the static tensors, θ and the loss copied back) write the metrics.csv of the eager run, byte
    for byte; one capture per layout of a part, the rest replays."""
    make = Recorder()
    sfedhp_run(tmp_path / "eager", None, extra)
    graphs = sfedhp_run(tmp_path / "graphs", StepGraphs(enabled=True, make=make), extra)
    assert (tmp_path / "graphs" / "metrics.csv").read_bytes() == (
        tmp_path / "eager" / "metrics.csv"
    ).read_bytes()
    assert not graphs.eager and 1 <= len(make.made) <= 3
    assert graphs.replays >= 9  # 3 rounds × R = 3 local rounds, one part or more each
    if "engine.clients_per_chunk=3" in extra:  # 20 clients: parts of 3 and one of 2
        assert len(make.made) == 2 and graphs.replays == 9 * 7


SYNCS = {
    "aten._local_scalar_dense.default",  # .item(), float(t), bool(t)
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.is_nonzero.default",
}
"""Operations that read a device value on the host (a synchronization, not capturable)."""


class Ops(TorchDispatchMode):
    """The operations dispatched inside the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_captured_theta_steps_read_nothing_back_on_the_host(tmp_path: Path) -> None:
    """What a graph records of sFedHP's θ steps: kernels only, no host synchronization (which a
    CUDA capture refuses) — checked on the function the engine captures, in a real round."""
    recorded: list[list[str]] = []

    class Watching(Rerun):
        def capture(self, fn: Any) -> Any:
            with Ops() as ops:
                out = super().capture(fn)
            recorded.append(ops.names)
            return out

    sfedhp_run(tmp_path, StepGraphs(enabled=True, make=Watching), ["rounds=1"])
    assert recorded and all(len(names) > 10 for names in recorded)
    assert not SYNCS & {name for names in recorded for name in names}


def test_the_option_is_refused_where_nothing_would_read_it() -> None:
    """``engine.cuda_graphs=true`` on the CPU, under bf16 or for a method without captured steps
    is a one-line error naming the option and the way out."""
    with pytest.raises(ConfigError, match="engine.cuda_graphs .*set device=cuda, or drop it"):
        resolve_config(None, ["engine.cuda_graphs=true"])

    def why(overrides: list[str]) -> str | None:
        cfg = resolve_config(None, ["device=cuda", *overrides], refuse_unread=False)
        return cuda_graphs_unread(cfg, ALGORITHMS.build(cfg.algorithm, "algorithm").graph_steps())

    assert why([]) is None
    assert why(["algorithm.gamma1=0.001", "algorithm.gamma2=0.001"]) is not None
    assert why(["algorithm.name=pfedme"]) is None
    assert why(["algorithm.name=pfedme", "algorithm.l2=0.01"]) is not None
    assert "fedavg with these options" in str(why(["algorithm.name=fedavg"]))
    assert "bf16" in str(why(["precision=bf16"]))
