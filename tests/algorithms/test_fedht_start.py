"""Fed-HT's start (issue 42): x₀ = 0 for a linear model, the model's initialization (and one
warning) for a multi-layer model, which cannot learn from zeros."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.experiment import MODEL_SEED_OFFSET
from fedhp.errors import FedhpWarning

SMALL = ["partition.train_per_class=20", "partition.test_per_class=10", "progress=false"]


@pytest.mark.parametrize("name", ["fedht", "fediterht", "diht"])
def test_multi_layer_model_starts_from_its_initialization_with_one_warning(name: str) -> None:
    exp = build_experiment(
        resolve_config(None, [*SMALL, f"algorithm.name={name}", "model.name=dnn"])
    )
    init = exp.model.init_params(exp.cfg.seed + MODEL_SEED_OFFSET)
    with pytest.warns(FedhpWarning) as caught:
        state = exp.algorithm.init_state(init)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"algorithm.name={name}" in message and "2 layers" in message
    assert "docs/fedht.md" in message and "\n" not in message
    assert torch.equal(state["global"], init) and bool(state["global"].abs().sum() > 0)


def test_linear_model_starts_from_zero_without_a_warning() -> None:
    exp = build_experiment(resolve_config(None, [*SMALL, "algorithm.name=fedht", "model.name=mlr"]))
    init = exp.model.init_params(exp.cfg.seed + MODEL_SEED_OFFSET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedhpWarning)
        state = exp.algorithm.init_state(init)
    assert not bool(state["global"].any())
