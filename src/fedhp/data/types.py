"""Plain containers passed from the data layer to the engine."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DatasetArrays:
    """A whole dataset held in memory.

    ``*_x`` are float32 tensors ``[N, *feature_shape]`` (images as ``[N, C, H, W]``, already
    scaled/normalized; sparse COO ``[N, d]`` for LibSVM files read with ``sparse=true``); ``*_y``
    are int64 labels ``[N]`` in ``[0, num_classes)`` (float32 targets for regression).
    ``true_params`` / ``true_support``: the generating model ``[d]`` and its support (bool ``[d]``)
    where a simulation knows them.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    train_owner: torch.Tensor | None = None
    test_owner: torch.Tensor | None = None
    true_params: torch.Tensor | None = None
    true_support: torch.Tensor | None = None

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


@dataclass(frozen=True)
class ClientData:
    """One client's samples. ``val_*`` may be empty (0 rows) when no validation split is asked."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    train_noise_std: float = 0.0
    """Std of Gaussian noise added to this client's training features afresh at every access
    (NIID-Bench's feature skew; :meth:`fedhp.engine.federation.ClientTensors.gather`); 0: none."""

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])
