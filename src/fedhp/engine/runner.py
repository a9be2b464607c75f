"""The round loop: run an algorithm, evaluate, account communication, write results."""

from __future__ import annotations

import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from fedhp.algorithms.base import LocalWorkOptions, State
from fedhp.config import RunConfig, config_to_dict, normalized_config, resolved_section
from fedhp.engine.build import MODEL_SEED_OFFSET, Experiment
from fedhp.engine.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_TIME_FILE,
    FINAL_STATE_FILE,
    CheckpointError,
    Snapshot,
    capture,
    checkpoint_seconds,
    config_difference,
    copy_state,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    save_final_state,
)
from fedhp.engine.disk_state import DiskState
from fedhp.engine.evaluate import ClientEval, density, evaluate_personal, evaluate_shared
from fedhp.engine.faults import RoundSkipped
from fedhp.engine.objective import sparse_learning_metrics
from fedhp.engine.privacy_budget import RunPrivacy
from fedhp.errors import DivergenceError
from fedhp.reporting import (
    MetricsWriter,
    plot_run,
    write_json_atomic,
    write_yaml_atomic,
)

Row = dict[str, Any]


class PersonalEval(Protocol):
    """Personalized models' evaluation done elsewhere (on Flower nodes), for all clients."""

    test: ClientEval
    train: ClientEval
    density: float


class RoundDriver(Protocol):
    """Runs rounds somewhere other than this process (the Flower backend); the runner keeps the
    loop, evaluation rows, accounting, checkpoints and reports."""

    def cloud_state(self, state: State, restored: bool) -> State:
        """The part of ``state`` the cloud keeps (the rest lives below it). ``restored``: the
        state comes from a checkpoint, so the nodes must be given their part of it."""

    def full_state(self, state: State, skip: frozenset[str] = frozenset()) -> State | None:
        """The whole algorithm state (the cloud's ``state`` plus what the nodes hold, less the
        node-held entries in ``skip``), for a checkpoint; None if some node could not provide
        its part."""

    def run_round(self, state: State, rnd: int) -> Row:
        """Run round ``rnd`` on ``state`` (the cloud's), like ``Algorithm.run_round``."""

    def evaluate(self, state: State) -> tuple[Row, list[Row]]:
        """Like :func:`evaluate_state`, for the cloud's ``state``."""

    def close(self) -> None:
        """Called once after the last round."""


def is_eval_round(cfg: RunConfig, rnd: int) -> bool:
    """Whether the 0-based round ``rnd`` ends with an evaluation (every ``eval_every`` rounds and
    the last)."""
    return (rnd + 1) % cfg.eval_every == 0 or rnd + 1 == cfg.rounds


