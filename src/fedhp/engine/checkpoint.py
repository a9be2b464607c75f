"""Checkpoints: everything a run needs to continue bit-identically, written atomically.

``checkpoint.pt`` (``torch.save`` of a plain dict; loaded with ``weights_only=True``)::

    format    "fedhp-checkpoint"
    version   2 (1: written before the digest; still read, unverified)
    digest    "sha256:<hex>" of every other entry (:func:`content_digest`: each tensor's dtype,
              shape and bytes, every plain value exactly), checked before anything is used
    round     rounds completed (the next round to run is this one, 0-based)
    config    the resolved configuration (plain data) that produced it
    state     the algorithm's state dict, tensors on the CPU
    rng       generator states: "engine" (ctx.generator), "sampler" (when it is a separate
              generator), "torch" (global CPU RNG), "cuda" (when running on CUDA), and
              "algorithm.<attr>" for any torch.Generator an algorithm object holds
    ledger    CommLedger.state_dict()
    rows      the metrics rows written so far (for summary.json's best/final values, and to
              rebuild a metrics.csv that lost rows: :func:`check_result_files`)
    trained_samples
              samples of the gradient evaluations so far (``BatchedModel.trained_samples``,
              for summary.json's ``train_flops``; None where not known; absent in checkpoints
              written before it existed)
    privacy   only with ``privacy.enabled``: the DP accountant's state
              (``PrivacyAccountant.state_dict()``, plain data: the rounds composed so far)

Nothing wall-clock is in it, so the same run (resumed or not) writes the same bytes. The seconds
spent so far go to ``checkpoint_time.json`` (``{"round": n, "seconds": s}``), written right after
the checkpoint; a resumed run's reported seconds continue from it (0 if it is missing).

``final_state.pt`` holds ``{"format": "fedhp-final-state", "round": n, "state": {...}}``.

Both are written to a temporary file in the same folder, fsynced and renamed over the old file,
so a crash leaves the previous complete file or the new one, never a partial one.

Before a new checkpoint replaces ``checkpoint.pt``, the old one becomes ``checkpoint.prev.pt``
(a hard link, or a copy where the file system has none, renamed over the older one): at every
instant ``checkpoint.pt`` is a complete checkpoint, and a crash between the two writes leaves
both names on the same, older checkpoint. A checkpoint whose content does not match its digest
(flipped bits, a truncated file) is never used and never deleted: the one-line error names it
and the command that resumes from the previous one (``fedhp run --resume DIR --from-previous``,
:func:`use_previous`, which keeps the damaged file as ``checkpoint.set-aside.pt``). With
``state_storage: disk`` the per-client rows are part of ``checkpoint.pt`` (``torch.save`` reads
them from their mapped files), so the digest covers them; the files under ``state/`` are working
copies that a resume overwrites from the verified checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from fedhp.config import config_to_dict, normalized_config
from fedhp.config import with_added_defaults as with_added_defaults  # (re-exported)
from fedhp.engine.disk_state import DiskState
from fedhp.engine.experiment import EngineExperiment
from fedhp.errors import FedhpError, FedhpWarning
from fedhp.reporting import MetricsWriter, _atomic_write, _fsync_dir, read_rows, write_json_atomic

CHECKPOINT_FILE = "checkpoint.pt"
PREVIOUS_FILE = "checkpoint.prev.pt"
SET_ASIDE_FILE = "checkpoint.set-aside.pt"
CHECKPOINT_TIME_FILE = "checkpoint_time.json"
FINAL_STATE_FILE = "final_state.pt"
FORMAT = "fedhp-checkpoint"
VERSION = 2
UNVERIFIED_VERSION = 1  # written before the digest: read without one
DIGEST_KEY = "digest"
TRAILER_PREFIX = b"fedhp-sha256:"  # the zip comment that ends a checkpoint file
TRAILER_LEN = len(TRAILER_PREFIX) + 64

Row = dict[str, Any]
# Config keys a resumed run may change: none affects the numbers of the rounds already run.
RESUMABLE_KEYS = ("rounds", "progress", "mlflow")


class CheckpointError(FedhpError):
    """A checkpoint is unreadable or does not belong to the run being resumed."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint file that cannot be read or whose content does not match its digest."""


