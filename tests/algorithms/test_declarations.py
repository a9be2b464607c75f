"""A method's behaviour flags are declared in one place, its options class (issue 44): no
built-in algorithm class sets one in its own body, and each registered method's algorithm reads
what its options class declares."""

from __future__ import annotations

import importlib
import pkgutil

import fedhp.algorithms as algorithms
from fedhp.algorithms.base import Algorithm
from fedhp.algorithms.declarations import FLAGS, set_in_body
from fedhp.algorithms.options import AlgorithmOptions


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _load_all() -> None:
    for module in pkgutil.iter_modules(algorithms.__path__):
        importlib.import_module(f"fedhp.algorithms.{module.name}")


def test_no_built_in_algorithm_class_sets_a_flag() -> None:
    _load_all()
    built_in = [c for c in _subclasses(Algorithm) if c.__module__.startswith("fedhp.")]
    assert len(built_in) >= 20
    set_here = {
        c.__name__: [k for k in (*FLAGS, "folds_uploads") if set_in_body(c, k)] for c in built_in
    }
    assert {name: keys for name, keys in set_here.items() if keys} == {}


def test_every_round_flag_has_its_default_on_the_options_base() -> None:
    """Each flag the algorithm reads has a declared default on :class:`AlgorithmOptions`, so a
    method that declares nothing reads the defaults."""
    for key in (*FLAGS, "folds_uploads"):
        assert key in vars(AlgorithmOptions), key


def test_a_subclass_with_options_of_its_own_rounds_like_its_parent() -> None:
    """d4acd93's tutorial FedAvgM: ``FedAvgM(FedAvg)`` built from ``FedAvgMOptions
    (AlgorithmOptions)``, which declares nothing, reads FedAvg's round flags (declared by
    FedAvgOptions, which FedAvg's ``options:`` names), as when they sat on the algorithm
    class; options of its own that declare a flag win."""
    from fedhp.algorithms.fedavg import FedAvg
    from tests.algorithms.tiny import tiny_context

    class FedAvgM(FedAvg):
        options: FedAvgMOptions  # type: ignore[assignment]

    class FedAvgMOptions(AlgorithmOptions):
        pass

    class Declaring(AlgorithmOptions):
        client_outputs = ("model", "velocity")

    ctx = tiny_context()
    plugin = FedAvgM(FedAvgMOptions(), ctx)
    assert plugin.client_outputs == ("model",) and plugin.client_buffer_outputs == ("buffers",)
    assert FedAvgM(Declaring(), ctx).client_outputs == ("model", "velocity")
    assert not plugin.folds()  # (a promise about FedAvg's own code: not inherited)