def evaluate_state(
    exp: Experiment, state: State, personal_eval: PersonalEval | None = None
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
        for e, acc in enumerate(test.per_group_accuracy(edge_of, topo.num_edges).tolist()):
            row[f"edge{e}_global_acc"] = acc
        for c, acc in enumerate(test.per_client_accuracy().tolist()):
            clients[c]["global_acc"] = acc
    custom = algo.personal_evaluation(state, split) if personal_eval is None else None
    if custom is not None:  # personalization that is not a parameter vector (pFedGP)
        row.update(personal_acc=custom.accuracy, personal_loss=custom.loss)
        if exp.cfg.eval_train:
            train_eval = algo.personal_evaluation(state, fed.train)
            assert train_eval is not None
            row["personal_train_loss"] = train_eval.loss
        for e, acc in enumerate(custom.per_group_accuracy(edge_of, topo.num_edges).tolist()):
            row[f"edge{e}_personal_acc"] = acc
        for c, acc in enumerate(custom.per_client_accuracy().tolist()):
            clients[c]["personal_acc"] = acc
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
        for e, acc in enumerate(test.per_group_accuracy(edge_of, topo.num_edges).tolist()):
            row[f"edge{e}_personal_acc"] = acc
        for c, acc in enumerate(test.per_client_accuracy().tolist()):
            clients[c]["personal_acc"] = acc
    row.update(algo.extra_metrics(state))
    return row, clients


LOSS_KEYS = ("local_loss", "global_loss", "train_loss", "personal_loss", "personal_train_loss")


STIFF = 0.5


def likely_cause(options: Any) -> str:
    """A short guess at why ``options`` diverged, naming the values to lower: a quadratic
    penalty weight when weight·η ≥ :data:`STIFF` (a gradient step on weight/2‖·‖² is unstable
    from weight·η = 2 on), else the learning rate."""
    lr = getattr(options, "lr", None)
    for field, symbol in (("lam", "λ"), ("lam1", "λ1"), ("mu", "μ")):
        weight = getattr(options, field, None)
        if field == "lam1" and weight is None:
            continue
        if not (isinstance(weight, int | float) and isinstance(lr, int | float)):
            continue
        if weight > 0 and weight * lr >= STIFF:
            return (
                f"{symbol}·η = {weight * lr:g} too large (algorithm.{field}={weight:g}, "
                f"algorithm.lr={lr:g}); lower them"
            )
    if isinstance(lr, int | float):
        return f"learning rate too large (algorithm.lr={lr:g}); lower it"
    return "step sizes too large; lower the algorithm's learning rates"


def divergence_problem(state: State, stats: Row, max_loss: float | None) -> str | None:
    """What is wrong with ``state`` / the loss values in ``stats`` (None when all is well).

    Non-finite parameters, a non-finite loss, or a loss above ``max_loss`` count as divergence."""
    bad = [
        k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())
    ]
    if bad:
        return f"non-finite values in {', '.join(sorted(bad))}"
    for key in LOSS_KEYS:
        loss = stats.get(key)
        if not isinstance(loss, int | float):
            continue
        if not math.isfinite(loss):
            return f"{key} is {loss}"
        if max_loss is not None and loss > max_loss:
            return f"{key} {loss:.4g} > max_loss={max_loss:g}"
    return None


def check_finite(exp: Experiment, state: State, rnd: int, stats: Row) -> None:
    """Raise a one-line :class:`DivergenceError` if round ``rnd`` (0-based) diverged."""
    problem = divergence_problem(state, stats, exp.cfg.max_loss)
    if problem is not None:
        raise _divergence(exp, rnd, problem, None)


def _divergence(exp: Experiment, rnd: int, problem: str, out_dir: Path | None) -> DivergenceError:
    name = exp.cfg.algorithm.get("name")
    where = ""
    if out_dir is not None:
        where = f"; results up to round {rnd} (the last good one) are kept in {out_dir}"
    return DivergenceError(
        f"round {rnd + 1}: {name} diverged ({problem}); "
        f"likely cause: {likely_cause(exp.options)}{where}"
    )


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def local_work_summary(exp: Experiment) -> Row:
    """Which local budget was used; under ``local_epochs`` the gradient evaluations per round are
    the clients' real step counts ``E * ceil(n_c / batch)`` (mean over clients, min and max)."""
    opts = exp.options
    if not isinstance(opts, LocalWorkOptions):
        return {}
    out: Row = {"local_work": opts.local_work()}
    if opts.local_epochs is not None:
        steps = opts.step_counts(exp.ctx.fed.train.counts.cpu())
        out["gradient_evaluations_per_round"] = float(steps.double().mean())
        out["gradient_evaluations_per_round_min"] = int(steps.min())
        out["gradient_evaluations_per_round_max"] = int(steps.max())
    return out


def train_flops_summary(exp: Experiment, trained_samples: int | None) -> Row:
    """The run's training arithmetic: ``samples_processed`` (samples of every gradient
    evaluation the engine ran, :attr:`~fedhp.models.base.BatchedModel.trained_samples`; also as
    ``train_samples``, its older, misleading name: it is not the training set's size, which is
    ``train_set_size``), ``train_flops_per_sample``
    (:meth:`~fedhp.models.base.BatchedModel.train_flops_per_sample`) and the product
    ``train_flops``; ``samples_processed`` and ``train_flops`` are None where the count is not
    known (rounds run on Flower nodes, a resumed checkpoint written before the count existed)."""
    per_sample = exp.model.train_flops_per_sample()
    return {
        "train_set_size": int(exp.ctx.fed.train.counts.sum()),
        "samples_processed": trained_samples,
        "train_samples": trained_samples,
        "train_flops_per_sample": per_sample,
        "train_flops": None if trained_samples is None else trained_samples * per_sample,
    }