@dataclass
class Snapshot:
    """The complete state of a run after ``round`` rounds (tensors still on the run's device)."""

    round: int
    state: dict[str, torch.Tensor]
    rng: dict[str, torch.Tensor]
    ledger: dict[str, object]
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    trained_samples: int | None = 0
    privacy: dict[str, Any] | None = None  # the DP accountant's state (privacy.enabled)
    shared: frozenset[str] = frozenset()  # entries in snapshot files (state_storage: disk)

    def state_copy(self) -> dict[str, torch.Tensor]:
        """A fresh copy of the algorithm state (to continue from); the :attr:`shared` entries
        are the snapshot's own files, to be copied back into the live ones at once
        (:meth:`~fedhp.engine.disk_state.DiskState.rebind`)."""
        return {k: v if k in self.shared else v.clone() for k, v in self.state.items()}


def copy_state(
    state: dict[str, torch.Tensor], into: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """A copy of ``state``: the entries of ``into`` (snapshot files) written into them, the
    others cloned."""
    into = into or {}
    return {k: into[k].copy_(v) if k in into else v.detach().clone() for k, v in state.items()}


def _generators(exp: Any) -> dict[str, torch.Generator]:
    """Every random generator a run draws from, by a stable name."""
    ctx = exp.ctx
    gens: dict[str, torch.Generator] = {"engine": ctx.generator}
    if ctx.sampler.generator is not ctx.generator:
        gens["sampler"] = ctx.sampler.generator
    seen = {id(g) for g in gens.values()}
    for name, value in sorted(vars(exp.algorithm).items()):
        if isinstance(value, torch.Generator) and id(value) not in seen:
            gens[f"algorithm.{name}"] = value
            seen.add(id(value))
    return gens


def rng_states(exp: Any) -> dict[str, torch.Tensor]:
    """Current states of all generators of ``exp`` plus torch's global RNG(s)."""
    out = {name: g.get_state() for name, g in _generators(exp).items()}
    out["torch"] = torch.get_rng_state()
    if exp.ctx.device.type == "cuda":
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"cuda{i}"] = s
    return out


def restore_rng(exp: Any, states: dict[str, torch.Tensor]) -> None:
    """Put every generator of ``exp`` back into the saved ``states``."""
    gens = _generators(exp)
    missing = sorted(set(gens) - set(states))
    if missing:
        raise CheckpointError(f"checkpoint lacks the state of generator(s) {', '.join(missing)}")
    for name, g in gens.items():
        g.set_state(states[name].to("cpu"))
    torch.set_rng_state(states["torch"].to("cpu"))
    cuda = [states[k] for k in sorted(states) if k.startswith("cuda")]
    if cuda and exp.ctx.device.type == "cuda":
        torch.cuda.set_rng_state_all([s.to("cpu") for s in cuda])


def capture(
    exp: Any,
    state: dict[str, torch.Tensor],
    rnd: int,
    rows: list[Row],
    seconds: float,
    trained_samples: int | None = None,
    privacy: dict[str, Any] | None = None,
    *,
    into: dict[str, torch.Tensor] | None = None,
) -> Snapshot:
    """A :class:`Snapshot` of the run after ``rnd`` rounds (copies the state; ``into``: the
    snapshot files of disk-backed entries); ``trained_samples``: the samples trained so far
    (None: not known); ``privacy``: the DP accountant's state (None: no DP)."""
    return Snapshot(
        round=rnd,
        state=copy_state(state, into),
        rng=rng_states(exp),
        ledger=exp.ctx.ledger.state_dict(),
        rows=list(rows),
        seconds=seconds,
        trained_samples=trained_samples,
        privacy=privacy,
        shared=frozenset(into or ()),
    )


