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
    remove_stale_temps,
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
    run = _Run(exp, out_dir, progress, resume, driver)
    try:
        for rnd in range(run.start_round, exp.cfg.rounds):
            stats, released = run.train_round(rnd)
            round_comm = run.close_round(rnd)
            evals, clients, problem = run.check_and_evaluate(rnd, stats)
            if problem is not None:
                run.stop_diverged(rnd, problem)
                break
            run.count_round(rnd, released)
            if evals is not None:
                run.record(run.result_row(evals, stats, round_comm), clients)
            run.advance(on_round)
            run.checkpoint_if_due()
    except BaseException as err:  # the MLflow run ended as killed or failed (resume reopens it)
        if run.tracker is not None:
            run.tracker.end(killed=isinstance(err, KeyboardInterrupt))
        raise
    finally:  # every row in the files, also when a round raised
        _flush(run.writers)
    return run.finish()


def _open_writers(out_dir: Path | None, start_round: int, resume: bool) -> dict[str, MetricsWriter]:
    """metrics.csv, per_client.csv and timings.csv (their rows up to ``start_round`` kept on
    ``resume``); none without an out folder."""
    writers: dict[str, MetricsWriter] = {}
    if out_dir is not None:
        for name in ("metrics", "per_client", "timings"):
            path = out_dir / f"{name}.csv"
            writers[name] = (
                MetricsWriter.resume(path, start_round, WRITE_EVERY_S)
                if resume
                else MetricsWriter(path, WRITE_EVERY_S)
            )
    return writers


def _open_board(cfg: RunConfig, out_dir: Path | None, start_round: int) -> Any:
    """The run's TensorBoard writer (None unless ``tensorboard`` and an out folder)."""
    if out_dir is None or not cfg.tensorboard:
        return None
    from fedhp.tensorboard import TensorBoardWriter

    return TensorBoardWriter(out_dir, start_round)


def _open_tracker(
    cfg: RunConfig, out_dir: Path | None, config: dict[str, Any], resume: bool, rows: list[Row]
) -> Any:
    """The run's MLflow run (None unless ``mlflow.enabled`` and an out folder, or where MLflow
    cannot be used: one warning); ``rows``: the rows a resumed run already has."""
    if out_dir is None or not cfg.mlflow.enabled:
        return None
    from fedhp.mlflow_tracking import Tracker

    mlflow = cfg.mlflow
    settings = {
        "tracking_uri": mlflow.tracking_uri,
        "experiment": mlflow.experiment,
        "artifacts": mlflow.artifacts,
    }
    return Tracker.open(settings, out_dir, config, resume, rows)


