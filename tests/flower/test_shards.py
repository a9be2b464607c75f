"""The Flower backends' configuration checks read what the algorithm's options declare
(``federated``, ``flower_ready``, ``hierarchical``), not the algorithm's name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fedhp.algorithms import ALGORITHMS
from fedhp.config import resolve_config
from fedhp.errors import ConfigError
from fedhp.flower.shards import check_flower_config

FLOWER = ["backend=flower-sim"]


def options(**declared: bool) -> SimpleNamespace:
    """An algorithm's options as the checks see them: a flat, federated, Flower-ready method
    unless ``declared`` says otherwise."""
    return SimpleNamespace(
        **{"hierarchical": False, "federated": True, "flower_ready": True, **declared}
    )


def test_the_declared_properties_decide_not_the_name() -> None:
    cfg = resolve_config(None, [*FLOWER, "algorithm.name=fedavg"])
    check_flower_config(cfg, options())  # fedavg as declared: fine
    with pytest.raises(ConfigError, match="backend: fedavg is a non-federated reference row"):
        check_flower_config(cfg, options(federated=False))
    with pytest.raises(ConfigError, match="backend: fedavg does not run on flower-sim yet"):
        check_flower_config(cfg, options(flower_ready=False))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("centralized", "backend: centralized is a non-federated reference row"),
        ("pfedgp", "backend: pfedgp does not run on flower-sim yet"),
    ],
)
def test_the_methods_that_cannot_run_on_flower_say_so(name: str, message: str) -> None:
    cfg = resolve_config(None, [*FLOWER, f"algorithm.name={name}"])
    with pytest.raises(ConfigError, match=message):
        check_flower_config(cfg, ALGORITHMS.build(cfg.algorithm, "algorithm"))


def test_every_other_method_passes_the_method_checks() -> None:
    blocked = {"centralized", "pfedgp"}
    for name in ALGORITHMS.names():
        opts = ALGORITHMS.build({"name": name}, "algorithm")
        assert (opts.federated and opts.flower_ready) == (name not in blocked), name
