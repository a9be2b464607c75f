"""The fused helpers compute exactly, bit for bit, what the straightforward formulas compute:
truncation, non-zero counts, the edge -> client broadcast and ``send_rows``."""

from __future__ import annotations

import pytest
import torch

import fedhp.comm.codec as comm
from fedhp.comm import count_nonzero, truncate
from fedhp.engine.fused import EdgeRows, count_sent, send_rows, truncate_
from tests.algorithms.tiny import tiny_context


def _awkward(rows: int = 6, width: int = 41, eps: float = 0.05) -> torch.Tensor:
    """Random rows with the entries a threshold can get wrong: exact zeros of both signs, values
    of exactly +-eps (as float32), just inside and outside it, NaN and infinities."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=g) * 0.1
    e = torch.tensor(eps, dtype=torch.float32)
    special = torch.tensor(
        [0.0, -0.0, float(e), -float(e), float(torch.nextafter(e, torch.tensor(1.0)))]
        + [float(torch.nextafter(e, torch.tensor(0.0))), float("nan"), float("inf"), -float("inf")]
    )
    x[0, : len(special)] = special
    x[1, -len(special) :] = special.flip(0)
    x[2] = 0.0
    return x


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_truncate_in_place_matches_truncate(eps: float) -> None:
    x = _awkward(eps=eps)
    expected = truncate(x, eps)
    out = torch.empty_like(x)
    assert truncate_(x, eps, out=out) is out
    same = x.clone()
    truncate_(same, eps)
    for got in (out, same):
        assert torch.equal(got.isnan(), expected.isnan())
        finite = ~expected.isnan()
        assert torch.equal(got[finite], expected[finite])
        assert torch.equal(got[finite].signbit(), expected[finite].signbit())  # +0.0, as sent


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_count_sent_matches_count_nonzero(eps: float) -> None:
    for x in (_awkward(eps=eps), truncate(_awkward(eps=eps), eps), torch.zeros(3, 7)):
        expected = count_nonzero(x, eps)
        got = count_sent(x, eps, torch.empty_like(x))
        assert got.dtype == torch.float32
        assert torch.equal(got.to(torch.int64), expected)
        out = torch.full((x.shape[0] + 2,), -1.0)
        count_sent(x.clone(), eps, torch.empty_like(x), out=out[1:-1])
        assert torch.equal(out[1:-1].to(torch.int64), expected) and out[0] == out[-1] == -1
        in_place = x.clone()  # the values themselves as scratch
        assert torch.equal(count_sent(in_place, eps, in_place).to(torch.int64), expected)


def test_count_sent_falls_back_for_wide_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows too wide for an exact float32 sum are counted by PyTorch's count_nonzero."""
    monkeypatch.setattr(comm, "EXACT_FLOAT_COUNT", 8)
    x = _awkward(width=9)
    expected = torch.count_nonzero(x.abs() > 0.05, dim=1)
    assert torch.equal(count_sent(x, 0.05, torch.empty_like(x)).long(), expected)


LAYOUTS = {
    "equal": ([0, 0, 1, 1, 2, 2], 3, "width"),
    "uneven": ([0, 0, 0, 1, 2, 2], 3, "runs"),
    "missing edge": ([0, 0, 2, 2], 3, "runs"),
    "ungrouped": ([0, 1, 0, 2, 1, 2], 3, "gather"),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_edge_rows_act_as_gathered_rows(name: str) -> None:
    """spread, and in-place and out-of-place ops through ``parts``, equal the same op on
    ``edge_rows[seg]`` materialized, bit for bit."""
    seg_list, n, mode = LAYOUTS[name]
    seg = torch.tensor(seg_list)
    rows = EdgeRows.of(seg, n)
    assert ("width" if rows.width else "runs" if rows.runs is not None else "gather") == mode
    g = torch.Generator().manual_seed(1)
    p = 37
    edge = torch.randn(n, p, generator=g)
    theta = torch.randn(len(seg_list), p, generator=g)
    gathered = edge[seg]
    buffer = torch.full_like(theta, float("nan"))
    received = rows.receive(edge, buffer)
    assert torch.equal(received.spread(torch.empty_like(theta)), gathered)
    pulled = theta.clone()
    received.apply(lambda c, th: th.lerp_(c, 0.37), pulled)
    assert torch.equal(pulled, theta.clone().lerp_(gathered, 0.37))
    mixed = torch.empty_like(theta)
    received.apply(lambda e, th, out: torch.lerp(e, th, 0.6, out=out), theta, mixed)
    assert torch.equal(mixed, torch.lerp(gathered, theta, 0.6))


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_send_rows_matches_context_send(eps: float) -> None:
    a, b = tiny_context(zero_threshold=eps), tiny_context(zero_threshold=eps)
    x = _awkward(rows=5, eps=eps).nan_to_num(0.0)
    nodes = torch.arange(5)
    got = send_rows(a, "client_cloud", "up", x, nodes)
    expected = b.send("client_cloud", "up", x.clone(), nodes)
    assert torch.equal(got, expected)
    assert a.ledger.state_dict() == b.ledger.state_dict()
