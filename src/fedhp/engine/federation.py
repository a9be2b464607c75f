"""All clients' data resident as tensors: compact (concatenated) storage plus per-client offsets.

Minibatches are gathered by index for all clients at once; nothing is padded in memory, and
per-client evaluation gathers fixed-width windows with a validity mask. Features may be a sparse
COO tensor ``[N, d]`` (LibSVM data kept sparse): rows are then gathered with :func:`take_rows`.
Float targets (regression) keep their dtype; class labels are int64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedhp.data.rows import slice_rows, take_rows
from fedhp.data.types import ClientData

__all__ = ["ClientTensors", "Federation", "slice_rows", "take_rows"]


@dataclass(frozen=True)
class ClientTensors:
    """One split (train, test or val) of every client, concatenated in client order."""

    x: torch.Tensor  # [N, *features]
    y: torch.Tensor  # [N] int64
    offsets: torch.Tensor  # [C + 1] int64: client c owns rows offsets[c] .. offsets[c+1]-1
    owner: torch.Tensor  # [N] int64: the client of each row

    @property
    def counts(self) -> torch.Tensor:
        """Samples per client ``[C]``."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def max_count(self) -> int:
        return int(self.counts.max().item()) if self.counts.numel() else 0

    @staticmethod
    def from_parts(
        xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], device: torch.device
    ) -> ClientTensors:
        counts = torch.tensor([int(y.shape[0]) for y in ys], dtype=torch.long)
        offsets = torch.zeros(len(ys) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(counts, 0)
        x = torch.cat(list(xs)).to(device=device, dtype=torch.float32)
        y_cat = torch.cat(list(ys))
        y = y_cat.to(device=device, dtype=y_cat.dtype if y_cat.is_floating_point() else torch.long)
        owner = torch.repeat_interleave(torch.arange(len(ys)), counts).to(device)
        return ClientTensors(x, y, offsets.to(device), owner)

    def gather(self, clients: torch.Tensor, local_idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rows ``local_idx [C', B]`` (indices within each client) of ``clients [C']``."""
        rows = self.offsets[clients].unsqueeze(1) + local_idx
        return take_rows(self.x, rows), self.y[rows]

    def windows(self, start: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions ``start .. start+width-1`` of every client: ``x [C,W,..]``, ``y``, ``valid``.

        Positions past a client's count repeat its last sample and are marked invalid."""
        counts = self.counts
        pos = torch.arange(start, start + width, device=self.x.device).unsqueeze(0)
        valid = pos < counts.unsqueeze(1)
        rows = self.offsets[:-1].unsqueeze(1) + torch.minimum(
            pos, (counts - 1).clamp(min=0)[:, None]
        )
        rows = rows.clamp(max=max(self.x.shape[0] - 1, 0))
        return take_rows(self.x, rows), self.y[rows], valid


@dataclass(frozen=True)
class Federation:
    """Every client's train/test/validation data on one device.

    ``true_params`` / ``true_support``: the generating model ``[P]`` and its support (bool ``[P]``)
    where the dataset knows them (the sparse-learning simulations), else None."""

    train: ClientTensors
    test: ClientTensors
    val: ClientTensors
    num_classes: int
    feature_shape: tuple[int, ...]
    true_params: torch.Tensor | None = None
    true_support: torch.Tensor | None = None

    @property
    def num_clients(self) -> int:
        return int(self.train.offsets.shape[0] - 1)

    @staticmethod
    def from_clients(
        clients: Sequence[ClientData], num_classes: int, device: torch.device | str = "cpu"
    ) -> Federation:
        dev = torch.device(device)
        return Federation(
            train=ClientTensors.from_parts(
                [c.train_x for c in clients], [c.train_y for c in clients], dev
            ),
            test=ClientTensors.from_parts(
                [c.test_x for c in clients], [c.test_y for c in clients], dev
            ),
            val=ClientTensors.from_parts(
                [c.val_x for c in clients], [c.val_y for c in clients], dev
            ),
            num_classes=num_classes,
            feature_shape=tuple(clients[0].train_x.shape[1:]),
        )
