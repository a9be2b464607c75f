"""FedAvg and FedProx: one round against a plain per-client loop (sample weighting, the proximal
term away from the global model, what the receiver gets at a zero threshold)."""

from __future__ import annotations

import torch

from fedhp.algorithms.fedavg import FedAvgOptions, FedProxOptions
from tests.algorithms.tiny import client_data, init_params, mlr_grad, tiny_context, tr, wire_bytes

COUNTS = (3, 6, 2, 6, 3)  # every count divides the batch of 6: each batch is the full data


def test_fedavg_weighting_samples_matches_hand() -> None:
    ctx = tiny_context(edge_sizes=(3, 2), n_train=COUNTS, weighting="samples")
    opt = FedAvgOptions(local_steps=2, lr=0.3, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    w = state["global"].clone()
    finals = []
    for c in range(5):
        p = w.clone()
        for _ in range(opt.local_steps):
            p = p - opt.lr * mlr_grad(p, *client_data(ctx, c))
        finals.append(p)
    algo.run_round(state, 0)
    n = torch.tensor(COUNTS, dtype=torch.float32)
    expected = (n.unsqueeze(1) * torch.stack(finals)).sum(0) / n.sum()
    torch.testing.assert_close(state["global"], expected, atol=1e-6, rtol=1e-5)
    uniform = torch.stack(finals).mean(0)  # the test can tell the two weightings apart
    assert not torch.allclose(uniform, expected, atol=1e-3)


def test_fedprox_mu_term_away_from_the_global_model() -> None:
    """Step 1 starts at w (prox term 0); step 2 starts away from it, where mu (p - w) counts."""
    ctx = tiny_context(edge_sizes=(3,))
    opt = FedProxOptions(mu=4.0, local_steps=3, lr=0.1, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    w = state["global"].clone()
    finals, plain = [], []
    for c in range(3):
        x, y = client_data(ctx, c)
        p, q = w.clone(), w.clone()
        for _ in range(opt.local_steps):
            p = p - opt.lr * (mlr_grad(p, x, y) + opt.mu * (p - w))
            q = q - opt.lr * mlr_grad(q, x, y)
        finals.append(p)
        plain.append(q)
    algo.run_round(state, 0)
    torch.testing.assert_close(state["global"], torch.stack(finals).mean(0), atol=1e-6, rtol=1e-5)
    assert (torch.stack(finals).mean(0) - torch.stack(plain).mean(0)).abs().max() > 1e-2


def test_fedavg_receivers_get_what_is_billed() -> None:
    """At a zero threshold the clients start from the truncated global model and the cloud
    averages the truncated uploads; the ledger bills exactly those messages."""
    eps = 0.4
    ctx = tiny_context(edge_sizes=(3,), zero_threshold=eps)
    opt = FedAvgOptions(local_steps=2, lr=0.3, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    w = state["global"].clone()
    sent_up = []
    for c in range(3):
        p = tr(w, eps)
        for _ in range(opt.local_steps):
            p = p - opt.lr * mlr_grad(p, *client_data(ctx, c))
        sent_up.append(tr(p, eps))
    algo.run_round(state, 0)
    torch.testing.assert_close(state["global"], torch.stack(sent_up).mean(0), atol=1e-6, rtol=1e-5)
    cur = ctx.ledger.current()
    assert cur["bytes_client_cloud_down"] == 3 * wire_bytes(tr(w, eps), eps) < 3 * 4 * 15
    assert cur["bytes_client_cloud_up"] == sum(wire_bytes(m, eps) for m in sent_up)
    assert cur["nnz_client_cloud_down"] == 3 * int((tr(w, eps) != 0).sum())


def test_the_aggregation_is_average_and_the_docs_show_its_code() -> None:
    """FedAvg's round ends in :func:`fedhp.algorithms.fedavg.average` (a pure function, bit for
    bit the new global model of an unstreamed round), and docs/architecture.md's "What a method
    file holds" shows that function's code verbatim, and the options class with its flags."""
    import inspect
    from pathlib import Path

    from fedhp.algorithms import fedavg

    ctx = tiny_context(edge_sizes=(3, 2), n_train=COUNTS, weighting="samples")
    algo = FedAvgOptions(local_steps=2, lr=0.3, batch_size=6).build(ctx)
    state = algo.init_state(init_params())
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    params = update.per_client["model"].clone()
    algo.aggregate(state, task, update)
    expected = fedavg.average(params, ctx.client_weights(task.clients))
    assert torch.equal(state["global"], expected)
    assert algo.combine is fedavg.average
    docs = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    section = docs.split("## What a method file holds")[1].split("\n## ")[0]
    code = "@foldable\n" + inspect.getsource(fedavg.average).split("\n", 1)[1]
    assert code in section
    assert inspect.getsource(fedavg.FedAvg.train) in section
    assert inspect.getsource(fedavg.FedProx.local_extra_grad) in section
    assert inspect.getsource(fedavg.FedAvgOptions) in section  # (its flags, in one place)
