"""HierFAVG: one round (kappa1, kappa2, edge and cloud weights, sample weighting, truncation at the
zero threshold) against a plain per-edge, per-client loop, and its bytes per link."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms import hierfavg
from fedhp.algorithms.hierfavg import HierFAVGOptions
from fedhp.engine.context import RunContext
from fedhp.engine.faults import RoundFaults
from tests.algorithms.tiny import client_data, init_params, mlr_grad, tiny_context, tr, wire_bytes
from tests.policies import use_policy

COUNTS = (3, 6, 2, 6, 3)  # every count divides the batch of 6: each batch is the full data
EDGES = (3, 2)


def by_hand(
    ctx: RunContext, opt: HierFAVGOptions, w: torch.Tensor, eps: float, weighting: str
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """One round as a plain per-edge, per-client loop: the global model, and the models sent
    down to the clients, up by them and up by the edges."""
    n = [float(k) if weighting == "samples" else 1.0 for k in COUNTS]
    down, up, edge_up = [], [], []
    edge_models, edge_weights = [], []
    for e in range(len(EDGES)):
        members = ctx.topology.clients_of(e).tolist()
        w_e = tr(w, eps)  # cloud -> edge
        for _ in range(opt.kappa2):
            sent = []
            for c in members:
                p = tr(w_e, eps)  # edge -> client
                down.append(p)
                for _ in range(opt.kappa1):
                    p = p - opt.lr * mlr_grad(p, *client_data(ctx, c))
                sent.append(tr(p, eps))  # client -> edge
            up += sent
            w_e = sum(n[c] * s for c, s in zip(members, sent, strict=True)) / sum(
                n[c] for c in members
            )
        edge_up.append(tr(w_e, eps))  # edge -> cloud
        edge_models.append(tr(w_e, eps))
        # uniform: every edge counts once; samples: the training samples under the edge
        edge_weights.append(sum(n[c] for c in members) if weighting == "samples" else 1.0)
    expected = sum(a * m for a, m in zip(edge_weights, edge_models, strict=True)) / sum(
        edge_weights
    )
    assert isinstance(expected, torch.Tensor)
    return expected, down, up, edge_up


@pytest.mark.parametrize(
    ("weighting", "eps"), [("samples", 0.0), ("samples", 0.3), ("uniform", 0.3)]
)
def test_one_round_matches_hand(weighting: str, eps: float) -> None:
    ctx = tiny_context(EDGES, n_train=COUNTS, zero_threshold=eps, weighting=weighting)  # type: ignore[arg-type]
    opt = HierFAVGOptions(kappa1=2, kappa2=3, lr=0.2, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    w = state["global"].clone()
    expected, down, up, edge_up = by_hand(ctx, opt, w, eps, weighting)
    algo.run_round(state, 0)
    torch.testing.assert_close(state["global"], expected, atol=1e-6, rtol=1e-5)
    cur = ctx.ledger.current()
    assert cur["messages_client_edge_down"] == opt.kappa2 * 5 == len(down)
    assert cur["bytes_client_edge_down"] == sum(wire_bytes(m, eps) for m in down)
    assert cur["bytes_client_edge_up"] == sum(wire_bytes(m, eps) for m in up)
    assert cur["bytes_edge_cloud_down"] == 2 * wire_bytes(tr(w, eps), eps)
    assert cur["bytes_edge_cloud_up"] == sum(wire_bytes(m, eps) for m in edge_up)
    if eps > 0:  # the threshold really cut something, so truncation is being tested
        assert cur["bytes_edge_cloud_down"] < 2 * 4 * w.numel()


@pytest.mark.parametrize("mean", ["edge_mean", "cloud_mean"])
def test_a_planted_wrong_weight_in_either_mean_misses_the_hand_round(
    mean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round runs hierfavg.py's own means: one client (or edge) counted twice in either
    takes the round away from the hand loop's."""
    right = getattr(hierfavg, mean)

    def planted(uploads: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        wrong = weights.clone()
        wrong[0] *= 2
        return right(uploads, wrong)

    monkeypatch.setattr(hierfavg, mean, planted)
    ctx = tiny_context(EDGES, n_train=COUNTS, weighting="samples")
    opt = HierFAVGOptions(kappa1=2, kappa2=3, lr=0.2, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    expected, *_ = by_hand(ctx, opt, state["global"].clone(), 0.0, "samples")
    algo.run_round(state, 0)
    assert (state["global"] - expected).abs().max() > 1e-4


def test_straggler_is_billed_every_edge_model_it_received() -> None:
    """A straggler receives its edge's model in each of the kappa2 edge rounds and sends
    nothing; a dropped client receives nothing."""
    eps = 0.3
    ctx = tiny_context(EDGES, zero_threshold=eps)
    opt = HierFAVGOptions(kappa1=1, kappa2=3, lr=0.2, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    ctx.participation.round_faults = RoundFaults(
        dropped=torch.tensor([False, False, False, True, False]),
        straggler=torch.tensor([False, True, False, False, False]),
        edge_failed=torch.tensor([False, False]),
    )
    algo.run_round(state, 0)
    ctx.ledger.end_round()
    nodes = ctx.ledger.node_totals("client_edge")
    assert sorted(nodes) == [0, 1, 2, 4]  # client 3 dropped out
    assert nodes[1]["messages_down"] == opt.kappa2 and nodes[1]["messages_up"] == 0
    for mate in (0, 2):  # same edge: the same edge models, so the same bytes
        assert nodes[mate]["messages_up"] == opt.kappa2
        assert nodes[1]["bytes_down"] == nodes[mate]["bytes_down"]
        assert nodes[1]["nnz_down"] == nodes[mate]["nnz_down"]


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_edge_rounds_in_parts_are_the_whole_round_bit_for_bit(
    eps: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients trained in parts of two (the MLR's 15 parameters against a cache of 30
    floats; an edge's clients span parts) on the minibatches drawn ahead: the same models, the
    same bill, the same statistics as the whole round, exactly."""
    results = []
    for cache in (10**9, 30):
        ctx = tiny_context(edge_sizes=(3, 2, 2), zero_threshold=eps, weighting="samples")
        use_policy(ctx.model, cache_floats=cache)
        algo = HierFAVGOptions(kappa1=2, kappa2=3, batch_size=2, lr=0.3).build(ctx)
        state = algo.init_state(init_params())
        stats = [algo.run_round(state, rnd) for rnd in range(2)]
        results.append((state, stats, ctx.ledger.state_dict()))
    (whole, whole_stats, whole_bill), (parts, part_stats, part_bill) = results
    for key in whole:
        assert torch.equal(whole[key], parts[key]), key
    assert whole_stats == part_stats and whole_bill == part_bill