def summarize(
    exp: Experiment,
    rows: list[Row],
    seconds: float,
    rounds_done: int,
    trained_samples: int | None = None,
) -> Row:
    """summary.json: final and best accuracies, time, training FLOPs (``trained_samples``:
    see :func:`train_flops_summary`), communication totals."""
    summary: Row = {
        "algorithm": exp.cfg.algorithm.get("name"),
        "dataset": exp.cfg.dataset.get("name"),
        "model": resolved_section("model", exp.cfg.model),
        "num_params": exp.model.num_params,
        "rounds": rounds_done,
        "seed": exp.cfg.seed,
        "seconds": seconds,
        "seconds_per_round": seconds / max(rounds_done, 1),
        "torch_threads": torch.get_num_threads(),
        "gradient_evaluations_per_round": exp.options.gradient_evaluations(),
    }
    summary.update(local_work_summary(exp))
    summary.update(train_flops_summary(exp, trained_samples))
    summary.update(exp.algorithm.summary_notes())
    for key in ("global_acc", "personal_acc", "global_balanced_acc"):
        values = [(r["round"], r[key]) for r in rows if key in r]
        if values:
            best_round, best = max(values, key=lambda rv: rv[1])
            summary[f"final_{key}"] = values[-1][1]
            summary[f"best_{key}"] = best
            summary[f"best_{key}_round"] = best_round
    summary["communication"] = exp.ctx.ledger.totals()
    return {k: _clean(v) for k, v in summary.items()}


RESULT_FILES = (
    "metrics.csv",
    "per_client.csv",
    "timings.csv",
    "summary.json",
    "plot.png",
    CHECKPOINT_FILE,
    CHECKPOINT_TIME_FILE,
    FINAL_STATE_FILE,
)


def _round_skipped(exp: Experiment, rnd: int, why: str) -> None:
    tqdm.write(f"fedhp: round {rnd + 1}: {why}; round skipped (model unchanged)", file=sys.stderr)


def _charge_stragglers(exp: Experiment, start_state: State) -> None:
    """Stragglers received the round's model before missing the deadline: count that downlink."""
    ctx = exp.ctx
    stragglers = ctx.round_stragglers
    if exp.algorithm.bills_stragglers:  # the algorithm billed what they received itself
        return
    if stragglers is None or len(stragglers) == 0:
        return
    messages = exp.algorithm.downlink(start_state, len(stragglers))
    if messages is None:
        return
    link = "client_edge" if exp.options.hierarchical else "client_cloud"
    ctx.ledger.record(link, "down", messages, ctx.zero_threshold, nodes=stragglers)


def _charge_evaluation(exp: Experiment, state: State, rnd: int) -> None:
    """An evaluated round of a method whose personalized models adapt the global model
    (Per-FedAvg) sends that model to every client: bill it on the ``client_cloud_eval`` link."""
    ctx, algo = exp.ctx, exp.algorithm
    w = algo.global_model(state)
    if not (algo.evaluation_needs_global and is_eval_round(exp.cfg, rnd)) or w is None:
        return
    clients = ctx.all_clients
    ctx.ledger.record(
        "client_cloud_eval", "down", w.expand(len(clients), -1), ctx.zero_threshold, clients
    )


def disk_state(exp: Experiment, out_dir: Path | None) -> DiskState | None:
    """The run's disk-backed per-client state (``state_storage: disk``; None: in RAM), in
    ``state_dir`` or ``<out>/state`` (a temporary folder without an out folder)."""
    cfg = exp.cfg
    if cfg.state_storage != "disk":
        return None
    if cfg.state_dir is not None:
        folder = Path(cfg.state_dir)
    elif out_dir is not None:
        folder = out_dir / "state"
    else:
        folder = Path(tempfile.mkdtemp(prefix="fedhp-state-"))
    keys = [k for k, kind in exp.algorithm.held_keys.items() if kind == "client"]
    return DiskState(folder, keys)


