"""``RunContext.local_sgd``, the one local-SGD entry point: minibatches drawn ahead
(``draw_ahead``) give what drawing them as the steps go gives, for every budget, with or
without a mask (the masked steps once ignored them: issue 33)."""

from __future__ import annotations

import pytest
import torch

from fedhp.engine.ops import LocalOptimizer, LocalWork
from fedhp.models.masks import num_units, param_mask
from fedhp.models.zoo import DNNOptions
from tests.engine.test_local_epochs import CLASSES, SHAPE, unequal_context

WORKS = {
    "steps": LocalWork(0.1, 4, 3),
    "epochs": LocalWork(0.1, 6, epochs=2),
    "momentum": LocalWork(0.1, 4, 3, optimizer=LocalOptimizer(0.9, 0.01)),
}


@pytest.mark.parametrize("masked", [False, True], ids=["dense", "masked"])
@pytest.mark.parametrize("work", list(WORKS))
def test_minibatches_drawn_ahead_are_the_ones_drawn_as_it_goes(work: str, masked: bool) -> None:
    model = DNNOptions(hidden=[8]).build(SHAPE, CLASSES)
    ctx = unequal_context(model)
    clients = ctx.all_clients
    start = torch.stack([model.init_params(s) for s in range(len(clients))])
    mask = None
    if masked:  # drop every other unit
        units = torch.ones(len(clients), num_units(model), dtype=torch.bool)
        units[:, ::2] = False
        mask = param_mask(model, units)
    state = ctx.generator.get_state()
    as_it_goes = ctx.local_sgd(start, clients, WORKS[work], mask=mask)
    ctx.generator.set_state(state)
    drawn = ctx.draw_ahead(clients, WORKS[work])
    # the generator has moved on: minibatches drawn now would differ from the ones ahead
    ahead = ctx.local_sgd(start, clients, WORKS[work], mask=mask, drawn=drawn)
    fresh = ctx.local_sgd(start, clients, WORKS[work], mask=mask)
    for got, want in zip(ahead, as_it_goes, strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(fresh[0], as_it_goes[0])
    expected_steps = 3 if WORKS[work].epochs is None else None
    if expected_steps is not None:
        assert as_it_goes[2].tolist() == [expected_steps] * len(clients)
    if mask is not None:
        assert bool((ahead[0][mask == 0] == 0).all())
