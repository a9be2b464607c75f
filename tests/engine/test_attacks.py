"""Malicious clients (fedhp.engine.attacks): the fixed seeded set, each attack's upload against
its formula on small hand-made matrices, and label flipping."""

from __future__ import annotations

import pytest
import torch

from fedhp.config import AttackConfig
from fedhp.engine.attacks import Attack, alie_z, flip_labels, malicious_clients
from tests.algorithms.tiny import CLASSES, tiny_context

EDGES = torch.arange(10).repeat_interleave(10)  # 100 clients, 10 edges of 10


def cfg(name: str = "sign_flip", fraction: float = 0.2, **kw: object) -> AttackConfig:
    return AttackConfig.model_validate({"name": name, "fraction": fraction, **kw})


def test_malicious_set_is_fixed_by_the_seed_and_counts_floor_fraction() -> None:
    a = malicious_clients(cfg(), 0, EDGES)
    assert a.dtype == torch.bool and int(a.sum()) == 20
    assert torch.equal(a, malicious_clients(cfg(), 0, EDGES))  # same seed, same set
    assert not torch.equal(a, malicious_clients(cfg(), 1, EDGES))
    assert int(malicious_clients(cfg(fraction=0.29), 0, EDGES).sum()) == 29  # 0.29·100, not 28
    assert int(malicious_clients(cfg(fraction=0.15), 0, torch.zeros(7)).sum()) == 1
    # the set does not depend on the attack, so attacks compare on the same clients
    assert torch.equal(a, malicious_clients(cfg("alie"), 0, EDGES))
    for off in (cfg("none", 0.2), cfg(fraction=0.0)):
        assert not malicious_clients(off, 0, EDGES).any()


def test_spread_covers_edges_and_concentrated_fills_the_first_edges() -> None:
    spread = malicious_clients(cfg(), 0, EDGES)
    assert len(EDGES[spread].unique()) > 2  # drawn over all clients
    conc = malicious_clients(cfg(placement="concentrated"), 0, EDGES)
    assert torch.equal(conc.nonzero().flatten(), torch.arange(20))  # edges 0 and 1, whole
    assert torch.equal(conc, malicious_clients(cfg(placement="concentrated"), 5, EDGES))
    # edge order, not client order: clients of edge 0 first wherever they sit
    shuffled = torch.tensor([2, 0, 1, 0, 2, 1, 0, 1])
    got = malicious_clients(cfg(fraction=0.5, placement="concentrated"), 0, shuffled)
    assert got.nonzero().flatten().tolist() == [1, 2, 3, 6]  # edge 0: 1, 3, 6; edge 1: 2


# 5 uploads of 3 coordinates from a common start; clients 1 and 3 are malicious.
START = torch.tensor([1.0, -2.0, 0.5])
UPDATES = torch.tensor(
    [[0.1, 0.2, -0.3], [0.4, -0.1, 0.0], [0.2, 0.0, 0.1], [-0.5, 0.3, 0.2], [0.0, 0.1, 0.4]]
)
BAD = torch.tensor([False, True, False, True, False])


def attacked(name: str, start: torch.Tensor = START, rnd: int = 0, **kw: object) -> torch.Tensor:
    attack = Attack(cfg(name, 0.4, **kw), BAD, seed=0)
    attack.begin_round(rnd)
    return attack.apply(START + UPDATES, torch.arange(5), start)


def check_honest_rows_kept(out: torch.Tensor) -> None:
    assert torch.equal(out[~BAD], (START + UPDATES)[~BAD])


def test_sign_flip_and_boost_uploads() -> None:
    out = attacked("sign_flip", sign_scale=4.0)
    check_honest_rows_kept(out)
    torch.testing.assert_close(out[BAD], START - 4.0 * UPDATES[BAD])
    out = attacked("boost", boost=10.0)
    check_honest_rows_kept(out)
    torch.testing.assert_close(out[BAD], START + 10.0 * UPDATES[BAD])
    # a start per row (HierFAVG's clients start from their own edge's model)
    starts = torch.arange(15, dtype=torch.float32).view(5, 3)
    attack = Attack(cfg("sign_flip", 0.4, sign_scale=2.0), BAD, seed=0)
    out = attack.apply(starts + UPDATES, torch.arange(5), starts)
    torch.testing.assert_close(out[BAD], starts[BAD] - 2.0 * UPDATES[BAD])