def _restore(
    exp: Experiment, state: State, out_dir: Path, disk: DiskState | None = None
) -> Snapshot | None:
    """Load ``out_dir``'s checkpoint into ``state``, the RNGs and the ledger (None: none yet)."""
    path = out_dir / CHECKPOINT_FILE
    if not path.exists():
        return None
    data = load_checkpoint(path)
    # (a checkpoint written before config.yaml held every option compares in today's form)
    diff = config_difference(normalized_config(data["config"]), config_to_dict(exp.cfg))
    if diff is not None:
        raise CheckpointError(
            f"{path}: written by a different configuration ({diff} differs); "
            "only rounds and progress may change on resume"
        )
    if int(data["round"]) > exp.cfg.rounds:
        raise CheckpointError(
            f"{path}: already at round {data['round']}, beyond rounds={exp.cfg.rounds}"
        )
    saved: dict[str, torch.Tensor] = data["state"]
    expected = set(state) - exp.algorithm.round_local_keys()  # the others keep their start value
    kept = sorted(set(saved) - expected)
    if kept and set(saved) <= set(state) and expected <= set(saved):
        raise CheckpointError(
            f"{path}: keeps {', '.join(kept)} across rounds, which this run restarts every round "
            "(e.g. written before theta_init's default became round); start the run afresh"
        )
    if set(saved) != expected:
        raise CheckpointError(
            f"{path}: state keys {sorted(saved)} do not match the algorithm's {sorted(expected)}"
        )
    for key, value in saved.items():
        if value.shape != state[key].shape or value.dtype != state[key].dtype:
            raise CheckpointError(f"{path}: state {key!r} has the wrong shape or dtype")
        state[key] = value.to(state[key].device)
    if disk is not None:
        disk.rebind(state)
    if exp.cfg.privacy.enabled and not isinstance(data.get("privacy"), dict):
        raise CheckpointError(f"{path}: holds no DP accountant state; start the run afresh")
    restore_rng(exp, data["rng"])
    exp.ctx.ledger.load_state_dict(data["ledger"])
    return Snapshot(
        round=int(data["round"]),
        state=copy_state(state, None if disk is None else disk.snapshot),
        rng=data["rng"],
        ledger=data["ledger"],
        rows=list(data["rows"]),
        seconds=checkpoint_seconds(path),
        trained_samples=data.get("trained_samples"),
        privacy=data.get("privacy"),
        shared=frozenset(() if disk is None else disk.snapshot),
    )


def _write_checkpoint(
    exp: Experiment, out_dir: Path, snap: Snapshot, config: dict[str, Any]
) -> None:
    """Write ``snap`` without the state entries no later round reads."""
    skip = exp.algorithm.round_local_keys()
    state = {k: v for k, v in snap.state.items() if k not in skip}
    save_checkpoint(out_dir / CHECKPOINT_FILE, dataclasses.replace(snap, state=state), config)


def _save_checkpoint(
    exp: Experiment,
    out_dir: Path,
    snap: Snapshot,
    config: dict[str, Any],
    driver: RoundDriver | None,
    last: bool,
) -> State | None:
    """Write ``snap``; under a driver with the nodes' part of the state fetched from them (no
    checkpoint this time if a node cannot give it: the previous one stays; the round-local
    entries only for the ``last`` round's final state). Returns the state fetched (None if
    none)."""
    if driver is not None:
        skip = frozenset() if last else exp.algorithm.round_local_keys()
        full = driver.full_state(snap.state, skip)
        if full is None:
            print(
                f"fedhp: round {snap.round}: no checkpoint (a node did not return its state); "
                "the previous checkpoint stays",
                file=sys.stderr,
            )
            return None
        snap = dataclasses.replace(snap, state=full)
    _write_checkpoint(exp, out_dir, snap, config)
    return snap.state


WRITE_EVERY_S = 2.0
"""metrics.csv, per_client.csv and timings.csv are rewritten at most this often during a run
(and at every checkpoint and the end): rewriting them after every evaluated round cost more than
the rounds themselves for cheap models evaluated every round (the rewrite grows with the file)."""


