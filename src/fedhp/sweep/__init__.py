"""Sweeps: a paper's table as one job — grid points × seeds, batched (``fedhp sweep``,
docs/sweep.md).

``fedhp.sweep(...)`` runs one (:func:`fedhp.sweep.api.sweep`): this package is callable, so the
command's Python face keeps the command's name while its parts stay importable
(``fedhp.sweep.plan``, ``fedhp.sweep.lockstep``, ...)."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

__all__ = ["sweep"]

if TYPE_CHECKING:  # (the signature for type checkers; importing fedhp.sweep stays light)
    from fedhp.sweep.api import sweep
else:

    def sweep(*args: Any, **kwargs: Any) -> Any:
        """:func:`fedhp.sweep.api.sweep`."""
        from fedhp.sweep.api import sweep as run

        return run(*args, **kwargs)


class _CallableModule(types.ModuleType):
    """``fedhp.sweep(...)`` calls :func:`sweep`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
