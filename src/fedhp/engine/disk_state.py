"""Per-client state rows in memory-mapped files, for state larger than RAM (issue 15).

With ``state_storage: disk`` a run keeps each per-client state tensor (``[C, P]``: sFedHP's
and pFedMe's ``theta``, SCAFFOLD's control variates, ...) in a file under ``state_dir``
(``torch.from_file(shared=True)``): the algorithms update its rows in place as usual, and the
operating system pages them in and out. The runner's per-round snapshot (what a skipped or
diverged round rolls back to) is a second file of the same size, overwritten each round, so no
``[C, P]`` copy is made in RAM. A method that replaces such a tensor instead of writing into it
gets its new value copied back into the file after the round (:meth:`DiskState.rebind`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch


def mapped_like(path: Path, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s shape and dtype backed by the file ``path`` (created or resized),
    holding ``like``'s values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    numel = like.numel()
    with open(path, "wb") as fh:
        fh.truncate(numel * like.element_size())
    out = torch.from_file(str(path), shared=True, size=numel, dtype=like.dtype)
    return out.view(like.shape).copy_(like)


class DiskState:
    """The run's disk-backed state entries (``keys``) in ``folder``: the live rows and their
    snapshot, one file each."""

    def __init__(self, folder: Path, keys: Iterable[str]) -> None:
        self.folder = folder
        self.keys = tuple(keys)
        self.live: dict[str, torch.Tensor] = {}
        self.snapshot: dict[str, torch.Tensor] = {}

    def adopt(self, state: dict[str, torch.Tensor]) -> None:
        """Move ``state``'s entries of :attr:`keys` (CPU tensors) into their files."""
        for key in self.keys:
            value = state[key]
            if value.device.type != "cpu":
                raise ValueError("state_storage: disk keeps CPU state only; use device=cpu")
            self.live[key] = mapped_like(self.folder / f"{key}.bin", value)
            self.snapshot[key] = mapped_like(self.folder / f"{key}.snapshot.bin", value)
            state[key] = self.live[key]

    def rebind(self, state: dict[str, torch.Tensor]) -> None:
        """Entries a method replaced (or a rollback restored) copied back into their files."""
        for key, live in self.live.items():
            value = state[key]
            if value.data_ptr() != live.data_ptr():
                state[key] = live.copy_(value)