def _cpu_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def atomic_torch_save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file, fsync, then rename over ``path``."""
    _atomic_write(Path(path), lambda fh: torch.save(obj, fh))


def _feed(h: Any, value: object) -> None:
    """Hash ``value`` into ``h`` unambiguously (a type tag and length before each item)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, Mapping):
        h.update(f"D{len(value)};".encode())
        for key, item in value.items():
            _feed(h, key)
            _feed(h, item)
    elif isinstance(value, list | tuple):
        h.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)};".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(f"S{len(data)};".encode())
        h.update(data)
    elif isinstance(value, bytes):
        h.update(f"B{len(value)};".encode())
        h.update(value)
    elif isinstance(value, bool) or value is None:
        h.update(f"{value};".encode())
    elif isinstance(value, int):
        h.update(f"i{value};".encode())
    elif isinstance(value, float):
        h.update(f"f{value.hex()};".encode())
    else:  # torch.dtype, torch.device and the like
        h.update(f"O{type(value).__qualname__}:{value!r};".encode())


def content_digest(data: Mapping[str, Any]) -> str:
    """``"sha256:<hex>"`` of every entry of a checkpoint's dict but the digest itself: each
    tensor's dtype, shape and bytes, every plain value exactly (independent of how
    ``torch.save`` lays the file out, so a resaved checkpoint keeps its digest)."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in data.items() if k != DIGEST_KEY})
    return f"sha256:{h.hexdigest()}"


def seal(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the current version and its :func:`content_digest` (in place)."""
    data["version"] = VERSION
    data[DIGEST_KEY] = content_digest(data)
    return data


def _append_trailer(fh: Any) -> None:
    """End the zip archive ``torch.save`` just wrote to ``fh`` (opened ``r+b``) with a comment
    holding the sha256 of every byte before it (left without one if the archive does not end
    in a comment-less end-of-central-directory record)."""
    size = fh.seek(0, os.SEEK_END)
    fh.seek(size - 22)
    end = fh.read(22)
    if len(end) != 22 or end[:4] != b"PK\x05\x06" or end[20:22] != b"\x00\x00":
        return
    fh.seek(size - 2)
    fh.write(struct.pack("<H", TRAILER_LEN))  # the comment's length, under the digest too
    fh.seek(0)
    h = hashlib.sha256()
    while chunk := fh.read(1 << 20):
        h.update(chunk)
    fh.write(TRAILER_PREFIX + h.hexdigest().encode())


