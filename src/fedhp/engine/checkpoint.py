"""Checkpoints: everything a run needs to continue bit-identically, written atomically.

``checkpoint.pt`` (``torch.save`` of a plain dict; loaded with ``weights_only=True``)::

    format    "fedhp-checkpoint"
    version   1
    round     rounds completed (the next round to run is this one, 0-based)
    config    the resolved configuration (plain data) that produced it
    state     the algorithm's state dict, tensors on the CPU
    rng       generator states: "engine" (ctx.generator), "sampler" (when it is a separate
              generator), "torch" (global CPU RNG), "cuda" (when running on CUDA), and
              "algorithm.<attr>" for any torch.Generator an algorithm object holds
    ledger    CommLedger.state_dict()
    rows      the metrics rows written so far (for summary.json's best/final values)
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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedhp.config import config_to_dict, normalized_config, with_added_defaults
from fedhp.engine.disk_state import DiskState
from fedhp.engine.experiment import EngineExperiment
from fedhp.errors import FedhpError
from fedhp.reporting import _atomic_write, write_json_atomic

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_TIME_FILE = "checkpoint_time.json"
FINAL_STATE_FILE = "final_state.pt"
FORMAT = "fedhp-checkpoint"
VERSION = 1

Row = dict[str, Any]
# Config keys a resumed run may change: neither affects the numbers of rounds already run.
RESUMABLE_KEYS = ("rounds", "progress")


class CheckpointError(FedhpError):
    """A checkpoint is unreadable or does not belong to the run being resumed."""


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


def save_checkpoint(path: Path, snap: Snapshot, config: dict[str, Any]) -> None:
    """Write ``snap`` (with the run's resolved ``config``) to ``path`` atomically."""
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
    atomic_torch_save(data, path)
    write_json_atomic(
        Path(path).with_name(CHECKPOINT_TIME_FILE), {"round": snap.round, "seconds": snap.seconds}
    )


def checkpoint_seconds(path: Path) -> float:
    """Wall-clock seconds spent up to the checkpoint at ``path`` (its ``checkpoint_time.json``;
    0 where that is missing or unreadable: timings are reported, never compared)."""
    try:
        data = json.loads(Path(path).with_name(CHECKPOINT_TIME_FILE).read_text())
        return float(data["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def save_final_state(path: Path, state: dict[str, torch.Tensor], rounds: int) -> None:
    """The final parameters (the algorithm's state dict) as ``final_state.pt``."""
    atomic_torch_save(
        {"format": "fedhp-final-state", "round": rounds, "state": _cpu_state(state)}, path
    )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read and sanity-check a checkpoint, or raise a one-line :class:`CheckpointError`."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found") from None
    except Exception as err:  # torch raises many types for corrupt zip/pickle data
        kind = type(err).__name__
        raise CheckpointError(
            f"{path}: unreadable ({kind}; corrupt or truncated?); delete it to restart the run"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a fedhp checkpoint")
    if data.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {data.get('version')!r}; this fedhp reads {VERSION}"
        )
    keys = ("round", "config", "state", "rng", "ledger", "rows")
    missing = [k for k in keys if k not in data]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint (missing {', '.join(missing)})")
    return data


def config_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first dotted key (other than :data:`RESUMABLE_KEYS`) whose value differs, or None."""
    saved = with_added_defaults(saved)

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
