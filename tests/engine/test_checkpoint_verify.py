"""Verified checkpoints (issue 42): a digest of the content in every checkpoint, checked before
anything is used; ``checkpoint.prev.pt`` kept at every checkpoint; one-line errors that name the
file and the way out (``--from-previous``, ``--overwrite``), never deleting the damaged file."""

from __future__ import annotations

import os
import shutil
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import fedhp.engine.checkpoint as checkpoint
from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.engine.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    SET_ASIDE_FILE,
    TRAILER_LEN,
    CheckpointError,
    DamagedCheckpoint,
    content_digest,
    load_checkpoint,
    resumable,
)
from fedhp.engine.runner import run_experiment
from fedhp.errors import FedhpWarning
from tests.engine.test_checkpoint import FAST, Killed, kill_before_round, run, same_results


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run: 6 rounds, checkpoints at rounds 2, 4 and 6 (prev: round 4)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run(out)
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def entry_offset(path: Path, suffix: str) -> int:
    """Where the bytes of the zip entry ending in ``suffix`` (the largest such) start in
    ``path`` (a ``torch.save`` file is a zip archive, its entries stored uncompressed)."""
    with zipfile.ZipFile(path) as z:
        info = max(
            (i for i in z.infolist() if i.filename.endswith(suffix)), key=lambda i: i.file_size
        )
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def resume_error(folder: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """``fedhp run --resume folder``'s one error line (asserting exit code 2, no traceback)."""
    capsys.readouterr()
    assert main(["run", "--resume", str(folder), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedhp: error: "), err
    assert "Traceback" not in err
    return err


def offset_of(path: Path, where: str) -> int:
    """A byte of ``path``: the zip's first header, the pickle, the middle of the largest tensor,
    the content digest's hex, the zip's central directory and end record, the file digest."""
    data = path.read_bytes()
    if where == "start":
        return 0
    if where == "pickle":
        return entry_offset(path, "data.pkl") + 40
    if where == "tensor":
        with zipfile.ZipFile(path) as z:
            size = max(i.file_size for i in z.infolist() if "/data/" in i.filename)
        return entry_offset(path, "/data/0") + size // 2
    if where == "digest":
        return data.index(b"sha256:") + 20
    if where == "directory":  # the zip's list of entries: no content, read by torch
        return len(data) - TRAILER_LEN - 60
    if where == "trailer":
        return len(data) - 5
    assert where == "end"
    return len(data) - TRAILER_LEN - 10


@pytest.mark.parametrize(
    "where", ["start", "pickle", "tensor", "digest", "directory", "end", "trailer"]
)
def test_flipped_bytes_are_caught_before_use_and_the_file_is_kept(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    out = copy_run(finished, tmp_path / "run")
    path = out / CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    at = offset_of(path, where)
    data[at] ^= 0x01  # one bit
    path.write_bytes(bytes(data))
    metrics = (out / "metrics.csv").read_bytes()
    err = resume_error(out, capsys)
    assert f"{path}: damaged" in err
    assert f"fedhp run --resume {out} --from-previous" in err and "(round 4)" in err
    assert path.read_bytes() == bytes(data)  # kept, untouched
    assert (out / "metrics.csv").read_bytes() == metrics
    with pytest.raises(DamagedCheckpoint):
        load_checkpoint(path)


def test_a_flipped_tensor_byte_loads_without_the_digest_but_not_with_it(
    finished: Path, tmp_path: Path
) -> None:
    """What the digest adds: torch itself reads a checkpoint with a changed parameter byte."""
    path = copy_run(finished, tmp_path / "run") / CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    data[offset_of(path, "tensor")] ^= 0x40
    path.write_bytes(bytes(data))
    loaded = torch.load(path, weights_only=True)  # no complaint from torch
    assert loaded["digest"] != content_digest(loaded)
    with pytest.raises(DamagedCheckpoint, match="bytes do not match the file's digest"):
        load_checkpoint(path)


@pytest.mark.parametrize("cut", ["all", "all but 200", "half", "the last byte"])
def test_truncated_checkpoints_are_one_line(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: str
) -> None:
    out = copy_run(finished, tmp_path / "run")
    path = out / CHECKPOINT_FILE
    whole = path.read_bytes()
    keep = {"all": 0, "all but 200": 200, "half": len(whole) // 2, "the last byte": len(whole) - 1}
    path.write_bytes(whole[: keep[cut]])
    err = resume_error(out, capsys)
    assert "damaged" in err and "--from-previous" in err
    assert path.read_bytes() == whole[: keep[cut]]


def test_damaged_previous_checkpoint_too_names_the_restart(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = copy_run(finished, tmp_path / "run")
    for name in (CHECKPOINT_FILE, PREVIOUS_FILE):
        (out / name).write_bytes((out / name).read_bytes()[:-100])
    err = resume_error(out, capsys)
    assert "checkpoint.prev.pt is unusable too" in err
    assert f"fedhp run {out / 'config.yaml'} --out {out} --overwrite" in err
    err = resume_error(out, capsys, "--from-previous")
    assert "no previous checkpoint" in err and "--overwrite" in err
    assert {p.name for p in out.glob("checkpoint*.pt")} == {CHECKPOINT_FILE, PREVIOUS_FILE}


def test_a_checkpoint_of_another_config_is_refused_and_kept(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    run(other, "seed=7")
    out = copy_run(finished, tmp_path / "run")
    shutil.copyfile(other / CHECKPOINT_FILE, out / CHECKPOINT_FILE)
    err = resume_error(out, capsys)
    assert "different configuration (seed differs)" in err
    assert (out / CHECKPOINT_FILE).read_bytes() == (other / CHECKPOINT_FILE).read_bytes()


def test_each_checkpoint_keeps_the_previous_one(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rounds: list[tuple[int, int | None]] = []
    real = checkpoint.atomic_checkpoint_save

    def save(obj: object, path: Path) -> None:
        real(obj, path)
        prev = path.with_name(PREVIOUS_FILE)
        if path.name == CHECKPOINT_FILE:
            rounds.append(
                (
                    load_checkpoint(path)["round"],
                    load_checkpoint(prev)["round"] if prev.exists() else None,
                )
            )

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "atomic_checkpoint_save", save)
        run(out)
    assert rounds == [(2, None), (4, 2), (6, 4)]
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "copy"])
def test_crash_between_the_two_writes_resumes_to_the_uninterrupted_run(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    """Killed after checkpoint.pt became checkpoint.prev.pt and before the new checkpoint.pt
    replaced it: both names hold the round-2 checkpoint, and a resume gives the same results
    as a run never interrupted (with and without hard links on the file system)."""
    out = tmp_path / "run"
    real = checkpoint.atomic_checkpoint_save

    def dying_save(obj: object, path: Path) -> None:
        if path.name == CHECKPOINT_FILE and isinstance(obj, dict) and obj["round"] == 4:
            raise Killed
        real(obj, path)

    def no_link(src: object, dst: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(checkpoint, "atomic_checkpoint_save", dying_save)
    if not links:
        monkeypatch.setattr(checkpoint.os, "link", no_link)
    with pytest.raises(Killed):
        run(out)
    monkeypatch.undo()
    assert load_checkpoint(out / CHECKPOINT_FILE)["round"] == 2
    assert load_checkpoint(out / PREVIOUS_FILE)["round"] == 2
    assert os.path.samefile(out / CHECKPOINT_FILE, out / PREVIOUS_FILE) is links
    assert resumable(out)
    torch.manual_seed(12345)
    assert main(["run", "--resume", str(out)]) == 0
    same_results(finished, out)


def test_from_previous_resumes_to_the_uninterrupted_run(
    finished: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Killed before round 5 (checkpoints of rounds 4 and 2), checkpoint.pt then damaged:
    --resume refuses it in one line; --from-previous continues from round 2, keeps the damaged
    file as checkpoint.set-aside.pt, and ends with the uninterrupted run's results."""
    out = tmp_path / "run"
    kill_before_round(build_experiment(resolve_config(None, FAST)), out, 4, monkeypatch)
    path = out / CHECKPOINT_FILE
    assert load_checkpoint(path)["round"] == 4
    assert load_checkpoint(out / PREVIOUS_FILE)["round"] == 2
    damaged = bytearray(path.read_bytes())
    at = offset_of(path, "tensor")
    damaged[at : at + 200] = bytes(b ^ 0xFF for b in damaged[at : at + 200])  # 200 bytes flipped
    path.write_bytes(bytes(damaged))
    err = resume_error(out, capsys)
    assert "(round 2)" in err and f"fedhp run --resume {out} --from-previous" in err
    torch.manual_seed(12345)
    assert main(["run", "--resume", str(out), "--from-previous"]) == 0
    err = capsys.readouterr().err
    assert f"kept as {SET_ASIDE_FILE}" in err and err.count("\n") == 1
    assert (out / SET_ASIDE_FILE).read_bytes() == bytes(damaged)
    same_results(finished, out)


def test_resume_without_a_checkpoint_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    kill_before_round(build_experiment(resolve_config(None, FAST)), out, 1, monkeypatch)
    assert (out / "config.yaml").is_file() and not (out / CHECKPOINT_FILE).exists()
    err = resume_error(out, capsys)
    assert "holds no checkpoint" in err and "round 2" in err
    assert f"fedhp run {out / 'config.yaml'} --out {out} --overwrite" in err
    assert (out / "metrics.csv").is_file()  # nothing deleted
    # The suggested restart works.
    capsys.readouterr()
    assert main(["run", str(out / "config.yaml"), "--out", str(out), "--overwrite"]) == 0
    # checkpoint.pt gone but checkpoint.prev.pt there: name --from-previous.
    (out / CHECKPOINT_FILE).unlink()
    err = resume_error(out, capsys)
    assert "no checkpoint.pt" in err and "--from-previous" in err and "(round 4)" in err


def test_from_previous_only_with_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["run", "--out", str(tmp_path / "x"), "--from-previous", *FAST]) == 2
    assert "only with --resume" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_resumable_checks_and_falls_back(finished: Path, tmp_path: Path) -> None:
    """The check ``fedhp reproduce`` and ``fedhp sweep`` call before resuming a run."""
    assert not resumable(tmp_path)
    out = copy_run(finished, tmp_path / "run")
    assert resumable(out)
    damaged = (out / CHECKPOINT_FILE).read_bytes()[:-1]
    (out / CHECKPOINT_FILE).write_bytes(damaged)
    assert not resumable(out)
    assert (out / CHECKPOINT_FILE).read_bytes() == damaged  # a check changes nothing
    with pytest.warns(FedhpWarning, match="kept as checkpoint.set-aside.pt"):
        assert resumable(out, fall_back=True)
    assert load_checkpoint(out / CHECKPOINT_FILE)["round"] == 4
    assert (out / SET_ASIDE_FILE).read_bytes() == damaged


def test_a_checkpoint_without_a_digest(finished: Path, tmp_path: Path) -> None:
    """Written before the digest (version 1): read, with a warning; a version-2 checkpoint that
    lost its digest is damaged; a changed entry under the old digest is damaged."""
    path = copy_run(finished, tmp_path / "run") / CHECKPOINT_FILE
    data = load_checkpoint(path)
    del data["digest"]
    data["version"] = 1
    torch.save(data, path)
    with pytest.warns(FedhpWarning, match="loaded unverified"):
        assert load_checkpoint(path)["round"] == 6
    data["version"] = 2
    torch.save(data, path)
    with pytest.raises(DamagedCheckpoint, match="digest is missing"):
        load_checkpoint(path)
    data = load_checkpoint(finished / CHECKPOINT_FILE)
    data["round"] = 5
    torch.save(data, path)
    with pytest.raises(DamagedCheckpoint, match="does not match"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "none.pt")


def test_digest_covers_disk_backed_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``state_storage: disk``: the per-client rows (theta) are in checkpoint.pt, under its
    digest; a byte changed in them is caught, and a damaged state/ file is harmless (a resume
    rewrites it from the verified checkpoint)."""
    args = [
        "progress=false",
        "threads=1",
        "model.name=mlr",
        "algorithm.name=sfedhp",
        "algorithm.theta_init=warm",
        "algorithm.R=2",
        "eval_every=2",
        "checkpoint_every=2",
        "state_storage=disk",
    ]
    whole, part = tmp_path / "whole", tmp_path / "part"
    run_experiment(build_experiment(resolve_config(None, [*args, "rounds=4"])), whole)
    run_experiment(build_experiment(resolve_config(None, [*args, "rounds=2"])), part)
    path = part / CHECKPOINT_FILE
    theta = load_checkpoint(path)["state"]["theta"]
    assert theta.numel() * 4 > max(
        v.numel() * 4 for k, v in load_checkpoint(path)["state"].items() if k != "theta"
    )
    clean = path.read_bytes()
    data = bytearray(clean)
    data[offset_of(path, "tensor")] ^= 0x01  # the largest tensor: theta
    path.write_bytes(bytes(data))
    err = resume_error(part, capsys, "rounds=4")
    assert "damaged (its bytes do not match the file's digest" in err
    path.write_bytes(clean)
    live = part / "state" / "theta.bin"
    live.write_bytes(b"\xff" * live.stat().st_size)  # NaNs in the working file
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedhpWarning)
        run_experiment(
            build_experiment(resolve_config(None, [*args, "rounds=4"])), part, resume=True
        )
    assert (part / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