def _file_digest_matches(path: Path) -> bool | None:
    """Whether the bytes of ``path`` match the digest in its trailer (None: no trailer)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size < TRAILER_LEN + 22:
            return None
        fh.seek(size - TRAILER_LEN)
        trailer = fh.read()
        if not trailer.startswith(TRAILER_PREFIX):
            return None
        fh.seek(0)
        h, left = hashlib.sha256(), size - TRAILER_LEN
        while left > 0:
            chunk = fh.read(min(left, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return trailer[len(TRAILER_PREFIX) :] == h.hexdigest().encode()


def atomic_checkpoint_save(obj: object, path: Path) -> None:
    """``torch.save`` of a checkpoint's dict to a temporary file, the file's digest appended
    (:func:`_append_trailer`), fsync, then rename over ``path``."""

    def write(fh: BinaryIO) -> None:
        torch.save(obj, fh)
        _append_trailer(fh)

    _atomic_write(Path(path), write)


def save_checkpoint_data(path: Path, data: dict[str, Any]) -> None:
    """Seal ``data`` (a checkpoint's dict, e.g. one read with :func:`load_checkpoint` and
    changed) and write it to ``path`` atomically, with no rotation."""
    atomic_checkpoint_save(seal(data), path)


def _replace_with_link(source: Path, target: Path) -> None:
    """Make ``target`` the same file as ``source`` (a hard link, or a copy where the file system
    has none), replacing ``target`` atomically."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        try:
            os.link(source, tmp)
        except OSError:  # no hard links here (FAT, some network file systems): copy
            with open(source, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def keep_previous(path: Path) -> None:
    """The checkpoint at ``path`` (if any) becomes ``checkpoint.prev.pt`` too, atomically; the
    first of a checkpoint's two writes (:func:`save_checkpoint`)."""
    path = Path(path)
    if path.is_file():
        _replace_with_link(path, path.with_name(PREVIOUS_FILE))


def save_checkpoint(path: Path, snap: Snapshot, config: dict[str, Any], keep: bool = True) -> None:
    """Write ``snap`` (with the run's resolved ``config``) to ``path`` atomically, with its
    digest; ``keep``: the checkpoint it replaces becomes ``checkpoint.prev.pt`` first."""
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "round": snap.round,
        "config": config,
        "state": _cpu_state(snap.state),
        "rng": {k: v.to("cpu") for k, v in snap.rng.items()},
        "ledger": snap.ledger,
        "rows": snap.rows,
        "trained_samples": snap.trained_samples,
    }
    if snap.privacy is not None:
        data["privacy"] = snap.privacy
    path = Path(path)
    timing = _read_time(path)
    if keep:
        keep_previous(path)
    atomic_checkpoint_save(seal(data), path)
    entry: dict[str, Any] = {"round": snap.round, "seconds": snap.seconds}
    if keep and isinstance(timing.get("round"), int) and timing["round"] != snap.round:
        entry["previous"] = {"round": timing["round"], "seconds": timing.get("seconds", 0.0)}
    write_json_atomic(path.with_name(CHECKPOINT_TIME_FILE), entry)


