"""Row gathering for feature tensors that may be dense or sparse COO ``[N, d]``."""

from __future__ import annotations

import torch


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[rows]`` for dense or sparse COO ``x [N, d]`` and integer ``rows`` of any shape."""
    if not x.is_sparse:  # index_select: the same rows as x[rows], about 3× faster on CPU
        return x.index_select(0, rows.reshape(-1)).view(*rows.shape, *x.shape[1:])
    picked = x.index_select(0, rows.reshape(-1))
    idx = picked._indices()
    lead = torch.unravel_index(idx[0], tuple(rows.shape))
    return torch.sparse_coo_tensor(
        torch.stack([*lead, idx[1]]),
        picked._values(),
        (*rows.shape, x.shape[1]),
        check_invariants=False,
    )


def slice_rows(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``x[start:stop]`` along the first dimension, for dense or sparse COO ``x``."""
    if not x.is_sparse:
        return x[start:stop]
    return x.index_select(0, torch.arange(start, min(stop, x.shape[0]), device=x.device))
