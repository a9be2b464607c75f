"""Fed-HT, FedIter-HT, Distributed-IHT: H_τ, one round against a hand computation, the byte
ledger, and the noiseless recovery check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedhp.algorithms import ALGORITHMS
from fedhp.algorithms.fedht import hard_threshold
from fedhp.build import build_experiment
from fedhp.comm import CommLedger, encode_sparse
from fedhp.config import resolve_config
from fedhp.data.types import ClientData
from fedhp.engine.context import RunContext
from fedhp.engine.federation import Federation
from fedhp.engine.runner import run_experiment
from fedhp.engine.sampler import BatchSampler
from fedhp.errors import ConfigError
from fedhp.models.linear import LinRegOptions, SoftmaxOptions
from fedhp.topology import Topology

# ------------------------------------------------------------------------------------------ H_τ


def test_hard_threshold_keeps_the_largest_and_ties_go_to_the_lowest_index() -> None:
    x = torch.tensor([[0.5, -3.0, 2.0, -2.0, 2.0, 0.1]])
    assert hard_threshold(x, 2).tolist() == [[0.0, -3.0, 2.0, 0.0, 0.0, 0.0]]
    assert hard_threshold(x, 3).tolist() == [[0.0, -3.0, 2.0, -2.0, 0.0, 0.0]]
    assert hard_threshold(torch.ones(1, 5), 2).tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]
    assert torch.equal(hard_threshold(x, 6), x) and torch.equal(hard_threshold(x, 9), x)


def test_hard_threshold_per_class_column() -> None:
    # two columns of 4 (class-major layout): τ = 1 keeps one entry in EACH column
    x = torch.tensor([[1.0, 5.0, -2.0, 0.0, 0.25, -0.125, 0.5, 0.375]])
    assert hard_threshold(x, 1, groups=2).tolist() == [[0, 5.0, 0, 0, 0, 0, 0.5, 0]]
    assert hard_threshold(x, 1).tolist() == [[0, 5.0, 0, 0, 0, 0, 0, 0]]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.integers(-4, 4), min_size=1, max_size=24),
    tau=st.integers(1, 30),
)
def test_hard_threshold_matches_a_stable_sort(values: list[int], tau: int) -> None:
    x = torch.tensor([values], dtype=torch.float32)  # small integers: many ties
    order = np.argsort(-np.abs(np.array(values)), kind="stable")[:tau]
    expected = np.zeros(len(values))
    expected[order] = np.array(values)[order]
    assert hard_threshold(x, tau)[0].tolist() == expected.tolist()


def reference_threshold(params: torch.Tensor, tau: int, groups: int = 1) -> torch.Tensor:
    """H_τ as first written: the lowest-index tie rule on every block (no shortcut)."""
    blocks = params.reshape(*params.shape[:-1], groups, -1)
    size = blocks.abs()
    kth = size.kthvalue(size.shape[-1] - tau + 1, dim=-1, keepdim=True).values
    above, tied = size > kth, size == kth
    need = tau - above.sum(-1, keepdim=True)
    mask = above | (tied & (tied.cumsum(-1) <= need))
    return torch.where(mask, blocks, torch.zeros_like(blocks)).reshape(params.shape)


@pytest.mark.parametrize("groups", [1, 4])
def test_hard_threshold_shortcut_is_bit_identical(groups: int) -> None:
    """The ``size >= kth`` shortcut (taken when no block has ties straddling the τ-th place)
    gives the bits of the tie rule, for untied rows, tied rows, ±0, inf and NaN."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40 * groups, generator=g)
    x[1, :6] = 0.0  # ties at zero, and signed zeros
    x[1, 6:9] = -0.0
    x[2, 3], x[2, 7] = float("inf"), -float("inf")
    x[3, 5] = float("nan")
    untied, tied = x[[0, 2]], x.clone()
    tied[4, :] = torch.tensor([0.5, -0.5] * 20 * groups)  # every entry ties
    for data in (untied, x, tied):
        for tau in (1, 7, 25, 39):
            got, want = hard_threshold(data, tau, groups), reference_threshold(data, tau, groups)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (tau, data.shape)


# --------------------------------------------------------------------------- one round by hand

D, N_PER, TAU, GAMMA, K = 6, 5, 2, 0.02, 3


def linreg_context(num_clients: int = 3, seed: int = 0) -> RunContext:
    g = torch.Generator().manual_seed(seed)
    clients = []
    for _ in range(num_clients):
        z = torch.randn(N_PER, D, generator=g)
        y = z @ torch.randn(D, generator=g)
        empty = torch.zeros(0, D)
        clients.append(ClientData(z, y, z[:1], y[:1], empty, torch.zeros(0)))
    fed = Federation.from_clients(clients, 1)
    gen = torch.Generator().manual_seed(seed + 1)
    return RunContext(
        model=LinRegOptions().build((D,), 1),
        fed=fed,
        topology=Topology.build(num_clients, 1, None),
        ledger=CommLedger(),
        generator=gen,
        sampler=BatchSampler(fed.train.counts, gen),
    )