def _flush(writers: dict[str, MetricsWriter]) -> None:
    """Write the rows the result CSVs still hold back (see :data:`WRITE_EVERY_S`)."""
    for writer in writers.values():
        writer.flush()


def run_experiment(
    exp: Experiment,
    out_dir: Path | None,
    progress: bool | None = None,
    resume: bool = False,
    driver: RoundDriver | None = None,
) -> Row:
    """Run all rounds; write config.yaml, metrics.csv, per_client.csv, timings.csv,
    summary.json, plot.png, checkpoint.pt (every ``checkpoint_every`` rounds) and final_state.pt.

    With ``resume``, continue from ``out_dir``'s checkpoint (from scratch if it has none); the
    results are bit-identical to an uninterrupted run's (timings aside). With a ``driver``
    (the Flower backend) the rounds and evaluations run through it.
    """
    cfg, algo, ledger, ctx = exp.cfg, exp.algorithm, exp.ctx.ledger, exp.ctx
    show = cfg.progress if progress is None else progress
    config = config_to_dict(cfg)
    # The initial parameters on the run's device: init_state keeps them where they are given.
    init = exp.model.init_params(cfg.seed + MODEL_SEED_OFFSET).to(exp.ctx.device)
    state = algo.init_state(init)
    disk = disk_state(exp, out_dir)  # per-client rows in files (None: in RAM)
    if disk is not None:
        disk.adopt(state)
    privacy = RunPrivacy.of(cfg, exp.options)  # the DP budget (None: no DP)
    restored: Snapshot | None = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            restored = _restore(exp, state, out_dir, disk)
        else:
            for name in RESULT_FILES:
                (out_dir / name).unlink(missing_ok=True)
        write_yaml_atomic(out_dir / "config.yaml", config)
    if driver is not None:
        state = driver.cloud_state(state, restored is not None)
        if restored is not None:
            restored.state = {k: v.clone() for k, v in state.items()}
    start_round = restored.round if restored is not None else 0
    rows: list[Row] = restored.rows if restored is not None else []
    prior_seconds = restored.seconds if restored is not None else 0.0
    writers: dict[str, MetricsWriter] = {}
    if out_dir is not None:
        for name in ("metrics", "per_client", "timings"):
            path = out_dir / f"{name}.csv"
            writers[name] = (
                MetricsWriter.resume(path, start_round, WRITE_EVERY_S)
                if resume
                else MetricsWriter(path, WRITE_EVERY_S)
            )
    board = None
    if out_dir is not None and cfg.tensorboard:
        from fedhp.tensorboard import TensorBoardWriter

        board = TensorBoardWriter(out_dir, start_round)
    # Samples trained (the model's counter, from the checkpoint's on resume; None: not known).
    samples_known = driver is None and (restored is None or restored.trained_samples is not None)
    exp.model.trained_samples = (restored.trained_samples or 0) if restored is not None else 0

    def trained() -> int | None:
        return exp.model.trained_samples if samples_known else None

    if privacy is not None and restored is not None and restored.privacy is not None:
        privacy.load_state_dict(restored.privacy)

    def budget() -> dict[str, Any] | None:
        return None if privacy is None else privacy.state_dict()

    into = None if disk is None else disk.snapshot
    snap = restored or capture(exp, state, 0, rows, 0.0, trained(), budget(), into=into)
    bar = tqdm(
        total=cfg.rounds, initial=start_round, desc=str(cfg.algorithm.get("name")), disable=not show
    )
    start = time.perf_counter()
    rounds_done = start_round
    error: DivergenceError | None = None
    saved: State | None = None  # the whole state of the last checkpoint, if this round's
    try:
        for rnd in range(start_round, cfg.rounds):
            ctx.begin_round(rnd)
            released = True  # whether the round released an aggregate (DP accounting)
            try:
                if driver is None:
                    stats: Row = algo.run_round(state, rnd)
                else:
                    stats = driver.run_round(state, rnd)
            except RoundSkipped as why:
                state.clear()
                state.update(snap.state_copy())
                ledger.load_state_dict(snap.ledger)  # drop anything recorded before the skip
                stats = {}
                released = False
                _round_skipped(exp, rnd, str(why))
            else:
                _charge_stragglers(exp, snap.state)
            if disk is not None:  # (a replaced or rolled-back entry back into its file)
                disk.rebind(state)
            _charge_evaluation(exp, state, rnd)
            round_comm = ledger.end_round()
            problem = divergence_problem(state, stats, cfg.max_loss)
            if problem is None and not is_eval_round(cfg, rnd):
                evals: Row | None = None
            else:
                evaluate = evaluate_state if driver is None else lambda _, s: driver.evaluate(s)
                evals, clients = evaluate(exp, state) if problem is None else ({}, [])
                problem = problem or divergence_problem({}, evals, cfg.max_loss)
            if problem is not None:
                error = _divergence(exp, rnd, problem, out_dir)
                state.clear()
                state.update(snap.state_copy())  # keep the last good state, not the diverged one
                if disk is not None:
                    disk.rebind(state)
                ledger.load_state_dict(snap.ledger)
                break
            rounds_done = rnd + 1
            if privacy is not None and released:
                privacy.record_round()
            seconds = prior_seconds + time.perf_counter() - start
            if evals is not None:
                row: Row = {"round": rounds_done, **evals, **stats}
                if privacy is not None:
                    row["epsilon"] = privacy.epsilon()
                if cfg.faults.enabled:
                    participants = ctx.round_participants
                    row["clients_participating"] = 0 if participants is None else len(participants)
                row.update(
                    {f"round_{k}": v for k, v in round_comm.items() if k.startswith("bytes")}
                )
                row.update(
                    {
                        f"cum_{k}": v
                        for k, v in ledger.totals().items()
                        if k.startswith(("bytes", "remark1"))
                    }
                )
                rows.append(row)
                if writers:
                    writers["metrics"].append(row)
                    writers["per_client"].extend({"round": rounds_done, **c} for c in clients)
                    writers["timings"].append({"round": rounds_done, "seconds": seconds})
                if board is not None:
                    board.append(row)
                bar.set_postfix(
                    {k: f"{row[k]:.4f}" for k in ("global_acc", "personal_acc") if k in row}
                )
            bar.update(1)
            snap = capture(exp, state, rounds_done, rows, seconds, trained(), budget(), into=into)
            due = cfg.checkpoint_every and (
                rounds_done % cfg.checkpoint_every == 0 or rounds_done == cfg.rounds
            )
            saved = None
            if out_dir is not None and due:
                _flush(writers)  # the rows up to the checkpoint's round, before it
                saved = _save_checkpoint(
                    exp, out_dir, snap, config, driver, last=rounds_done == cfg.rounds
                )
    finally:  # every row in the files, also when a round raised
        _flush(writers)
    bar.close()
    if board is not None:
        board.close()
    final = state
    if driver is not None:
        # The final state with the nodes' part (the last checkpoint's, when it is this round's).
        if error is None and out_dir is not None:
            final = saved if saved is not None else driver.full_state(state) or state
            if final is state:
                print(
                    "fedhp: final_state.pt holds the cloud's part of the state only (a node did "
                    "not return its part)",
                    file=sys.stderr,
                )
        driver.close()
    seconds = prior_seconds + time.perf_counter() - start
    summary = summarize(exp, rows, seconds, rounds_done, trained())
    if privacy is not None:
        summary["privacy"] = privacy.summary()
    if error is not None:
        summary["stopped"] = str(error)
    if out_dir is not None:
        if error is not None and cfg.checkpoint_every and driver is None:
            # The last good state (under a driver the nodes are past it: keep the checkpoint
            # of the last round they were asked for).
            _write_checkpoint(exp, out_dir, snap, config)
        if error is None:
            save_final_state(out_dir / FINAL_STATE_FILE, final, rounds_done)
        write_json_atomic(out_dir / "summary.json", summary)
        if rows:
            plot_run(rows, out_dir / "plot.png", f"{summary['algorithm']} on {summary['dataset']}")
    if error is not None:
        raise error
    return summary