def test_no_malicious_sender_returns_the_uploads_themselves() -> None:
    attack = Attack(cfg(), BAD, seed=0)
    uploads = START + UPDATES[[0, 2, 4]]
    assert attack.apply(uploads, torch.tensor([0, 2, 4]), START) is uploads
    label = Attack(cfg("label_flip", 0.4), BAD, seed=0)  # acts on labels, never on uploads
    uploads = START + UPDATES
    assert not label.on_uploads and label.apply(uploads, torch.arange(5), START) is uploads


def test_gaussian_upload_is_noise_of_std_sigma_reseeded_by_round() -> None:
    bad = torch.zeros(200, dtype=torch.bool)
    bad[::2] = True
    attack = Attack(cfg("gaussian", 0.5, noise_std=0.5), bad, seed=3)
    start = torch.full((5000,), 2.0)
    uploads = start + 0.01 * torch.ones(200, 5000)
    attack.begin_round(7)
    first = attack.apply(uploads, torch.arange(200), start)
    noise = first[bad] - start
    assert abs(float(noise.mean())) < 0.01 and abs(float(noise.std()) - 0.5) < 0.01
    assert torch.equal(first[~bad], uploads[~bad])
    attack.begin_round(7)  # the same round again (a resumed run): the same noise
    assert torch.equal(first, attack.apply(uploads, torch.arange(200), start))
    attack.begin_round(8)
    assert not torch.equal(first, attack.apply(uploads, torch.arange(200), start))
    other = Attack(cfg("gaussian", 0.5, noise_std=0.5), bad, seed=4)
    other.begin_round(7)
    assert not torch.equal(first, other.apply(uploads, torch.arange(200), start))


def test_alie_z_max_is_baruchs() -> None:
    # n = 10, f = 2: s = floor(10/2 + 1) - 2 = 4 supporters needed, z = Φ⁻¹(6/10)
    assert alie_z(10, 2) == pytest.approx(0.2533471, abs=1e-6)
    # Baruch et al.'s n = 50, m = 24: s = 2, z = Φ⁻¹(48/50) ≈ 1.75
    assert alie_z(50, 24) == pytest.approx(1.7506861, abs=1e-6)


@pytest.mark.parametrize("z", [None, 1.5])
def test_alie_upload_is_start_plus_benign_mean_minus_z_std(z: float | None) -> None:
    out = attacked("alie", z=z)
    check_honest_rows_kept(out)
    benign = UPDATES[~BAD]
    mu = benign.mean(0)
    sd = ((benign - mu) ** 2).sum(0).div(benign.shape[0] - 1).sqrt()  # unbiased, by hand
    # n = 5, f = 2: s = floor(5/2 + 1) - 2 = 1 supporter, z_max = Φ⁻¹(4/5)
    zz = z if z is not None else 0.8416212
    assert alie_z(5, 2) == pytest.approx(0.8416212, abs=1e-6)
    expected = START + mu - zz * sd
    torch.testing.assert_close(out[BAD], expected.expand(2, 3), rtol=1e-6, atol=1e-6)


def test_label_flip_changes_exactly_the_malicious_clients_labels() -> None:
    ctx = tiny_context(edge_sizes=(3, 2))
    train = ctx.fed.train
    bad = torch.tensor([False, True, False, False, True])
    flipped = flip_labels(train, bad, CLASSES)
    rows = bad[train.owner]
    assert torch.equal(flipped.y[rows], CLASSES - 1 - train.y[rows])
    assert torch.equal(flipped.y[~rows], train.y[~rows])
    assert torch.equal(flipped.x, train.x) and flipped.y.dtype == train.y.dtype
    assert int(rows.sum()) == 12
