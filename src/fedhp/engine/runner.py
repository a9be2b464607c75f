"""The round loop: run an algorithm, evaluate, account communication, write results."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from fedhp.algorithms.base import State
from fedhp.config import config_to_dict
from fedhp.engine.build import MODEL_SEED_OFFSET, Experiment
from fedhp.engine.evaluate import density, evaluate_personal, evaluate_shared
from fedhp.errors import DivergenceError
from fedhp.reporting import MetricsWriter, plot_run, write_json_atomic, write_yaml_atomic

Row = dict[str, Any]


def evaluate_state(exp: Experiment, state: State) -> tuple[Row, list[Row]]:
    """Metrics of the current state: the round row and per-client rows."""
    model, fed, topo = exp.model, exp.ctx.fed, exp.ctx.topology
    algo, eps = exp.algorithm, exp.ctx.zero_threshold
    edge_of = topo.edge_of_client.cpu()
    row: Row = {}
    clients: list[Row] = [{"client": c, "edge": int(edge_of[c])} for c in range(fed.num_clients)]
    w = algo.global_model(state)
    if w is not None:
        test = evaluate_shared(model, w, fed.test)
        train = evaluate_shared(model, w, fed.train)
        row.update(global_acc=test.accuracy, global_loss=test.loss, train_loss=train.loss)
        row["density_global"] = density(w, eps)
        for e, acc in enumerate(test.per_group_accuracy(edge_of, topo.num_edges).tolist()):
            row[f"edge{e}_global_acc"] = acc
        for c, acc in enumerate(test.per_client_accuracy().tolist()):
            clients[c]["global_acc"] = acc
    personal = algo.personal_models(state)
    if personal is not None:
        test = evaluate_personal(model, personal, fed.test)
        train = evaluate_personal(model, personal, fed.train)
        row.update(
            personal_acc=test.accuracy, personal_loss=test.loss, personal_train_loss=train.loss
        )
        row["density_personal"] = density(personal, eps)
        for e, acc in enumerate(test.per_group_accuracy(edge_of, topo.num_edges).tolist()):
            row[f"edge{e}_personal_acc"] = acc
        for c, acc in enumerate(test.per_client_accuracy().tolist()):
            clients[c]["personal_acc"] = acc
    row.update(algo.extra_metrics(state))
    return row, clients


def check_finite(exp: Experiment, state: State, rnd: int, stats: Row) -> None:
    """Stop with a one-line :class:`DivergenceError` on NaN/Inf parameters or loss."""
    bad = [
        k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())
    ]
    loss = stats.get("local_loss")
    if bad or (isinstance(loss, float) and not math.isfinite(loss)):
        what = f"non-finite values in {', '.join(bad)}" if bad else "non-finite training loss"
        name = exp.cfg.algorithm.get("name")
        raise DivergenceError(
            f"round {rnd + 1}: {name} diverged ({what}); likely cause: learning rate or "
            "regularization (lambda*lr) too large — lower algorithm.lr or the penalty weights"
        )


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summarize(exp: Experiment, rows: list[Row], seconds: float, rounds_done: int) -> Row:
    """summary.json: final and best accuracies, time, communication totals."""
    summary: Row = {
        "algorithm": exp.cfg.algorithm.get("name"),
        "dataset": exp.cfg.dataset.get("name"),
        "model": exp.cfg.model,
        "num_params": exp.model.num_params,
        "rounds": rounds_done,
        "seed": exp.cfg.seed,
        "seconds": seconds,
        "seconds_per_round": seconds / max(rounds_done, 1),
        "torch_threads": torch.get_num_threads(),
        "gradient_evaluations_per_round": exp.options.gradient_evaluations(),
    }
    for key in ("global_acc", "personal_acc"):
        values = [(r["round"], r[key]) for r in rows if key in r]
        if values:
            best_round, best = max(values, key=lambda rv: rv[1])
            summary[f"final_{key}"] = values[-1][1]
            summary[f"best_{key}"] = best
            summary[f"best_{key}_round"] = best_round
    summary["communication"] = exp.ctx.ledger.totals()
    return {k: _clean(v) for k, v in summary.items()}


def run_experiment(exp: Experiment, out_dir: Path | None, progress: bool | None = None) -> Row:
    """Run all rounds; write config.yaml, metrics.csv, per_client.csv, summary.json, plot.png."""
    cfg, algo, ledger = exp.cfg, exp.algorithm, exp.ctx.ledger
    show = cfg.progress if progress is None else progress
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_yaml_atomic(out_dir / "config.yaml", config_to_dict(cfg))
    metrics = MetricsWriter(out_dir / "metrics.csv") if out_dir is not None else None
    per_client = MetricsWriter(out_dir / "per_client.csv") if out_dir is not None else None
    rows: list[Row] = []
    state = algo.init_state(exp.model.init_params(cfg.seed + MODEL_SEED_OFFSET))
    bar = tqdm(range(cfg.rounds), desc=str(cfg.algorithm.get("name")), disable=not show)
    start = time.perf_counter()
    rounds_done = 0
    error: DivergenceError | None = None
    for rnd in bar:
        stats = algo.run_round(state, rnd)
        round_comm = ledger.end_round()
        try:
            check_finite(exp, state, rnd, stats)
        except DivergenceError as err:
            error = err
            break
        rounds_done = rnd + 1
        if rounds_done % cfg.eval_every and rounds_done != cfg.rounds:
            continue
        evals, clients = evaluate_state(exp, state)
        row: Row = {"round": rounds_done, **evals, **stats}
        row["seconds"] = time.perf_counter() - start
        row.update({f"round_{k}": v for k, v in round_comm.items() if k.startswith("bytes")})
        row.update(
            {
                f"cum_{k}": v
                for k, v in ledger.totals().items()
                if k.startswith(("bytes", "remark1"))
            }
        )
        rows.append(row)
        if metrics is not None and per_client is not None:
            metrics.append(row)
            for c in clients:
                per_client.append({"round": rounds_done, **c})
        shown = {k: f"{row[k]:.4f}" for k in ("global_acc", "personal_acc") if k in row}
        bar.set_postfix(shown)
    bar.close()
    seconds = time.perf_counter() - start
    summary = summarize(exp, rows, seconds, rounds_done)
    if error is not None:
        summary["stopped"] = str(error)
    if out_dir is not None:
        write_json_atomic(out_dir / "summary.json", summary)
        if rows:
            plot_run(rows, out_dir / "plot.png", f"{summary['algorithm']} on {summary['dataset']}")
    if error is not None:
        raise error
    return summary
