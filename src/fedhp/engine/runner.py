"""The round loop: run an algorithm, evaluate, account communication, write results.

Its parts live beside it: the evaluation rows (:mod:`fedhp.engine.metrics`), divergence
(:mod:`fedhp.engine.divergence`), checkpoint I/O (:mod:`fedhp.engine.checkpoint`) and
summary.json (:mod:`fedhp.engine.summary`).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from fedhp.config import RunConfig, config_to_dict
from fedhp.engine.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_TIME_FILE,
    FINAL_STATE_FILE,
    PREVIOUS_FILE,
    CheckpointError,
    Snapshot,
    capture,
    restore_checkpoint,
    save_checkpoint,
    save_final_state,
)
from fedhp.engine.disk_state import DiskState
from fedhp.engine.divergence import divergence_error, divergence_problem
from fedhp.engine.experiment import MODEL_SEED_OFFSET, EngineExperiment
from fedhp.engine.faults import RoundSkipped
from fedhp.engine.metrics import evaluate_state
from fedhp.engine.privacy_budget import RunPrivacy
from fedhp.engine.protocol import Row, State
from fedhp.engine.summary import summarize
from fedhp.errors import DivergenceError
from fedhp.reporting import (
    MetricsWriter,
    plot_run,
    write_json_atomic,
    write_yaml_atomic,
)

__all__ = [  # (CheckpointError: what a resumed run raises for a checkpoint of another run)
    "CheckpointError",
    "RoundDriver",
    "Row",
    "evaluate_state",
    "is_eval_round",
    "run_experiment",
]


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


RESULT_FILES = (
    "metrics.csv",
    "per_client.csv",
    "timings.csv",
    "summary.json",
    "plot.png",
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    CHECKPOINT_TIME_FILE,
    FINAL_STATE_FILE,
)


def _round_skipped(rnd: int, why: str) -> None:
    tqdm.write(f"fedhp: round {rnd + 1}: {why}; round skipped (model unchanged)", file=sys.stderr)


def _charge_stragglers(exp: EngineExperiment, start_state: State) -> None:
    """Stragglers received the round's model before missing the deadline: count that downlink."""
    ctx = exp.ctx
    stragglers = ctx.participation.round_stragglers
    if exp.algorithm.bills_stragglers:  # the algorithm billed what they received itself
        return
    if stragglers is None or len(stragglers) == 0:
        return
    messages = exp.algorithm.downlink(start_state, len(stragglers))
    if messages is None:
        return
    link = "client_edge" if exp.options.hierarchical else "client_cloud"
    ctx.ledger.record(link, "down", messages.rows(), ctx.zero_threshold, nodes=stragglers)


def _charge_evaluation(exp: EngineExperiment, state: State, rnd: int) -> None:
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


def _roll_back(state: State, snap: Snapshot, exp: EngineExperiment) -> None:
    """Put ``state`` and the ledger back to the last good round's ``snap``."""
    state.clear()
    state.update(snap.state_copy())
    exp.ctx.ledger.load_state_dict(snap.ledger)


def disk_state(exp: EngineExperiment, out_dir: Path | None) -> DiskState | None:
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


def _write_checkpoint(
    exp: EngineExperiment, out_dir: Path, snap: Snapshot, config: dict[str, Any]
) -> None:
    """Write ``snap`` without the state entries no later round reads."""
    skip = exp.algorithm.round_local_keys()
    state = {k: v for k, v in snap.state.items() if k not in skip}
    save_checkpoint(out_dir / CHECKPOINT_FILE, dataclasses.replace(snap, state=state), config)


def _save_checkpoint(
    exp: EngineExperiment,
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
    exp: EngineExperiment,
    out_dir: Path | None,
    progress: bool | None = None,
    resume: bool = False,
    driver: RoundDriver | None = None,
    on_round: Callable[[int], None] | None = None,
) -> Row:
    """Run all rounds; write config.yaml, metrics.csv, per_client.csv, timings.csv,
    summary.json, plot.png, checkpoint.pt (every ``checkpoint_every`` rounds) and final_state.pt.

    With ``resume``, continue from ``out_dir``'s checkpoint, verified first (from scratch if it
    has none; a damaged one raises a one-line :class:`CheckpointError` naming the way out); the
    results are bit-identical to an uninterrupted run's (timings aside). With a ``driver``
    (the Flower backend) the rounds and evaluations run through it. ``on_round(rounds_done)`` is
    called after every finished round (``fedhp sweep``'s one progress bar).
    """
    cfg, algo, ledger, ctx = exp.cfg, exp.algorithm, exp.ctx.ledger, exp.ctx
    show = cfg.progress if progress is None else progress
    config = config_to_dict(cfg, on_flower=driver is not None)  # (Flower: its options read)
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
            restored = restore_checkpoint(exp, state, out_dir, disk)
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
    saved_round = start_round if restored is not None else None  # the last checkpoint's round
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
                _roll_back(state, snap, exp)  # (and drop anything billed before the skip)
                stats = {}
                released = False
                _round_skipped(rnd, str(why))
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
                error = divergence_error(exp, rnd, problem, out_dir)
                _roll_back(state, snap, exp)  # keep the last good state, not the diverged one
                if disk is not None:
                    disk.rebind(state)
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
                    participants = ctx.participation.round_participants
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
            if on_round is not None:
                on_round(rounds_done)
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
                if saved is not None:
                    saved_round = rounds_done
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
        # The last good state (under a driver the nodes are past it: keep the checkpoint of the
        # last round they were asked for); not again if it is the last checkpoint, which would
        # make checkpoint.prev.pt a copy of it.
        if (
            error is not None
            and cfg.checkpoint_every
            and driver is None
            and saved_round != snap.round
        ):
            _write_checkpoint(exp, out_dir, snap, config)
        if error is None:
            save_final_state(out_dir / FINAL_STATE_FILE, final, rounds_done)
        write_json_atomic(out_dir / "summary.json", summary)
        if rows:
            plot_run(rows, out_dir / "plot.png", f"{summary['algorithm']} on {summary['dataset']}")
    if error is not None:
        raise error
    return summary
