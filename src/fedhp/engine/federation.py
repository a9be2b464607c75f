"""All clients' data resident as tensors: compact (concatenated) storage plus per-client offsets.

Minibatches are gathered by index for all clients at once; nothing is padded in memory, and
per-client evaluation gathers fixed-width windows with a validity mask. Features may be a sparse
COO tensor ``[N, d]`` (LibSVM data kept sparse): rows are then gathered with :func:`take_rows`.
Float targets (regression) keep their dtype; class labels are int64. Integer features (text as
uint8 character indices) keep their dtype; every other feature tensor is stored as float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedhp.data.public import PublicData
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
    noise_std: torch.Tensor | None = None  # [C]: resampled feature noise per client (or none)

    @property
    def counts(self) -> torch.Tensor:
        """Samples per client ``[C]``."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def max_count(self) -> int:
        return int(self.counts.max().item()) if self.counts.numel() else 0

    @staticmethod
    def from_parts(
        xs: Sequence[torch.Tensor],
        ys: Sequence[torch.Tensor],
        device: torch.device,
        noise_std: Sequence[float] = (),
    ) -> ClientTensors:
        counts = torch.tensor([int(y.shape[0]) for y in ys], dtype=torch.long)
        offsets = torch.zeros(len(ys) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(counts, 0)
        x_cat = torch.cat(list(xs))
        # Integer features (character indices of text data) keep their dtype; the rest is fp32.
        integer = not x_cat.is_sparse and not x_cat.is_floating_point()
        x = x_cat.to(device=device, dtype=x_cat.dtype if integer else torch.float32)
        y_cat = torch.cat(list(ys))
        y = y_cat.to(device=device, dtype=y_cat.dtype if y_cat.is_floating_point() else torch.long)
        owner = torch.repeat_interleave(torch.arange(len(ys)), counts).to(device)
        std = None
        if any(v > 0 for v in noise_std):
            std = torch.tensor(list(noise_std), dtype=torch.float32, device=device)
        return ClientTensors(x, y, offsets.to(device), owner, std)

    def gather(
        self,
        clients: torch.Tensor,
        local_idx: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Rows ``local_idx [C', B]`` (indices within each client) of ``clients [C']``.

        With per-client ``noise_std`` (NIID-Bench feature skew), every access adds fresh
        Gaussian noise of client c's std to its rows, drawn from ``generator`` (the run's
        checkpointed one, so runs stay deterministic and resumable)."""
        rows = self.offsets[clients].unsqueeze(1) + local_idx
        x = take_rows(self.x, rows)
        if self.noise_std is not None:
            if generator is None:
                raise ValueError("gather: this split adds resampled noise; pass the generator")
            std = self.noise_std[clients].view(-1, *[1] * (x.dim() - 1))
            noise = torch.randn(
                x.shape, generator=generator, dtype=x.dtype, device=generator.device
            )
            x = x + std * noise.to(x.device)
        return x, self.y[rows]

    def select(self, clients: torch.Tensor) -> ClientTensors:
        """The split of ``clients`` only, in that order (client i of the result is
        ``clients[i]``)."""
        starts, ends = self.offsets[clients].tolist(), self.offsets[clients + 1].tolist()
        rows = torch.cat(
            [torch.arange(a, b, device=self.x.device) for a, b in zip(starts, ends, strict=True)]
            or [torch.zeros(0, dtype=torch.long, device=self.x.device)]
        )
        counts = self.counts[clients]
        offsets = torch.zeros(len(clients) + 1, dtype=torch.long, device=self.offsets.device)
        offsets[1:] = torch.cumsum(counts, 0)
        owner = torch.repeat_interleave(torch.arange(len(clients), device=counts.device), counts)
        std = None if self.noise_std is None else self.noise_std[clients]
        return ClientTensors(self.x[rows], self.y[rows], offsets, owner.to(self.x.device), std)

    def _equal_count(self) -> int | None:
        """The common sample count of every client (dense features), or None."""
        counts = self.counts
        if self.x.is_sparse or counts.numel() == 0:
            return None
        first = int(counts[0])
        return first if first > 0 and bool((counts == first).all()) else None

    def windows(self, start: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions ``start .. start+width-1`` of every client: ``x [C,W,..]``, ``y``, ``valid``.

        Positions past a client's count repeat its last sample and are marked invalid. Where
        every client holds the same number of samples, a view of the rows (no copy)."""
        counts = self.counts
        equal = self._equal_count()
        if equal is not None and start + width <= equal:
            c = counts.shape[0]
            x = self.x.view(c, equal, *self.x.shape[1:])[:, start : start + width]
            y = self.y.view(c, equal)[:, start : start + width]
            return x, y, torch.ones(c, width, dtype=torch.bool, device=self.x.device)
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
    public: PublicData | None = None  # D_pub (``public`` config section), where asked for

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
                [c.train_x for c in clients],
                [c.train_y for c in clients],
                dev,
                [c.train_noise_std for c in clients],
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
