"""``state_storage: disk`` (issue 15): per-client state in memory-mapped files gives the same run
as state in RAM, resumes bit-identically, and snapshots without a RAM copy."""

from __future__ import annotations

from pathlib import Path

import torch

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.disk_state import DiskState
from fedhp.engine.runner import run_experiment

SFEDHP = [
    "progress=false",
    "threads=1",
    "model.name=mlr",
    "algorithm.name=sfedhp",
    "algorithm.theta_init=warm",  # theta kept across rounds: a per-client state entry
    "algorithm.R=2",
    "eval_every=2",
    "checkpoint_every=2",
]


def run(out: Path, *overrides: str, resume: bool = False) -> None:
    exp = build_experiment(resolve_config(None, [*SFEDHP, *overrides]))
    run_experiment(exp, out, resume=resume)


def test_disk_state_is_the_memory_run_and_lives_in_files(tmp_path: Path) -> None:
    run(tmp_path / "mem", "rounds=4")
    run(tmp_path / "disk", "rounds=4", "state_storage=disk")
    for name in ("metrics.csv", "per_client.csv"):
        assert (tmp_path / "mem" / name).read_bytes() == (tmp_path / "disk" / name).read_bytes()
    mem = torch.load(tmp_path / "mem" / "final_state.pt", weights_only=True)
    disk = torch.load(tmp_path / "disk" / "final_state.pt", weights_only=True)
    assert torch.equal(mem["state"]["theta"], disk["state"]["theta"])
    files = sorted(p.name for p in (tmp_path / "disk" / "state").iterdir())
    assert files == ["theta.bin", "theta.snapshot.bin"]
    theta = disk["state"]["theta"]
    assert (tmp_path / "disk" / "state" / "theta.bin").stat().st_size == theta.numel() * 4


def test_disk_state_resumes_bit_identically(tmp_path: Path) -> None:
    run(tmp_path / "whole", "rounds=6", "state_storage=disk")
    run(tmp_path / "parts", "rounds=2", "state_storage=disk")
    run(tmp_path / "parts", "rounds=6", "state_storage=disk", resume=True)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert (whole / "metrics.csv").read_bytes() == (parts / "metrics.csv").read_bytes()


def test_rebind_copies_a_replaced_entry_back_into_its_file(tmp_path: Path) -> None:
    state = {"theta": torch.arange(6.0).reshape(2, 3)}
    disk = DiskState(tmp_path, ["theta"])
    disk.adopt(state)
    live = state["theta"]
    state["theta"] = torch.full((2, 3), 7.0)  # a method that replaced the tensor
    disk.rebind(state)
    assert state["theta"].data_ptr() == live.data_ptr()
    on_disk = torch.from_file(str(tmp_path / "theta.bin"), size=6, dtype=torch.float32)
    assert bool((on_disk == 7.0).all())
