"""Keyed messages (:class:`fedhp.comm.Message`): the fields are billed as one message per
receiver (their concatenation), and the receiver gets the same named fields, truncated."""

from __future__ import annotations

import torch

from fedhp.comm import Message
from tests.algorithms.tiny import tiny_context


def _fields(n: int) -> Message:
    g = torch.Generator().manual_seed(0)
    model = torch.randn(n, 6, generator=g)
    model[:, ::2] = 1e-4  # truncated below the threshold: the cheapest encoding changes
    return Message(model=model, buffers=torch.randn(1, 3, generator=g), control=torch.ones(n, 2))


def test_rows_and_like_round_trip() -> None:
    message = _fields(4)
    rows = message.rows()
    assert rows.shape == (4, 11) and message.widths() == [6, 3, 2]
    assert torch.equal(rows[:, 6:9], message["buffers"].expand(4, -1))
    back = message.like(rows)
    assert list(back) == ["model", "buffers", "control"]
    assert torch.equal(back["control"], message["control"])
    first = message.first()
    assert torch.equal(first.rows(), rows[0])


def test_send_bills_the_fields_as_one_row_per_receiver() -> None:
    message, nodes = _fields(4), torch.arange(4)
    keyed, plain = tiny_context(zero_threshold=1e-3), tiny_context(zero_threshold=1e-3)
    got = keyed.send("client_cloud", "up", message, nodes)
    want = plain.send("client_cloud", "up", message.rows(), nodes)
    assert keyed.ledger.end_round() == plain.ledger.end_round()
    assert torch.equal(got.rows(), want)
    assert bool((got["model"][:, ::2] == 0).all())  # what was billed: truncated values
    # billed field by field (three messages per receiver) the bytes would differ
    apart = tiny_context(zero_threshold=1e-3)
    for value in message.values():
        apart.send("client_cloud", "up", value.expand(4, -1), nodes)
    totals = apart.ledger.end_round()
    assert totals["messages_client_cloud_up"] == 12
    assert totals["bytes_total"] != plain.ledger.totals()["bytes_total"]


def test_broadcast_of_a_keyed_message() -> None:
    message, nodes = _fields(1).first(), torch.arange(3)
    keyed, plain = tiny_context(zero_threshold=1e-3), tiny_context(zero_threshold=1e-3)
    got = keyed.broadcast("client_cloud", "down", message, nodes)
    want = plain.broadcast("client_cloud", "down", message.rows(), nodes)
    assert keyed.ledger.end_round() == plain.ledger.end_round()
    assert list(got) == ["model", "buffers", "control"] and torch.equal(got.rows(), want)


def test_multicast_bills_each_receiver_its_senders_row() -> None:
    """Each edge's row to its clients: billed as sending every receiver its row (``send`` of the
    gathered rows), the rows returned once per sender, truncated."""
    message, row_of, nodes = _fields(2), torch.tensor([0, 1, 1, 0, 1]), torch.arange(5)
    multi, plain = tiny_context(zero_threshold=1e-3), tiny_context(zero_threshold=1e-3)
    got = multi.multicast("client_edge", "down", message, row_of, nodes)
    want = plain.send("client_edge", "down", message.rows()[row_of], nodes)
    assert multi.ledger.end_round() == plain.ledger.end_round()
    assert got.rows().shape == (2, 11) and torch.equal(got.rows()[row_of], want)
