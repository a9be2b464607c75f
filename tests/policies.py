"""Setting a model's execution policy in tests (instead of patching module constants)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fedhp.models.base import BatchedModel
from fedhp.models.policy import ExecutionPolicy


def use_policy(model: BatchedModel, **changes: Any) -> ExecutionPolicy:
    """Give ``model`` (and so every run context holding it) its current policy with
    ``changes`` (e.g. ``cache_floats=30``, ``clients_per_chunk=1``, ``direct_min_params=1``)."""
    model.policy = replace(model.policy, **changes)
    return model.policy
