"""Communication: the wire encodings of a message (:mod:`fedhp.comm.codec`) and the per-link
accounting of every message a run sends (:mod:`fedhp.comm.ledger`), keyed messages
(:mod:`fedhp.comm.message`)."""

from fedhp.comm.codec import (
    ENCODINGS,
    MessageCost,
    count_nonzero,
    decode_sparse,
    decode_unit_mask,
    encode_sparse,
    encode_unit_mask,
    message_cost,
    truncate,
    unit_mask_bytes,
)
from fedhp.comm.ledger import DIRECTIONS, LINKS, CommLedger
from fedhp.comm.message import Message

__all__ = [
    "DIRECTIONS",
    "ENCODINGS",
    "LINKS",
    "Message",
    "CommLedger",
    "MessageCost",
    "count_nonzero",
    "decode_sparse",
    "decode_unit_mask",
    "encode_sparse",
    "encode_unit_mask",
    "message_cost",
    "truncate",
    "unit_mask_bytes",
]