def _read_time(path: Path) -> dict[str, Any]:
    """``checkpoint_time.json`` beside ``path`` ({} where missing or unreadable)."""
    try:
        data = json.loads(Path(path).with_name(CHECKPOINT_TIME_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_seconds(path: Path, rnd: int | None = None) -> float:
    """Wall-clock seconds spent up to the checkpoint at ``path`` (its ``checkpoint_time.json``;
    ``rnd``: the checkpoint's round, also found under ``previous`` after a resume from
    ``checkpoint.prev.pt``; 0 where missing or unreadable: timings are reported, never
    compared)."""
    data = _read_time(path)
    for entry in (data, data.get("previous")):
        if isinstance(entry, dict) and (rnd is None or entry.get("round") == rnd):
            try:
                return float(entry["seconds"])
            except (KeyError, TypeError, ValueError):
                return 0.0
    return 0.0


def save_final_state(path: Path, state: dict[str, torch.Tensor], rounds: int) -> None:
    """The final parameters (the algorithm's state dict) as ``final_state.pt``."""
    atomic_torch_save(
        {"format": "fedhp-final-state", "round": rounds, "state": _cpu_state(state)}, path
    )


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Read ``path`` and verify its digest, then its format; raises :class:`DamagedCheckpoint`
    (unreadable, truncated, content that does not match the digest) or a one-line
    :class:`CheckpointError` (missing, not a fedhp checkpoint, another version)."""
    path = Path(path)
    try:
        whole = _file_digest_matches(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found") from None
    if whole is False:
        raise DamagedCheckpoint(
            f"{path}: damaged (its bytes do not match the file's digest: changed on disk)"
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for corrupt zip/pickle data
        raise DamagedCheckpoint(
            f"{path}: damaged (unreadable, {type(err).__name__}: corrupt or truncated)"
        ) from None
    if not isinstance(data, dict):
        raise DamagedCheckpoint(f"{path}: damaged (not the dict a fedhp checkpoint holds)")
    if DIGEST_KEY in data:
        if data[DIGEST_KEY] != content_digest(data):
            raise DamagedCheckpoint(
                f"{path}: damaged (its content does not match its digest: changed on disk)"
            )
    elif data.get("format") == FORMAT and data.get("version") != UNVERIFIED_VERSION:
        raise DamagedCheckpoint(f"{path}: damaged (its digest is missing)")
    if whole is None and data.get("version") == VERSION:
        raise DamagedCheckpoint(f"{path}: damaged (the file's digest is missing: truncated?)")
    if data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a fedhp checkpoint")
    if data.get("version") not in (UNVERIFIED_VERSION, VERSION):
        raise CheckpointError(
            f"{path}: checkpoint version {data.get('version')!r}; this fedhp reads "
            f"{UNVERIFIED_VERSION} and {VERSION}"
        )
    keys = ("round", "config", "state", "rng", "ledger", "rows")
    missing = [k for k in keys if k not in data]
    if missing:
        raise DamagedCheckpoint(
            f"{path}: damaged (incomplete checkpoint: missing {', '.join(missing)})"
        )
    if data.get("version") == UNVERIFIED_VERSION:
        warnings.warn(
            f"{path}: written before checkpoints carried a digest; loaded unverified",
            FedhpWarning,
            stacklevel=2,
        )
    return data


def restart_command(folder: Path) -> str:
    """The command that starts the run in ``folder`` again from round 0."""
    return f"fedhp run {folder / 'config.yaml'} --out {folder} --overwrite"


def _previous_round(folder: Path) -> tuple[int | None, str]:
    """The round of ``folder``'s previous checkpoint (None if it is missing or damaged) and,
    for None, why."""
    prev = folder / PREVIOUS_FILE
    if not prev.is_file():
        return None, f"{PREVIOUS_FILE} is missing"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FedhpWarning)
            return int(read_checkpoint(prev)["round"]), ""
    except CheckpointError as err:
        return None, f"{PREVIOUS_FILE} is unusable too ({str(err).partition(': ')[2]})"


def recovery_hint(path: Path) -> str:
    """What to do about the damaged checkpoint ``path``: resume from the previous checkpoint
    (``--from-previous``) or, with none usable, restart the run."""
    path = Path(path)
    folder = path.parent
    if path.name == CHECKPOINT_FILE:
        rnd, why = _previous_round(folder)
        if rnd is not None:
            return (
                f"the file is kept as it is; resume from the previous checkpoint (round {rnd}) "
                f"with `fedhp run --resume {folder} --from-previous`"
            )
        return f"the file is kept as it is; {why}: restart the run with `{restart_command(folder)}`"
    return f"the file is kept as it is; restart the run with `{restart_command(folder)}`"


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read, verify (digest) and sanity-check a checkpoint, or raise a one-line
    :class:`CheckpointError`; a damaged one's message names what to do next
    (:func:`recovery_hint`)."""
    try:
        return read_checkpoint(path)
    except DamagedCheckpoint as err:
        raise DamagedCheckpoint(f"{err}; {recovery_hint(Path(path))}") from None


def resumable(folder: Path, fall_back: bool = False) -> bool:
    """Whether ``folder`` holds a checkpoint a resumed run can start from: ``checkpoint.pt``
    verified (digest, format). With ``fall_back``, a missing or damaged ``checkpoint.pt`` whose
    ``checkpoint.prev.pt`` verifies is replaced by it (:func:`use_previous`, which keeps the
    damaged file and warns) and the answer is True. For callers that resume a run when they
    can (``fedhp reproduce``, ``fedhp sweep``: ``run_built(exp, folder,
    resume=resumable(folder, fall_back=True))``); the configuration is checked on restore."""
    folder = Path(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedhpWarning)
        try:
            read_checkpoint(folder / CHECKPOINT_FILE)
            return True
        except CheckpointError:
            if not fall_back or _previous_round(folder)[0] is None:
                return False
    use_previous(folder)
    return True


def _set_aside_name(folder: Path) -> Path:
    """``checkpoint.set-aside.pt``, or ``checkpoint.set-aside.<n>.pt`` if that is taken."""
    path, n = folder / SET_ASIDE_FILE, 1
    while path.exists():
        path, n = folder / f"checkpoint.set-aside.{n}.pt", n + 1
    return path


def use_previous(folder: Path) -> int:
    """Make ``folder``'s ``checkpoint.prev.pt`` its checkpoint: a ``checkpoint.pt`` that is
    another file is kept as ``checkpoint.set-aside.pt`` (renamed, never deleted; a warning line
    says so), then ``checkpoint.pt`` becomes the previous checkpoint (a link or copy). Returns
    its round; raises a one-line :class:`CheckpointError` if there is no usable one."""
    folder = Path(folder)
    current, prev = folder / CHECKPOINT_FILE, folder / PREVIOUS_FILE
    rnd, why = _previous_round(folder)
    if rnd is None:
        raise CheckpointError(
            f"{folder}: no previous checkpoint to resume from ({why}); "
            f"restart the run with `{restart_command(folder)}`"
        )
    if current.is_file() and not os.path.samefile(current, prev):
        aside = _set_aside_name(folder)
        os.replace(current, aside)
        warnings.warn(
            f"{current} kept as {aside.name}; resuming from {PREVIOUS_FILE} (round {rnd})",
            FedhpWarning,
            stacklevel=2,
        )
    _replace_with_link(prev, current)
    return rnd


def check_resume(folder: Path, checkpoint_every: int, from_previous: bool = False) -> int:
    """Before ``fedhp run --resume``: the round the run in ``folder`` continues from, or a
    one-line :class:`CheckpointError`: no checkpoint at all (restart with ``--overwrite``),
    a damaged one (resume ``--from-previous``), or with ``from_previous`` no usable previous
    one. Changes no file (:func:`use_previous` does, once the run is built)."""
    folder = Path(folder)
    current = folder / CHECKPOINT_FILE
    if from_previous:
        rnd, why = _previous_round(folder)
        if rnd is None:
            raise CheckpointError(
                f"--from-previous: {folder}: no previous checkpoint ({why}); resume from "
                f"{CHECKPOINT_FILE} with `fedhp run --resume {folder}`, or restart the run with "
                f"`{restart_command(folder)}`"
            )
        return rnd
    if not current.is_file():
        rnd, _ = _previous_round(folder)
        if rnd is not None:
            raise CheckpointError(
                f"--resume {folder}: no {CHECKPOINT_FILE}; resume from the previous checkpoint "
                f"(round {rnd}) with `fedhp run --resume {folder} --from-previous`"
            )
        why = (
            "checkpoint_every=0 writes none"
            if checkpoint_every == 0
            else f"the run stopped before its first one, at round {checkpoint_every}"
        )
        raise CheckpointError(
            f"--resume {folder}: holds no checkpoint to resume from ({why}); restart the run "
            f"with `{restart_command(folder)}`"
        )
    with warnings.catch_warnings():  # (an old checkpoint's warning comes once, on restore)
        warnings.simplefilter("ignore", FedhpWarning)
        data = load_checkpoint(current)
    rnd = int(data["round"])
    check_result_files(folder, list(data["rows"]), rnd)  # (before the data is loaded)
    return rnd


def _rounds_in(path: Path) -> list[int] | None:
    """The ``round`` of every row of the CSV file ``path`` (None: missing or unreadable)."""
    try:
        rows = read_rows(path)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return [int(r["round"]) for r in rows if isinstance(r.get("round"), int | float)]


def _spans(rounds: list[int]) -> str:
    """``5-20, 25`` for the sorted ``rounds``."""
    parts: list[str] = []
    start = prev = rounds[0]
    for r in [*rounds[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


CHECKED_FILES = ("per_client.csv", "timings.csv")
"""Result files with a row for every evaluated round that the checkpoint cannot rebuild (the
per-client rows are not in it; timings are wall-clock, never in it)."""


def check_result_files(folder: Path, rows: list[Row], rnd: int) -> bool:
    """Before a run in ``folder`` resumes from its checkpoint (after ``rnd`` rounds, metric rows
    ``rows``): a one-line :class:`CheckpointError` naming the file and the way out when
    ``per_client.csv`` or ``timings.csv`` is missing or lacks a round the checkpoint has
    evaluated; whether ``metrics.csv`` is missing or holds fewer rows up to ``rnd`` than the
    checkpoint (then :func:`rebuild_metrics` writes it back from them)."""
    folder = Path(folder)
    needed = {int(r["round"]) for r in rows if isinstance(r.get("round"), int | float)}
    for name in CHECKED_FILES if needed else ():
        have = _rounds_in(folder / name)
        missing = sorted(needed - set(have or ()))
        if missing:
            what = (
                "is missing"
                if have is None
                else f"has no rows for round{'s' if len(missing) > 1 else ''} {_spans(missing)}"
            )
            raise CheckpointError(
                f"{folder / name} {what}, which the checkpoint (round {rnd}) cannot rebuild; "
                f"put the file back, or restart the run with `{restart_command(folder)}`"
            )
    have = _rounds_in(folder / "metrics.csv")
    return have is None or sum(r <= rnd for r in have) < len(rows)


def resumable_files(folder: Path) -> bool:
    """Whether the result files of ``folder`` are whole enough to resume from its checkpoint
    (:func:`check_result_files` refuses none; metrics.csv can always be rebuilt)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FedhpWarning)
            data = read_checkpoint(Path(folder) / CHECKPOINT_FILE)
        check_result_files(folder, list(data["rows"]), int(data["round"]))
    except CheckpointError:
        return False
    return True


def rebuild_metrics(folder: Path, rows: list[Row], rnd: int) -> None:
    """Write ``folder``'s ``metrics.csv`` from the checkpoint's metric ``rows`` (the same bytes
    the run wrote: same rows, same column order, same number format), with one warning line."""
    path = Path(folder) / "metrics.csv"
    had = _rounds_in(path)
    held = "was missing" if had is None else f"held {sum(r <= rnd for r in had)} of them"
    writer = MetricsWriter(path)
    writer.extend(rows)
    writer.flush()
    warnings.warn(
        f"{path}: its {len(rows)} rows up to round {rnd} rebuilt from {CHECKPOINT_FILE} (the "
        f"file {held})",
        FedhpWarning,
        stacklevel=2,
    )


def config_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first dotted key (other than :data:`RESUMABLE_KEYS`) whose value differs, or None;
    both sides in today's resolved form (:func:`normalized_config`: keys added since at their
    defaults, options the run does not read dropped)."""
    saved, current = normalized_config(saved), normalized_config(current)

    def walk(a: Any, b: Any, prefix: str) -> str | None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if not prefix and key in RESUMABLE_KEYS:
                    continue
                found = walk(a.get(key), b.get(key), f"{prefix}{key}.")
                if found is not None:
                    return found
            return None
        return None if a == b else prefix.rstrip(".")

    return walk(saved, current, "")


def restore_checkpoint(
    exp: EngineExperiment,
    state: dict[str, torch.Tensor],
    out_dir: Path,
    disk: DiskState | None = None,
) -> Snapshot | None:
    """Load ``out_dir``'s checkpoint into ``state`` (the run ``exp``'s, just initialized), the
    RNGs and the ledger, or raise a one-line :class:`CheckpointError` if it belongs to another
    run (None: no checkpoint yet). ``disk``: the run's per-client rows on disk."""
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
    rows = list(data["rows"])
    if check_result_files(out_dir, rows, int(data["round"])):  # (refuses what it cannot rebuild)
        rebuild_metrics(out_dir, rows, int(data["round"]))
    restore_rng(exp, data["rng"])
    exp.ctx.ledger.load_state_dict(data["ledger"])
    return Snapshot(
        round=int(data["round"]),
        state=copy_state(state, None if disk is None else disk.snapshot),
        rng=data["rng"],
        ledger=data["ledger"],
        rows=rows,
        seconds=checkpoint_seconds(path, int(data["round"])),
        trained_samples=data.get("trained_samples"),
        privacy=data.get("privacy"),
        shared=frozenset(() if disk is None else disk.snapshot),
    )