def grad(x: torch.Tensor, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇ (1/n)||y − Zx||² = −(2/n) Zᵀ(y − Zx)."""
    return -2.0 / len(y) * z.T @ (y - z @ x)


def h(x: torch.Tensor, tau: int = TAU) -> torch.Tensor:
    keep = np.argsort(-np.abs(x.numpy()), kind="stable")[:tau]
    out = torch.zeros_like(x)
    out[keep] = x[keep]
    return out


def by_hand(ctx: RunContext, method: str, start: torch.Tensor) -> torch.Tensor:
    """One round from ``start`` with full local gradients (batch = all of a client's samples)."""
    locals_ = []
    for c in range(ctx.num_clients):
        lo, hi = int(ctx.fed.train.offsets[c]), int(ctx.fed.train.offsets[c + 1])
        z, y = ctx.fed.train.x[lo:hi], ctx.fed.train.y[lo:hi]
        x = start.clone()
        for _ in range(1 if method == "diht" else K):
            x = x - GAMMA * grad(x, z, y)
            if method == "fediterht":
                x = h(x)
        locals_.append(x)
    return h(torch.stack(locals_).mean(0))


@pytest.mark.parametrize("method", ["diht", "fedht", "fediterht"])
def test_one_round_equals_the_hand_computation(method: str) -> None:
    ctx = linreg_context()
    opts = {"name": method, "lr": GAMMA, "tau": TAU, "batch_size": N_PER}
    if method != "diht":
        opts["local_steps"] = K
    algo = ALGORITHMS.build(opts, "algorithm").build(ctx)
    assert algo.extra_metrics({}) == {"gamma": GAMMA}
    state = algo.init_state(torch.randn(D))
    assert torch.equal(state["global"], torch.zeros(D))  # x₀ = 0
    for _ in range(2):  # the second round starts from a τ-sparse, non-zero model
        expected = by_hand(ctx, method, state["global"].clone())
        algo.run_round(state, 0)
        torch.testing.assert_close(state["global"], expected, rtol=1e-5, atol=1e-6)
        assert int((state["global"] != 0).sum()) <= TAU


def test_diht_is_fedht_with_one_step_not_fediterht() -> None:
    with pytest.raises(ConfigError, match="local_steps"):
        ALGORITHMS.build({"name": "diht", "local_steps": 3}, "algorithm")
    ctx_a, ctx_b = linreg_context(seed=4), linreg_context(seed=4)
    common = {"lr": GAMMA, "tau": TAU, "batch_size": N_PER}
    diht = ALGORITHMS.build({"name": "diht", **common}, "algorithm").build(ctx_a)
    fedht1 = ALGORITHMS.build({"name": "fedht", "local_steps": 1, **common}, "algorithm")
    a, b = diht.init_state(torch.zeros(D)), fedht1.build(ctx_b).init_state(torch.zeros(D))
    diht.run_round(a, 0)
    fedht1.build(ctx_b).run_round(b, 0)
    assert torch.equal(a["global"], b["global"])


# ------------------------------------------------------------------------------------- ledger


def wire_bytes(vec: torch.Tensor) -> int:
    return len(encode_sparse(vec)) - 1  # the real encoding, without its 1-byte tag


@pytest.mark.parametrize("method", ["fedht", "fediterht"])
def test_uplink_and_downlink_bytes(method: str) -> None:
    ctx = linreg_context(num_clients=4)
    d = D
    algo = ALGORITHMS.build(
        {"name": method, "lr": GAMMA, "tau": TAU, "batch_size": N_PER, "local_steps": K},
        "algorithm",
    ).build(ctx)
    state = algo.init_state(torch.zeros(d))
    algo.run_round(state, 0)  # round 0 broadcasts x₀ = 0
    ctx.ledger.end_round()
    task = algo.plan(state, 1)
    update = algo.train(state, task)
    sent = update.per_client["model"]
    algo.aggregate(state, task, update)
    now = ctx.ledger.current()
    if method == "fediterht":
        assert bool(((sent != 0).sum(1) <= TAU).all())  # τ-sparse client models
    else:
        assert bool(((sent != 0).sum(1) > TAU).all())  # dense local SGD
    assert now["bytes_client_cloud_up"] == sum(wire_bytes(v) for v in sent)
    down = sum(wire_bytes(v) for v in task.broadcast["global"].expand(4, -1))
    assert now["bytes_client_cloud_down"] == down
    assert 0 < int((task.broadcast["global"] != 0).sum()) <= TAU


def test_fediterht_uplink_bytes_are_the_tau_sparse_encoding_at_scale() -> None:
    """P = 1000, τ = 50: each client's message is τ values plus their positions, in the smaller
    sparse encoding: bitmap 1000/8 + 4τ = 325 bytes (index+values: 8τ = 400; dense: 4,000)."""
    exp = build_experiment(
        resolve_config(
            None,
            [
                "dataset.name=gaussian_sparse",
                "dataset.num_clients=4",
                "dataset.samples=30",
                "partition.name=natural",
                "federation.num_clients=4",
                "federation.num_edges=1",
                "model.name=linreg",
                "algorithm.name=fediterht",
                "algorithm.tau=50",
                "algorithm.lr=0.01",
                "progress=false",
            ],
        )
    )
    state = exp.algorithm.init_state(torch.zeros(exp.model.num_params))
    exp.algorithm.run_round(state, 0)
    round_ = exp.ctx.ledger.end_round()
    assert round_["bytes_client_cloud_up"] == 4 * min(4 * 1000, 1000 // 8 + 4 * 50, 8 * 50)
    assert round_["bytes_client_cloud_down"] == 0  # x₀ = 0: nothing to send


def test_softmax_thresholds_each_class_column() -> None:
    g = torch.Generator().manual_seed(0)
    clients = []
    for _ in range(2):
        z = torch.randn(8, 5, generator=g)
        y = torch.arange(8) % 3
        clients.append(ClientData(z, y, z[:2], y[:2], torch.zeros(0, 5), torch.zeros(0)))
    fed = Federation.from_clients(clients, 3)
    gen = torch.Generator().manual_seed(1)
    ctx = RunContext(
        model=SoftmaxOptions().build((5,), 3),
        fed=fed,
        topology=Topology.build(2, 1, None),
        ledger=CommLedger(),
        generator=gen,
        sampler=BatchSampler(fed.train.counts, gen),
    )
    for method in ("fedht", "fediterht"):
        algo = ALGORITHMS.build(
            {"name": method, "lr": 0.5, "tau": 2, "batch_size": 8}, "algorithm"
        ).build(ctx)
        state = algo.init_state(torch.zeros(15))
        algo.run_round(state, 0)
        per_column = (state["global"].view(3, 5) != 0).sum(1)
        assert per_column.tolist() == [2, 2, 2]


# ------------------------------------------------------------------------------ noiseless check


def noiseless(method: str, rounds: int, tau: int) -> dict[str, float]:
    """The spec's check: N=10, 100 samples each, d=1000, τ*=10, full gradients, γ=0.05, K=5."""
    overrides = [
        "dataset.name=gaussian_sparse",
        "partition.name=natural",
        "federation.num_clients=10",
        "federation.num_edges=1",
        "model.name=linreg",
        f"algorithm.name={method}",
        "algorithm.lr=0.05",
        f"algorithm.tau={tau}",
        "algorithm.batch_size=100",
        f"rounds={rounds}",
        f"eval_every={rounds}",
        "progress=false",
        "checkpoint_every=0",
        "max_loss=null",
    ]
    if method != "diht":
        overrides.append("algorithm.local_steps=5")
    exp = build_experiment(resolve_config(None, overrides))
    from fedhp.engine.runner import evaluate_state

    state = exp.algorithm.init_state(torch.zeros(exp.model.num_params))
    for rnd in range(rounds):
        exp.algorithm.run_round(state, rnd)
    row, _ = evaluate_state(exp, state)
    return row


@pytest.mark.parametrize("tau", [20, 40])
def test_noiseless_recovery(tau: int) -> None:
    torch.set_num_threads(1)  # tiny matrices: extra threads only contend
    fast = noiseless("fediterht", 100, tau)
    assert fast["support_recall"] == 1.0 and fast["dist_to_true"] <= 1e-6
    for method in ("diht", "fedht"):
        row = noiseless(method, 200, tau)
        assert row["support_recall"] == 1.0 and row["dist_to_true"] <= 1e-3


def test_run_writes_objective_and_recovery_columns(tmp_path) -> None:
    cfg = resolve_config(
        None,
        [
            "dataset.name=gaussian_sparse",
            "dataset.num_clients=3",
            "partition.name=natural",
            "federation.num_clients=3",
            "federation.num_edges=1",
            "model.name=linreg",
            "algorithm.name=fedht",
            "algorithm.tau=20",
            "algorithm.lr=0.01",
            "rounds=2",
            "eval_every=1",
            "progress=false",
        ],
    )
    run_experiment(build_experiment(cfg), tmp_path)
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    for col in ("objective", "support_precision", "support_recall", "dist_to_true"):
        assert col in header


def test_gamma_auto_is_one_sixth_of_the_inverse_largest_smoothness() -> None:
    ctx = linreg_context(num_clients=3, seed=2)
    algo = ALGORITHMS.build({"name": "fedht", "lr": "auto", "tau": TAU}, "algorithm").build(ctx)
    top = []
    for c in range(3):
        lo, hi = int(ctx.fed.train.offsets[c]), int(ctx.fed.train.offsets[c + 1])
        z = ctx.fed.train.x[lo:hi].double()
        top.append(float(torch.linalg.eigvalsh(z.T @ z / (hi - lo)).max()))
    assert algo.gamma == pytest.approx(1 / (6 * 2 * max(top)), rel=1e-3)  # linreg: l = 2 λmax
    with pytest.raises(ConfigError, match="lr"):
        ALGORITHMS.build({"name": "fedht", "lr": -1.0}, "algorithm")
