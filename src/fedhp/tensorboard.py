"""``tensorboard: true``: every evaluated round's metrics as TensorBoard scalars.

Written to ``<run folder>/tensorboard`` (``tensorboard --logdir runs``) with
:class:`torch.utils.tensorboard.SummaryWriter`, which needs the optional ``tensorboard`` package
(``pip install 'fedhp[tensorboard]'``); without it a run asking for TensorBoard stops with a
one-line error before its first round. Tags group the metrics.csv columns: ``accuracy/``,
``loss/``, ``density/``, ``communication/`` (accumulated MB per link), ``other/``; the step is
the round. Events of an earlier run in the folder after this run's start (a resumed run: after its
checkpoint) are purged (``purge_step``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError

FOLDER = "tensorboard"


def tag(column: str) -> str | None:
    """The TensorBoard tag of a metrics.csv column (None: not logged)."""
    if column == "round" or column.startswith("round_"):
        return None
    if column.endswith("_acc"):
        return f"accuracy/{column}"
    if "loss" in column:
        return f"loss/{column}"
    if column.startswith("density"):
        return f"density/{column}"
    if column.startswith("cum_bytes_"):
        return f"communication/MB_{column.removeprefix('cum_bytes_')}"
    if column.startswith("cum_remark1_bits_"):
        return None
    return f"other/{column}"


MISSING = (
    "tensorboard: true needs the tensorboard package; install it with "
    "pip install 'fedhp[tensorboard]' (or set tensorboard=false)"
)


def require() -> None:
    """A one-line :class:`ConfigError` unless ``torch.utils.tensorboard`` can be used."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING) from None


class TensorBoardWriter:
    """Appends one evaluated round's row at a time, like :class:`~fedhp.reporting.MetricsWriter`."""

    def __init__(self, out_dir: Path, start_round: int = 0) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(MISSING) from None
        # Events of rounds after ``start_round`` (an earlier run in this folder, or the part of an
        # interrupted one after its checkpoint) are hidden by TensorBoard from now on.
        self._writer = SummaryWriter(str(Path(out_dir) / FOLDER), purge_step=start_round + 1)

    def append(self, row: Mapping[str, Any]) -> None:
        step = int(row["round"])
        for column, value in row.items():
            name = tag(column)
            if name is None or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            scale = 1e-6 if column.startswith("cum_bytes_") else 1.0
            self._writer.add_scalar(name, float(value) * scale, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
