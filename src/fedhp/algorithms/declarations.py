"""Where an algorithm reads its behaviour flags: what its options class declares.

A method declares every flag on its options class (:class:`~fedhp.algorithms.options.
AlgorithmOptions` lists them with their defaults). What the round does (:data:`FLAGS`) the
algorithm reads as its own attributes (:class:`Declared`), resolved once per pair of classes
by :func:`declared_flags`, walking the algorithm's class chain from the most derived:

    for each algorithm class K (K = the algorithm's own class first, then its parents):
        a flag set in K's own body            (the surface up to 9d240f0: read, one warning)
        a flag K's options class declares     (K itself: the run's options; a parent: the class
                                               its ``options:`` annotation names)
    else the default on AlgorithmOptions

so a plugin's ``FedAvgM(FedAvg)`` with options of its own that declare nothing rounds like
FedAvg, as when the flags sat on the algorithm classes. ``folds_uploads`` is a promise about one
class's own code: it is read from the run's options class's own body, or the algorithm class's
(:meth:`~fedhp.algorithms.base.Algorithm.folds`), never inherited.
"""

from __future__ import annotations

import functools
import sys
from types import SimpleNamespace
from typing import Generic, TypeVar, cast, overload

from fedhp.algorithms import options as options_module

FLAGS = (
    "node_keys",
    "personal_on_node",
    "personal_needs_global",
    "client_outputs",
    "edge_outputs",
    "client_buffer_outputs",
    "edge_buffer_outputs",
    "bills_stragglers",
)
"""The flags of what a method's round does, read by its algorithm (``folds_uploads`` aside)."""
T = TypeVar("T")


class Declared(Generic[T]):
    """An algorithm's behaviour flag: ``algorithm.<flag>`` reads ``algorithm.declarations``
    (:func:`declared_flags` of its class and its options')."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Declared[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object | None, owner: type) -> Declared[T] | T:
        if obj is None:
            return self
        return cast(T, getattr(obj.declarations, self.name))  # type: ignore[attr-defined]


def set_in_body(cls: type, flag: str) -> bool:
    """Whether ``cls`` sets ``flag`` to a value in its own body (not code: a property or
    :class:`Declared`)."""
    return flag in vars(cls) and not isinstance(vars(cls)[flag], property | Declared)


@functools.cache
def declared_flags(algorithm: type, options: type) -> SimpleNamespace:
    """The round flags of an algorithm of class ``algorithm`` built from options of class
    ``options`` (the module docstring's rule)."""
    return SimpleNamespace(**{flag: _resolve(flag, algorithm, options) for flag in FLAGS})


def _resolve(flag: str, algorithm: type, options: type) -> object:
    for k in algorithm.__mro__:
        if set_in_body(k, flag):
            return vars(k)[flag]
        declaring = options if k is algorithm else _options_class_of(k)
        if declaring is not None and _declares(declaring, flag):
            return getattr(declaring, flag)
    return getattr(options_module.AlgorithmOptions, flag)


def _declares(options: type, flag: str) -> bool:
    """Whether a method's options class (or a parent of its, below the shared bases) declares
    ``flag``."""
    return any(flag in vars(k) for k in options.__mro__ if k.__module__ != options_module.__name__)


def _options_class_of(algorithm: type) -> type | None:
    """The options class an algorithm class names in its own ``options:`` annotation."""
    named = vars(algorithm).get("__annotations__", {}).get("options")
    if isinstance(named, str):
        named = getattr(sys.modules.get(algorithm.__module__), named, None)
    return named if isinstance(named, type) else None
