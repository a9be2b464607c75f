"""``RunContext.local_sgd``, the one local-SGD entry point: minibatches drawn ahead
(``draw_ahead``) give what drawing them as the steps go gives, for every budget, with or
without a mask (the masked steps once ignored them: issue 33); the old surface's call stops
with one line. ``send`` / ``broadcast`` / ``multicast``: one send, billed per receiver."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhp.engine.context import OLD_LOCAL_SGD
from fedhp.engine.ops import LocalOptimizer, LocalWork
from fedhp.errors import ConfigError
from fedhp.models.masks import num_units, param_mask
from fedhp.models.zoo import DNNOptions
from tests.algorithms.tiny import tiny_context
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


@pytest.mark.parametrize("old", [(3, 4, 0.1, None), (3, 4, 0.1), (3, 4)], ids=["6", "5", "4"])
def test_the_old_local_sgd_surface_stops_with_one_line_naming_the_new(old: tuple[Any]) -> None:
    """A plugin's ``ctx.local_sgd(params, clients, steps, batch, lr, extra)`` (the surface
    before ``LocalWork``) stops with a one-line ConfigError, not a TypeError traceback."""
    model = DNNOptions(hidden=[8]).build(SHAPE, CLASSES)
    ctx = unequal_context(model)
    clients = ctx.all_clients
    start = model.init_params(0).expand(len(clients), -1)
    local_sgd: Any = ctx.local_sgd
    with pytest.raises(ConfigError) as raised:
        local_sgd(start, clients, *old)
    assert str(raised.value) == OLD_LOCAL_SGD and "\n" not in OLD_LOCAL_SGD
    assert "ctx.local_sgd(start, clients, LocalWork(lr, batch, steps), extra)" in OLD_LOCAL_SGD


def test_broadcast_and_multicast_bill_what_send_bills_for_the_copies() -> None:
    """One row to each of N nodes (``broadcast``), or each node its sender's row
    (``multicast``), is billed as ``send`` of the copies, and the receivers get the rows
    truncated at the zero threshold, once per sender."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 8, generator=g)
    rows[:, ::3] = 1e-4  # under the threshold: sent as zeros
    row_of, nodes = torch.tensor([2, 0, 0, 1, 2]), torch.arange(5)
    sent = tiny_context(zero_threshold=1e-3)
    want = sent.send("client_edge", "down", rows[row_of], nodes)
    multi = tiny_context(zero_threshold=1e-3)
    got = multi.multicast("client_edge", "down", rows, row_of, nodes)
    assert multi.ledger.end_round() == sent.ledger.end_round()
    assert torch.equal(got[row_of], want) and bool((got[:, ::3] == 0).all())
    sent = tiny_context(zero_threshold=1e-3)
    want = sent.send("client_cloud", "down", rows[1].expand(5, -1), nodes)
    broad = tiny_context(zero_threshold=1e-3)
    got = broad.broadcast("client_cloud", "down", rows[1], nodes)
    assert broad.ledger.end_round() == sent.ledger.end_round()
    assert got.shape == (8,) and torch.equal(got.expand(5, -1), want)