class _Run:
    """One run between its rounds: the state, where the results go, the last good round's
    snapshot; each step of :func:`run_experiment`'s loop is one method."""

    def __init__(
        self,
        exp: EngineExperiment,
        out_dir: Path | None,
        progress: bool | None,
        resume: bool,
        driver: RoundDriver | None,
    ) -> None:
        cfg = exp.cfg
        self.exp, self.out_dir, self.driver = exp, out_dir, driver
        self.config = config_to_dict(cfg, on_flower=driver is not None)  # (Flower: its options)
        # The initial parameters on the run's device: init_state keeps them where they are given.
        init = exp.model.init_params(cfg.seed + MODEL_SEED_OFFSET).to(exp.ctx.device)
        self.state = exp.algorithm.init_state(init)
        self.disk = disk_state(exp, out_dir)  # per-client rows in files (None: in RAM)
        if self.disk is not None:
            self.disk.adopt(self.state)
        self.privacy = RunPrivacy.of(cfg, exp.options)  # the DP budget (None: no DP)
        restored = self.prepare_folder(resume)
        if driver is not None:
            self.state = driver.cloud_state(self.state, restored is not None)
            if restored is not None:
                restored.state = {k: v.clone() for k, v in self.state.items()}
        self.start_round = restored.round if restored is not None else 0
        self.rows: list[Row] = restored.rows if restored is not None else []
        self.prior_seconds = restored.seconds if restored is not None else 0.0
        self.writers = _open_writers(out_dir, self.start_round, resume)
        self.board = _open_board(cfg, out_dir, self.start_round)
        self.tracker = _open_tracker(cfg, out_dir, self.config, resume, self.rows)
        # Samples trained (the model's counter, from the checkpoint's on resume; None: unknown).
        self.samples_known = driver is None and (
            restored is None or restored.trained_samples is not None
        )
        exp.model.trained_samples = (restored.trained_samples or 0) if restored is not None else 0
        if self.privacy is not None and restored is not None and restored.privacy is not None:
            self.privacy.load_state_dict(restored.privacy)
        self.into = None if self.disk is None else self.disk.snapshot
        self.snap = restored or self.capture(0, 0.0)
        show = cfg.progress if progress is None else progress
        name = str(cfg.algorithm.get("name"))
        self.bar = tqdm(total=cfg.rounds, initial=self.start_round, desc=name, disable=not show)
        self.start = time.perf_counter()
        self.rounds_done = self.start_round
        self.seconds = self.prior_seconds
        self.error: DivergenceError | None = None
        self.saved: State | None = None  # the whole state of the last checkpoint, if this round's
        self.saved_round = self.start_round if restored is not None else None  # its round

    def prepare_folder(self, resume: bool) -> Snapshot | None:
        """The out folder made, its checkpoint restored (``resume``) or its old results removed,
        config.yaml written; the restored snapshot (None: none)."""
        out_dir, restored = self.out_dir, None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(out_dir)  # (what a write killed midway left)
            if resume:
                restored = restore_checkpoint(self.exp, self.state, out_dir, self.disk)
            else:
                for name in RESULT_FILES:
                    (out_dir / name).unlink(missing_ok=True)
            write_yaml_atomic(out_dir / "config.yaml", self.config)
        return restored

    def trained(self) -> int | None:
        """The samples trained so far (None: not known)."""
        return self.exp.model.trained_samples if self.samples_known else None

    def capture(self, rounds_done: int, seconds: float) -> Snapshot:
        """A snapshot of the run after ``rounds_done`` rounds."""
        trained, privacy = self.trained(), self.privacy
        budget = None if privacy is None else privacy.state_dict()
        state, rows = self.state, self.rows
        return capture(self.exp, state, rounds_done, rows, seconds, trained, budget, into=self.into)

    def train_round(self, rnd: int) -> tuple[Row, bool]:
        """Round ``rnd``'s training: its statistics, and whether it released an aggregate (DP
        accounting); a skipped round is rolled back and releases none."""
        exp = self.exp
        exp.ctx.begin_round(rnd)
        released = True
        try:
            if self.driver is None:
                stats: Row = exp.algorithm.run_round(self.state, rnd)
            else:
                stats = self.driver.run_round(self.state, rnd)
        except RoundSkipped as why:
            _roll_back(self.state, self.snap, exp)  # (and drop anything billed before the skip)
            stats = {}
            released = False
            _round_skipped(rnd, str(why))
        else:
            _charge_stragglers(exp, self.snap.state)
        if self.disk is not None:  # (a replaced or rolled-back entry back into its file)
            self.disk.rebind(self.state)
        return stats, released

    def close_round(self, rnd: int) -> dict[str, float]:
        """Round ``rnd``'s evaluation downlink billed; its communication totals."""
        _charge_evaluation(self.exp, self.state, rnd)
        return self.exp.ctx.ledger.end_round()

    def check_and_evaluate(self, rnd: int, stats: Row) -> tuple[Row | None, list[Row], str | None]:
        """The evaluation of round ``rnd`` (None: not an evaluated round), its per-client rows,
        and what diverged (None: nothing)."""
        exp, driver = self.exp, self.driver
        problem = divergence_problem(self.state, stats, exp.cfg.max_loss)
        if problem is None and not is_eval_round(exp.cfg, rnd):
            return None, [], None
        evaluate = evaluate_state if driver is None else lambda _, s: driver.evaluate(s)
        evals, clients = evaluate(exp, self.state) if problem is None else ({}, [])
        return evals, clients, problem or divergence_problem({}, evals, exp.cfg.max_loss)

    def stop_diverged(self, rnd: int, problem: str) -> None:
        """Keep the last good state, not the diverged one, and the error to raise at the end."""
        self.error = divergence_error(self.exp, rnd, problem, self.out_dir)
        _roll_back(self.state, self.snap, self.exp)
        if self.disk is not None:
            self.disk.rebind(self.state)

    def count_round(self, rnd: int, released: bool) -> None:
        """Round ``rnd`` done: counted, its DP release recorded, the run's time taken."""
        self.rounds_done = rnd + 1
        if self.privacy is not None and released:
            self.privacy.record_round()
        self.seconds = self.prior_seconds + time.perf_counter() - self.start

    def result_row(self, evals: Row, stats: Row, round_comm: dict[str, float]) -> Row:
        """The metrics.csv row of an evaluated round: its evaluation, statistics, privacy
        budget, participants, this round's and the cumulative bytes."""
        ctx, ledger = self.exp.ctx, self.exp.ctx.ledger
        row: Row = {"round": self.rounds_done, **evals, **stats}
        if self.privacy is not None:
            row["epsilon"] = self.privacy.epsilon()
        if self.exp.cfg.faults.enabled:
            participants = ctx.participation.round_participants
            row["clients_participating"] = 0 if participants is None else len(participants)
        row.update({f"round_{k}": v for k, v in round_comm.items() if k.startswith("bytes")})
        row.update(
            {
                f"cum_{k}": v
                for k, v in ledger.totals().items()
                if k.startswith(("bytes", "remark1"))
            }
        )
        return row

    def record(self, row: Row, clients: list[Row]) -> None:
        """``row`` and the per-client rows into the results, TensorBoard, MLflow and the
        progress bar."""
        self.rows.append(row)
        if self.writers:
            self.writers["metrics"].append(row)
            self.writers["per_client"].extend({"round": self.rounds_done, **c} for c in clients)
            self.writers["timings"].append({"round": self.rounds_done, "seconds": self.seconds})
        if self.board is not None:
            self.board.append(row)
        if self.tracker is not None:
            self.tracker.append(row)
        self.bar.set_postfix(
            {k: f"{row[k]:.4f}" for k in ("global_acc", "personal_acc") if k in row}
        )

    def advance(self, on_round: Callable[[int], None] | None) -> None:
        """The progress shown, and the finished round captured as the last good one."""
        self.bar.update(1)
        if on_round is not None:
            on_round(self.rounds_done)
        self.snap = self.capture(self.rounds_done, self.seconds)

    def checkpoint_if_due(self) -> None:
        """A checkpoint every ``checkpoint_every`` rounds and after the last."""
        cfg, done = self.exp.cfg, self.rounds_done
        due = cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.rounds)
        self.saved = None
        if self.out_dir is not None and due:
            _flush(self.writers)  # the rows up to the checkpoint's round, before it
            self.saved = _save_checkpoint(
                self.exp, self.out_dir, self.snap, self.config, self.driver, last=done == cfg.rounds
            )
            if self.saved is not None:
                self.saved_round = done

    def final_state(self) -> State:
        """The state final_state.pt holds: under a driver with the nodes' part (the last
        checkpoint's, when it is this round's); the driver closed."""
        final, driver = self.state, self.driver
        if driver is None:
            return final
        if self.error is None and self.out_dir is not None:
            final = self.saved if self.saved is not None else driver.full_state(final) or final
            if final is self.state:
                print(
                    "fedhp: final_state.pt holds the cloud's part of the state only (a node did "
                    "not return its part)",
                    file=sys.stderr,
                )
        driver.close()
        return final

    def finish(self) -> Row:
        """Close the run: summary.json, final_state.pt, plot.png (and the last good checkpoint
        of a diverged run); the summary, or the divergence error raised."""
        exp, out_dir, error, snap = self.exp, self.out_dir, self.error, self.snap
        cfg = exp.cfg
        self.bar.close()
        if self.board is not None:
            self.board.close()
        final = self.final_state()
        seconds = self.prior_seconds + time.perf_counter() - self.start
        summary = summarize(exp, self.rows, seconds, self.rounds_done, self.trained())
        if self.privacy is not None:
            summary["privacy"] = self.privacy.summary()
        if error is not None:
            summary["stopped"] = str(error)
        if out_dir is not None:
            # The last good state (under a driver the nodes are past it: keep the checkpoint of
            # the last round they were asked for); not again if it is the last checkpoint, which
            # would make checkpoint.prev.pt a copy of it.
            last_saved = self.saved_round == snap.round
            if (
                error is not None
                and cfg.checkpoint_every
                and self.driver is None
                and not last_saved
            ):
                _write_checkpoint(exp, out_dir, snap, self.config)
            if error is None:
                save_final_state(out_dir / FINAL_STATE_FILE, final, self.rounds_done)
            if self.rows:
                title = f"{summary['algorithm']} on {summary['dataset']}"
                plot_run(self.rows, out_dir / "plot.png", title)
            # Last: a sweep counts a run with every file, summary.json the last, as finished.
            write_json_atomic(out_dir / "summary.json", summary)
            if self.tracker is not None:  # (after the files it logs)
                self.tracker.finish(summary)
        if error is not None:
            raise error
        return summary
