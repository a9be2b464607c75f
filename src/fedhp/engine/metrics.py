"""The evaluation rows of a run's state: the round's row (metrics.csv) and one row per client
(per_client.csv), from the global model, the personalized models, or a personalization that is
not a parameter vector."""

from __future__ import annotations

from typing import Protocol

import torch

from fedhp.engine.evaluate import ClientEval, density, evaluate_personal, evaluate_shared
from fedhp.engine.experiment import EngineExperiment
from fedhp.engine.objective import sparse_learning_metrics
from fedhp.engine.protocol import Row, State


class PersonalEval(Protocol):
    """Personalized models' evaluation done elsewhere (on Flower nodes), for all clients."""

    test: ClientEval
    train: ClientEval
    density: float


def spread_accuracies(
    result: ClientEval,
    kind: str,
    row: Row,
    clients: list[Row],
    edge_of: torch.Tensor,
    num_edges: int,
) -> None:
    """Write ``result``'s accuracy of each edge (``edge<e>_<kind>_acc`` in ``row``) and of each
    client (``<kind>_acc`` in its row of ``clients``)."""
    for e, acc in enumerate(result.per_group_accuracy(edge_of, num_edges).tolist()):
        row[f"edge{e}_{kind}_acc"] = acc
    for c, acc in enumerate(result.per_client_accuracy().tolist()):
        clients[c][f"{kind}_acc"] = acc


def evaluate_state(
    exp: EngineExperiment, state: State, personal_eval: PersonalEval | None = None
) -> tuple[Row, list[Row]]:
    """Metrics of the current state: the round row and per-client rows.

    ``personal_eval``: the personalized models' results computed elsewhere (Flower nodes)."""
    model, fed, topo = exp.model, exp.ctx.fed, exp.ctx.topology
    algo, eps = exp.algorithm, exp.ctx.zero_threshold
    split = fed.val if exp.cfg.eval_split == "val" else fed.test  # val: tuning only
    edge_of = topo.edge_of_client.cpu()
    row: Row = {}
    clients: list[Row] = [{"client": c, "edge": int(edge_of[c])} for c in range(fed.num_clients)]
    w = algo.global_model(state)
    if w is not None:
        bufs = algo.global_buffers(state)
        test = evaluate_shared(model, w, split, buffers=bufs)
        row.update(global_acc=test.accuracy, global_loss=test.loss)
        if exp.cfg.eval_train or model.reports_objective:
            train = evaluate_shared(model, w, fed.train, buffers=bufs)
            row["train_loss"] = train.loss
        if test.balanced_accuracy is not None:  # mean of per-class accuracies (FNR-FL, NIID-Bench)
            row["global_balanced_acc"] = test.balanced_accuracy
        row["density_global"] = density(w, eps)
        if model.reports_objective:
            weights = exp.ctx.client_weights(exp.ctx.all_clients)
            row.update(sparse_learning_metrics(model, w, train, weights, fed, eps))
        spread_accuracies(test, "global", row, clients, edge_of, topo.num_edges)
    custom = algo.personal_evaluation(state, split) if personal_eval is None else None
    if custom is not None:  # personalization that is not a parameter vector (pFedGP)
        row.update(personal_acc=custom.accuracy, personal_loss=custom.loss)
        if exp.cfg.eval_train:
            train_eval = algo.personal_evaluation(state, fed.train)
            assert train_eval is not None
            row["personal_train_loss"] = train_eval.loss
        spread_accuracies(custom, "personal", row, clients, edge_of, topo.num_edges)
    personal = algo.personal_models(state) if personal_eval is None and custom is None else None
    if personal is not None or personal_eval is not None:
        if personal_eval is not None:
            test, train_loss = personal_eval.test, personal_eval.train.loss
            personal_density = personal_eval.density
        else:
            assert personal is not None
            bufs = algo.personal_buffers(state)
            test = evaluate_personal(model, personal, split, buffers=bufs)
            train_loss = None
            if exp.cfg.eval_train:
                train_loss = evaluate_personal(model, personal, fed.train, buffers=bufs).loss
            personal_density = density(personal, eps)
        row.update(personal_acc=test.accuracy, personal_loss=test.loss)
        if exp.cfg.eval_train:
            row["personal_train_loss"] = train_loss
        row["density_personal"] = personal_density
        spread_accuracies(test, "personal", row, clients, edge_of, topo.num_edges)
    row.update(algo.extra_metrics(state))
    return row, clients
