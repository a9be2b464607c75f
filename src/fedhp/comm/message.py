"""A keyed message: named fields (``{"model": …, "buffers": …, "control": …}``), each rows
``[n, w_k]`` (or one row ``[w_k]``), one message per receiver.

The ledger bills a message per receiver over all its values (its encoding is chosen per message),
so a :class:`Message` is billed as the concatenation of its fields in their order
(:meth:`Message.rows`), and the receiver gets the same fields back (:meth:`Message.like`)."""

from __future__ import annotations

import torch


class Message(dict[str, torch.Tensor]):
    """An ordered mapping of field name → rows ``[n, w_k]`` (a field with one row ``[1, w_k]``
    is the same for every receiver), or of field name → one message's values ``[w_k]``."""

    def widths(self) -> list[int]:
        """Each field's width ``w_k``, in order."""
        return [int(v.shape[-1]) for v in self.values()]

    def rows(self) -> torch.Tensor:
        """The fields side by side in their order: ``[n, Σ w_k]`` (or ``[Σ w_k]``), what is
        billed; one-row fields repeated for each of the ``n`` receivers."""
        fields = list(self.values())
        if len(fields) == 1:
            return fields[0]
        if all(f.dim() == 1 for f in fields):
            return torch.cat(fields, dim=-1)
        n = max(f.shape[0] for f in fields if f.dim() == 2)
        return torch.cat([f.expand(n, -1) for f in fields], dim=-1)

    def like(self, rows: torch.Tensor) -> Message:
        """``rows`` (laid out as :meth:`rows`) split back into this message's fields."""
        if len(self) == 1:
            return Message({next(iter(self)): rows})
        return Message(zip(self.keys(), rows.split(self.widths(), dim=-1), strict=True))

    def first(self) -> Message:
        """The first receiver's message (fields ``[w_k]``)."""
        return Message({k: v[0] for k, v in self.items()})
