"""Checkpoints, resume and determinism: an interrupted run, resumed, is bit-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import fedhp.engine.runner as runner
from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.engine.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_TIME_FILE,
    load_checkpoint,
    save_checkpoint_data,
)
from fedhp.engine.runner import run_experiment
from fedhp.unread import read_overrides

# Small and fast: MNIST Setting 1, MLR, a few local steps per round.
FAST = [
    "progress=false",
    "threads=2",
    "model.name=mlr",
    "eval_every=1",
    "algorithm.name=fedavg",
    "algorithm.local_steps=3",
    "rounds=6",
    "checkpoint_every=2",
]
HIER_FAULTS = [
    "algorithm.name=hierfavg",
    "algorithm.kappa1=2",
    "algorithm.kappa2=2",
    "federation.edges_per_round=3",
    "faults.client_dropout=0.3",
    "faults.edge_failure=0.2",
    "faults.straggler=0.1",
]
COMPARED = ("metrics.csv", "per_client.csv", "final_state.pt", "config.yaml")


def run(out: Path, *overrides: str, resume: bool = False) -> dict[str, object]:
    cfg = resolve_config(None, [*read_overrides(FAST, overrides), *overrides])
    return run_experiment(build_experiment(cfg), out, resume=resume)


def same_checkpoint(a: Path, b: Path) -> None:
    """Equal checkpoints, torch's global RNG state included (each run seeds it from its seed)."""
    ca, cb = (load_checkpoint(d / CHECKPOINT_FILE) for d in (a, b))
    assert "seconds" not in ca  # nothing wall-clock: that is in checkpoint_time.json
    ra, rb = ca.pop("rng"), cb.pop("rng")
    assert ra.keys() == rb.keys() and all(torch.equal(ra[k], rb[k]) for k in ra)
    sa, sb = ca.pop("state"), cb.pop("state")
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert ca == cb


def same_results(a: Path, b: Path) -> None:
    for name in COMPARED:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    same_checkpoint(a, b)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for timing in ("seconds", "seconds_per_round", "torch_threads"):
        sa.pop(timing)
        sb.pop(timing)
    assert sa == sb


class Killed(BaseException):
    """Stands in for SIGKILL inside the process (not caught by the runner)."""


