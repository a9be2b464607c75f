"""A run folder is whole or refused: ``fedhp run --resume`` rebuilds a metrics.csv that lost
rows from the checkpoint (byte for byte) and refuses, in one line naming the file and the way
out, a per_client.csv or timings.csv it cannot rebuild; a sweep counts a run as finished only
with every file of it, so a sweep killed (SIGKILL) while writing a run's files completes them
when started again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedhp.cli import main

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "progress=false",
    "threads=1",
    "model.name=mlr",
    "eval_every=1",
    "algorithm.name=fedavg",
    "algorithm.local_steps=3",
    "checkpoint_every=2",
    "subsample.train=600",
    "subsample.test=300",
    "partition.train_per_class=30",
    "partition.test_per_class=15",
    "federation.num_clients=6",
    "federation.num_edges=2",
]


def run(out: Path, rounds: int) -> None:
    assert main(["run", *FAST, f"rounds={rounds}", "--out", str(out)]) == 0


def resume(out: Path, *extra: str) -> int:
    return main(["run", "--resume", str(out), *extra])


def test_a_deleted_metrics_csv_comes_back_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    run(out, 6)
    before = (out / "metrics.csv").read_bytes()
    assert before.count(b"\n") == 7  # the header and 6 rows
    (out / "metrics.csv").unlink()
    capsys.readouterr()
    assert resume(out) == 0
    assert (out / "metrics.csv").read_bytes() == before
    warning = [line for line in capsys.readouterr().err.splitlines() if "metrics.csv" in line]
    assert len(warning) == 1 and "its 6 rows up to round 6 rebuilt from checkpoint.pt" in warning[0]
    assert "(the file was missing)" in warning[0]


def test_a_metrics_csv_cut_short_comes_back_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    run(out, 6)
    before = (out / "metrics.csv").read_bytes()
    lines = before.splitlines(keepends=True)
    (out / "metrics.csv").write_bytes(b"".join(lines[:2] + lines[5:]))  # rounds 2-4 lost
    assert resume(out) == 0
    assert (out / "metrics.csv").read_bytes() == before
    assert "(the file held 3 of them)" in capsys.readouterr().err


def test_rows_lost_mid_run_come_back_and_the_run_continues_as_if_uninterrupted(
    tmp_path: Path,
) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run(whole, 6)
    run(cut, 4)  # as if stopped after round 4 (its last checkpoint)
    (cut / "metrics.csv").unlink()
    assert resume(cut, "rounds=6") == 0
    assert (cut / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()


@pytest.mark.parametrize(
    ("name", "keep", "says"),
    [
        ("per_client.csv", None, "per_client.csv is missing"),
        ("timings.csv", 3, "timings.csv has no rows for rounds 3-6"),
    ],
)
def test_files_the_checkpoint_cannot_rebuild_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, keep: int | None, says: str
) -> None:
    out = tmp_path / "run"
    run(out, 6)
    path = out / name
    if keep is None:
        path.unlink()
    else:
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:keep]))
    left = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    assert resume(out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedhp: error: ")
    assert says in err and f"`fedhp run {out}/config.yaml --out {out} --overwrite`" in err
    assert sorted(p.name for p in out.iterdir()) == left  # nothing changed


def test_a_resume_removes_what_a_killed_atomic_write_left(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(out, 2)
    stale = out / ".plot.png.0123abcd.tmp"
    stale.write_bytes(b"half a png")
    unrelated = out / "notes.tmp"
    unrelated.write_text("mine")
    assert resume(out) == 0
    assert not stale.exists() and unrelated.exists()


SWEEP = [
    "--seeds",
    "0,1",
    "--grid",
    "algorithm.lr=0.05",
    *[a for a in FAST if not a.startswith("checkpoint_every")],
    "rounds=2",
]
RUN_FILES = {
    "config.yaml",
    "metrics.csv",
    "per_client.csv",
    "timings.csv",
    "summary.json",
    "plot.png",
    "final_state.pt",
    "checkpoint.pt",
    "checkpoint_time.json",
}
KILLER = """
import os, signal, sys
from pathlib import Path
import fedhp.engine.runner as runner
from fedhp.cli import main

calls = []
write = runner.{target}


def killed(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the second run, midway through writing its files
        (path,) = [a for a in args if isinstance(a, Path)]
        (path.parent / ".{name}.0badf00d.tmp").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGKILL)
    return write(*args, **kwargs)


runner.{target} = killed
sys.exit(main(sys.argv[1:]))
"""


def files_of(out: Path) -> dict[str, set[str]]:
    return {
        str(p.parent.relative_to(out)): {f.name for f in p.parent.iterdir()}
        for p in sorted(out.rglob("config.yaml"))
        if p.parent != out
    }


@pytest.mark.parametrize(
    ("target", "name"), [("plot_run", "plot.png"), ("save_final_state", "final_state.pt")]
)
def test_a_sweep_killed_while_writing_a_runs_files_completes_them(
    tmp_path: Path, target: str, name: str
) -> None:
    out = tmp_path / "sweep"
    args = ["sweep", "--out", str(out), *SWEEP]
    script = textwrap.dedent(KILLER.format(target=target, name=name))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    killed = subprocess.run([sys.executable, "-c", script, *args], env=env, check=False)
    assert killed.returncode == -signal.SIGKILL
    before = files_of(out)
    assert len(before) == 2 and any(files >= RUN_FILES for files in before.values())
    half = [files for files in before.values() if not files >= RUN_FILES]
    assert len(half) == 1 and "summary.json" not in half[0]  # summary.json: written last
    assert f".{name}.0badf00d.tmp" in half[0]

    assert main(args) == 0
    after = files_of(out)
    assert sorted(after) == sorted(before)
    assert all(files == RUN_FILES for files in after.values()), after
    assert (
        "1 kept (finished before), 1 resumed from its checkpoint" in (out / "sweep.log").read_text()
    )


def test_a_finished_run_missing_a_file_is_not_finished(tmp_path: Path) -> None:
    """A run folder with summary.json but without plot.png (what a sweep killed between the
    two wrote before summary.json came last) or metrics.csv is resumed, not kept."""
    out = tmp_path / "sweep"
    args = ["sweep", "--out", str(out), *SWEEP]
    assert main(args) == 0
    first, second = sorted(out.rglob("summary.json"))
    (first.parent / "plot.png").unlink()
    metrics = (second.parent / "metrics.csv").read_bytes()
    (second.parent / "metrics.csv").unlink()
    assert main(args) == 0
    assert (first.parent / "plot.png").is_file()
    assert (second.parent / "metrics.csv").read_bytes() == metrics
    assert "2 resumed from their checkpoints" in (out / "sweep.log").read_text()
