"""sFedHP's divergence hint names the stiffest step: λ·η1 (the edge step, ``edge_lr``) when
it is larger than λ·η2 (issue 43: λ = 15 with η1 = 0.8 was blamed on λ·η2)."""

from __future__ import annotations

from fedhp.algorithms.fedavg import FedAvgOptions
from fedhp.algorithms.pfedme import PFedMeOptions
from fedhp.algorithms.sfedhp import SFedHPOptions
from fedhp.engine.divergence import likely_cause


def test_edge_step_is_named_when_it_is_the_stiffest() -> None:
    hint = likely_cause(SFedHPOptions(lam=15, lr=0.05, edge_lr=0.8))
    assert hint.startswith("λ·η (edge_lr) = 12 too large")
    assert "algorithm.edge_lr=0.8" in hint and "algorithm.lam=15" in hint


def test_theta_step_is_named_when_it_is_the_stiffest() -> None:
    hint = likely_cause(SFedHPOptions(lam=15, lr=0.5, edge_lr=0.01))
    assert hint.startswith("λ·η = 7.5 too large") and "algorithm.lr=0.5" in hint


def test_separate_lambdas_pair_with_their_own_steps() -> None:
    hint = likely_cause(SFedHPOptions(lam=0.1, lam2=20, lr=0.05, edge_lr=0.5))
    assert hint.startswith("λ2·η (edge_lr) = 10 too large")


def test_other_methods_keep_the_lr_pairing() -> None:
    assert likely_cause(PFedMeOptions(lam=15, lr=0.5)).startswith("λ·η = 7.5 too large")
    assert likely_cause(FedAvgOptions(lr=3)).startswith("learning rate too large")