def kill_before_round(exp: Any, out: Path, rnd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``exp`` into ``out`` until round ``rnd`` (0-based) starts, as if killed there."""
    original = exp.algorithm.run_round

    def dying_round(state: dict[str, torch.Tensor], r: int) -> dict[str, float]:
        if r == rnd:
            raise Killed
        return original(state, r)

    monkeypatch.setattr(exp.algorithm, "run_round", dying_round)
    with pytest.raises(Killed):
        run_experiment(exp, out)
    monkeypatch.undo()


@pytest.mark.parametrize(
    ("extra", "where"),
    [([], "before_round"), (HIER_FAULTS, "before_checkpoint")],
    ids=["fedavg-killed-before-round", "hierfavg-faults-killed-before-checkpoint"],
)
def test_interrupted_run_resumes_bit_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, extra: list[str]
) -> None:
    ref = tmp_path / "ref"
    run(ref, *extra)
    out = tmp_path / "killed"
    cfg = resolve_config(None, [*read_overrides(FAST, extra), *extra])  # (hierfavg: no local_steps)
    exp = build_experiment(cfg)
    if where == "before_round":  # killed at the start of round 4 (checkpoint of round 2 exists)
        kill_before_round(exp, out, 3, monkeypatch)
    else:  # killed after round 4's metrics row was written, before its checkpoint
        real_save = runner.save_checkpoint

        def dying_save(path: Path, snap: runner.Snapshot, config: dict[str, object]) -> None:
            if snap.round == 4:
                raise Killed
            real_save(path, snap, config)

        monkeypatch.setattr(runner, "save_checkpoint", dying_save)
        with pytest.raises(Killed):
            run_experiment(exp, out)
        monkeypatch.undo()
    assert load_checkpoint(out / CHECKPOINT_FILE)["round"] == 2
    torch.manual_seed(12345)  # a resumed process starts with another global RNG state
    run(out, *extra, resume=True)
    same_results(ref, out)


PFEDME = ["algorithm.name=pfedme", "algorithm.R=2", "algorithm.K=2"]


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        (PFEDME, False),  # theta_init=round, every client every round: theta restarts
        ([*PFEDME, "federation.client_fraction=0.5"], True),  # the others keep their theta
        (["algorithm.name=sfedhp", "algorithm.R=2", "algorithm.K=2"], False),
    ],
    ids=["pfedme-round", "pfedme-round-sampled", "sfedhp-round"],
)
def test_theta_is_checkpointed_where_a_later_round_reads_it(
    tmp_path: Path, extra: list[str], kept: bool
) -> None:
    ref, out = tmp_path / "ref", tmp_path / "cut"
    run(ref, *extra, "rounds=3", "checkpoint_every=1")
    run(out, *extra, "rounds=1", "checkpoint_every=1")
    assert ("theta" in load_checkpoint(out / CHECKPOINT_FILE)["state"]) == kept
    torch.manual_seed(12345)
    run(out, *extra, "rounds=3", "checkpoint_every=1", resume=True)
    same_results(ref, out)  # final_state.pt holds theta either way
    assert "theta" in torch.load(out / "final_state.pt", weights_only=True)["state"]


def test_same_seed_same_results_other_seed_differs(tmp_path: Path) -> None:
    run(tmp_path / "a", "rounds=3")
    run(tmp_path / "b", "rounds=3")
    run(tmp_path / "c", "rounds=3", "seed=1")
    same_results(tmp_path / "a", tmp_path / "b")
    a, c = (torch.load(tmp_path / d / "final_state.pt")["state"] for d in ("a", "c"))
    assert not torch.equal(a["global"], c["global"])
    metrics = [(tmp_path / d / "metrics.csv").read_text() for d in ("a", "c")]
    assert metrics[0] != metrics[1]
    assert "seconds" not in metrics[0].splitlines()[0]
    assert (tmp_path / "a" / "timings.csv").read_text().startswith("round,seconds")


@pytest.mark.slow
def test_dropout_runs_are_reproducible(tmp_path: Path) -> None:
    """Dropout draws from torch's global generator, which torch seeds differently in every
    process: each run seeds it from its own seed, so two runs (one process, the global state
    moved on in between) give the same results and checkpoint bytes, and resume exactly."""
    drop = ["model.name=cnn2", "model.dropout=0.5", "partition.train_per_class=10", "rounds=2"]
    run(tmp_path / "a", *drop)
    torch.rand(3)  # the ambient global state differs before the second run
    run(tmp_path / "b", *drop)
    same_results(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a" / CHECKPOINT_FILE).read_bytes() == (
        tmp_path / "b" / CHECKPOINT_FILE
    ).read_bytes()
    run(tmp_path / "c", *drop, "seed=1")
    metrics = [(tmp_path / d / "metrics.csv").read_text() for d in ("a", "c")]
    assert metrics[0] != metrics[1]


def test_resume_of_finished_run_is_a_no_op(tmp_path: Path) -> None:
    run(tmp_path / "a", "rounds=2")
    before = (tmp_path / "a" / "final_state.pt").read_bytes()
    summary = run(tmp_path / "a", "rounds=2", resume=True)
    assert summary["rounds"] == 2
    assert (tmp_path / "a" / "final_state.pt").read_bytes() == before


def test_resume_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST, "rounds=2"]) == 0
    capsys.readouterr()
    cases = [
        (["run", "--resume", str(tmp_path / "nothing")], "no config.yaml"),
        (["run", "--resume", str(out), "algorithm.lr=1"], "cannot change"),
        (["run", "--resume", str(out), "--out", str(tmp_path)], "--resume"),
    ]
    for argv, text in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err and "Traceback" not in err
    (out / CHECKPOINT_FILE).write_bytes((out / CHECKPOINT_FILE).read_bytes()[:100])
    assert main(["run", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "corrupt or truncated" in err


# A BatchNorm model: its running statistics are state too (global_buffers / client_buffers);
# little data, as evaluating even a tiny conv net on 12,000 samples a round takes seconds.
BN = [
    "model.name=vgg",
    "model.cfg=[4,M,8,M]",
    "model.batch_norm=true",
    "partition.train_per_class=40",
    "partition.test_per_class=20",
    "federation.num_clients=4",
    "federation.num_edges=2",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [[], [*BN, "algorithm.buffers=local"]],
    ids=["mlr", "batchnorm-local-buffers"],
)
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path: Path, extra: list[str]) -> None:
    """`fedhp run` killed with SIGKILL mid-run, then `fedhp run --resume`, equals one clean run."""
    args = [*read_overrides(FAST, extra), "rounds=10", "checkpoint_every=1", *extra]
    ref, out = tmp_path / "ref", tmp_path / "killed"
    assert main(["run", "--out", str(ref), *args]) == 0
    cmd = [sys.executable, "-m", "fedhp.cli", "run"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen([*cmd, "--out", str(out), *args], env=env, stdout=subprocess.DEVNULL)
    metrics = out / "metrics.csv"
    deadline = time.monotonic() + 120
    # Kill once round 4's checkpoint exists, whatever the run is doing at that instant.
    while time.monotonic() < deadline and proc.poll() is None:
        ckpt = out / CHECKPOINT_FILE
        if ckpt.exists() and metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "final_state.pt").exists()
    killed_at = load_checkpoint(out / CHECKPOINT_FILE)["round"]
    assert 1 <= killed_at < 10
    resumed = subprocess.run(
        [*cmd, "--resume", str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    same_results(ref, out)


def test_checkpoint_holds_no_wall_clock_and_resume_continues_the_seconds(tmp_path: Path) -> None:
    """Two runs of one configuration write the same checkpoint (no wall-clock in it); the seconds
    spent live in checkpoint_time.json and a resumed run's summary continues from them."""
    a, b = tmp_path / "a", tmp_path / "b"
    short = ("rounds=2", "checkpoint_every=1", "algorithm.local_steps=1")
    run(a, *short)
    time.sleep(0.05)
    run(b, *short)
    same_checkpoint(a, b)
    timing = json.loads((a / CHECKPOINT_TIME_FILE).read_text())
    assert timing["round"] == 2 and timing["seconds"] > 0
    timing["seconds"] = 1000.0  # as if the first 2 rounds had taken 1000 s
    (a / CHECKPOINT_TIME_FILE).write_text(json.dumps(timing))
    summary = run(a, *short[1:], "rounds=3", resume=True)
    assert summary["rounds"] == 3 and 1000.0 < float(summary["seconds"]) < 1000.0 + 600  # type: ignore[arg-type]


def test_checkpoint_keeping_theta_that_this_run_restarts_is_refused(tmp_path: Path) -> None:
    """A pFedMe checkpoint with theta (as written before theta_init's default became round)."""
    out = tmp_path / "run"
    run(out, *PFEDME, "rounds=1", "checkpoint_every=1")
    data = load_checkpoint(out / CHECKPOINT_FILE)
    data["state"]["theta"] = torch.zeros(20, data["state"]["global"].numel())
    save_checkpoint_data(out / CHECKPOINT_FILE, data)
    with pytest.raises(runner.CheckpointError, match="keeps theta across rounds"):
        run(out, *PFEDME, "rounds=2", "checkpoint_every=1", resume=True)


def test_configs_written_before_new_top_level_keys_still_match() -> None:
    """A run folder's config.yaml from before a top-level section existed (``public``,
    ``tensorboard``, ...) equals today's resolution of the same run: reproductions reuse it and
    --resume accepts its checkpoint."""
    from fedhp.config import config_to_dict, normalized_config, resolve_config

    today = config_to_dict(resolve_config(None, ["rounds=3"]))
    dropped = ("public", "subsample", "tensorboard", "flower", "robust", "privacy")
    old = {k: v for k, v in today.items() if k not in dropped}
    old["faults"] = {k: v for k, v in today["faults"].items() if k != "attack"}
    assert normalized_config(old) == today


def test_held_back_rows_reach_the_files_at_checkpoints_and_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result CSVs are rewritten at most every WRITE_EVERY_S seconds: with the interval
    never reached, each checkpoint still finds its rows on disk (written before it), and the
    finished files are byte-identical to a run that rewrites them after every round."""
    ref = tmp_path / "ref"
    monkeypatch.setattr(runner, "WRITE_EVERY_S", 0.0)
    run(ref)
    monkeypatch.setattr(runner, "WRITE_EVERY_S", 1e9)
    out = tmp_path / "held"
    on_disk = {}
    real_save = runner.save_checkpoint

    def save(path: Path, snap: runner.Snapshot, config: dict[str, object]) -> None:
        on_disk[snap.round] = len((out / "metrics.csv").read_text().splitlines()) - 1
        real_save(path, snap, config)

    monkeypatch.setattr(runner, "save_checkpoint", save)
    run(out)
    assert on_disk == {2: 2, 4: 4, 6: 6}  # eval_every=1: one row per round
    for name in ("metrics.csv", "per_client.csv"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    assert len((out / "timings.csv").read_text().splitlines()) == 7
