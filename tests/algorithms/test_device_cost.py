"""FedLPS's cost model: capability draws and T_k by hand."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms.device_cost import CAPABILITY_LEVELS, DeviceCost, draw_capabilities


def test_capabilities_come_from_the_levels_and_are_seeded() -> None:
    a = draw_capabilities(1000, torch.Generator().manual_seed(1))
    b = draw_capabilities(1000, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert set(a.tolist()) == set(CAPABILITY_LEVELS)  # all five levels appear in 1000 draws
    counts = torch.stack([(a == z).sum() for z in CAPABILITY_LEVELS])
    assert int(counts.min()) > 150  # roughly uniform (expected 200 each)


def test_client_and_round_seconds_by_hand() -> None:
    cost = DeviceCost()
    flops = torch.tensor([727e9, 727e9])
    z = torch.tensor([1.0, 0.25])
    up = torch.tensor([14.0e6, 0.0])
    down = torch.tensor([0.0, 110.6e6])
    t = cost.client_seconds(flops, z, up, down)
    assert t.tolist() == pytest.approx([1.0 + 1.0, 4.0 + 1.0])
    assert cost.round_seconds(t) == pytest.approx(5.0)
    assert cost.round_seconds(torch.zeros(0)) == 0.0


def test_capability_generator_is_seeded_from_the_run_and_leaves_it_alone() -> None:
    """The dense methods' capability stream: a function of the engine generator's seed only;
    making it draws nothing from the engine generator."""
    from fedhp.algorithms.device_cost import CAPABILITY_SEED_OFFSET, capability_generator

    engine = torch.Generator().manual_seed(1_000_003)
    before = engine.get_state()
    gen = capability_generator(engine)
    assert torch.equal(engine.get_state(), before)
    assert gen.initial_seed() == 1_000_003 + CAPABILITY_SEED_OFFSET
    again = capability_generator(torch.Generator().manual_seed(1_000_003))
    assert torch.equal(draw_capabilities(50, gen), draw_capabilities(50, again))
