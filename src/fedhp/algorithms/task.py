"""What travels between the cloud and below it in a round: the :class:`Task` sent down, the
:class:`Update` sent up, and :class:`UploadFold`, the uploads folded into the cloud's means part
by part."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhp.engine.ops import normalized, weighted_mean
from fedhp.engine.sampler import EpochBatches
from fedhp.engine.uplink import CENTRE_KEYS, Combine, Summed, Uplink, folds_in_parts
from fedhp.errors import FedhpWarning

Trained = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""What the clients' local SGD returns (:meth:`~fedhp.engine.context.RunContext.local_sgd`): their
trained parameters ``[n, P]``, summed losses ``[n]`` and step counts ``[n]``."""


@dataclass
class Task:
    """What the cloud sends below it for one round, in the receiver's client/edge indices.

    ``broadcast`` tensors go to everyone; ``per_client`` rows align with ``clients``."""

    clients: torch.Tensor  # sorted clients taking part
    edges: torch.Tensor | None = None  # sorted edges that train (hierarchical)
    agg_edges: torch.Tensor | None = None  # sorted edges whose models go up (default: edges)
    broadcast: dict[str, torch.Tensor] = field(default_factory=dict)
    per_client: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    # Clients that receive the round's messages but do not train (stragglers), for algorithms
    # that bill them themselves (``Algorithm.bills_stragglers``); sorted, may be empty.
    stragglers: torch.Tensor | None = None
    # The clients' minibatch indices for the round, drawn ahead when it is trained in parts
    # (:meth:`Algorithm.round_parts`): ``[steps, C', B]`` or local epochs' batches; None: the
    # local work draws them itself.
    batches: torch.Tensor | EpochBatches | None = None

    @property
    def up_edges(self) -> torch.Tensor | None:
        return self.agg_edges if self.agg_edges is not None else self.edges

    def part(self, rows: slice) -> Task:
        """The task of the clients in ``rows`` (a slice of ``clients``) of a flat round."""
        batches = self.batches
        if isinstance(batches, EpochBatches):
            batches = batches.part(rows)
        elif batches is not None:
            batches = batches[:, rows]
        return Task(
            self.clients[rows],
            broadcast=self.broadcast,
            per_client={k: v[rows] for k, v in self.per_client.items()},
            scalars=self.scalars,
            batches=batches,
        )


class UploadFold:
    """A round's client uploads folded into weighted means part by part, so that no more than a
    part of the clients' models is ever held: rows ``[c, W]`` of the next ``c`` clients are
    added with their share of ``weights`` (normalized over all the round's clients), and their
    losses and step counts kept for the round's statistics. ``combine``: the method's
    aggregation (:data:`~fedhp.engine.uplink.Combine`), of every key or by key (a key not named:
    the weighted mean); declared :func:`~fedhp.engine.uplink.foldable` (the weighted mean), a
    round in one part is ``combine`` of its rows and a round in parts is folded (the engine's
    optimization, equal to it); :class:`~fedhp.engine.uplink.Summed`, the parts' shares are
    added and finished once; otherwise the rows are kept and combined in :meth:`result`. None:
    folded.

    With an ``uplink`` (the cloud's pipeline, :class:`~fedhp.engine.uplink.Uplink`) whose
    aggregate is not the weighted mean (a robust rule, DP), the rows of the keys in ``start``
    (the model the clients started from, by key) are kept instead and aggregated by it in
    :meth:`result` (``population``: the clients they were drawn from, for DP's denominator; the
    rounds are then not streamed: ``RunContext.whole_rounds``); the other keys (BatchNorm
    statistics) are still combined. ``centres``: for a centred rule (``cclip``), the previous
    aggregate update of a kept key (by key, one key); :meth:`result` then also returns the new
    one under the level's :data:`~fedhp.engine.uplink.CENTRE_KEYS` entry."""

    def __init__(
        self,
        weights: torch.Tensor,
        uplink: Uplink | None = None,
        start: dict[str, torch.Tensor] | None = None,
        population: int | None = None,
        centres: dict[str, torch.Tensor] | None = None,
        *,
        combine: Combine | Mapping[str, Combine] | None = None,
    ) -> None:
        self.raw_weights = weights
        self.weights = normalized(weights)
        self.combines = dict(combine) if isinstance(combine, Mapping) else None
        self.combine = None if isinstance(combine, Mapping) else combine
        self.sums: dict[str, torch.Tensor] = {}
        self.done = 0
        self._losses: list[torch.Tensor] = []
        self._steps: list[torch.Tensor] = []
        given = [self.combine] if self.combines is None else list(self.combines.values())
        folds = all(c is None or folds_in_parts(c) for c in given)
        self.uplink = None if uplink is None or (uplink.folds and folds) else uplink
        self._held: dict[str, list[torch.Tensor]] = {}  # rows of a combine that does not fold
        self._folds = folds
        self.start = start if self.uplink is not None and start is not None else {}
        self.population = population
        self._kept: dict[str, list[torch.Tensor]] = {key: [] for key in self.start}
        centred = self.uplink is not None and self.uplink.centred
        self.centres = centres if centred and centres is not None else {}

    def add(
        self, rows: dict[str, torch.Tensor | None], update: Update, count: int | None = None
    ) -> None:
        """Fold in the next ``count`` clients' uploaded ``rows`` (by key; None: absent; the
        count is their row count unless given) and their ``update``'s losses and steps."""
        present = {k: v for k, v in rows.items() if v is not None}
        if count is None:
            count = next(iter(present.values())).shape[0]
        weights = self.weights[self.done : self.done + count]
        whole = self.done == 0 and count == len(self.weights)  # the round in one part
        for key, value in present.items():
            combine = self.combine_of(key)
            if key in self._kept:
                self._kept[key].append(value)
            elif not self._folds:
                self._held.setdefault(key, []).append(value)
            elif isinstance(combine, Summed):
                share = combine.share(value, self.done)
                self.sums[key] = share if key not in self.sums else self.sums[key].add_(share)
            elif whole and combine is not None:
                self.sums[key] = combine(value, self.raw_weights)
            else:
                share = weights.to(value.dtype) @ value
                self.sums[key] = share if key not in self.sums else self.sums[key].add_(share)
        if update.losses is not None:
            self._losses.append(update.losses)
        if update.steps is not None:
            self._steps.append(update.steps)
        self.done += count

    def result(self) -> dict[str, torch.Tensor]:
        """The round's aggregates by key: the folded means, and the uplink's aggregates of the
        kept keys."""
        out = dict(self.sums)
        for key, total in self.sums.items():
            combine = self.combine_of(key)
            if isinstance(combine, Summed):
                out[key] = combine.finish(total)
        for key, parts in self._held.items():
            out[key] = (self.combine_of(key) or weighted_mean)(torch.cat(parts), self.raw_weights)
        for key, parts in self._kept.items():
            if parts:
                uplink = self.uplink
                assert uplink is not None
                rows = torch.cat(parts)
                start, centre = self.start[key], self.centres.get(key)
                combine = self.combine_of(key) or weighted_mean
                out[key] = uplink.aggregate(
                    rows, self.raw_weights, start, self.population, centre, combine=combine
                )
                if centre is not None:  # the next round's centre: this aggregate's update
                    out[CENTRE_KEYS[uplink.level]] = out[key] - start
        return out

    def combine_of(self, key: str) -> Combine | None:
        """The aggregation of ``key``'s rows (None: the weighted mean, folded)."""
        if self.combines is not None:
            return self.combines.get(key)
        return self.combine

    def update(self) -> Update:
        """The folded clients' losses ``[S, n]`` and steps ``[n]`` (as one :class:`Update`)."""
        losses = torch.cat(self._losses, dim=1) if self._losses else None
        steps = torch.cat(self._steps) if len(self._steps) == len(self._losses) else None
        return Update(losses=losses, steps=steps)


OLD_ROW_KEYS = {"params": "model"}
"""The old names of :class:`Update` row keys: a client's uploaded model was ``"params"`` before
it took the name of the message field it travels in, ``"model"``."""

_NOTED_OLD_KEYS: set[str] = set()
"""The old row keys already reported in this process: each is reported once."""


def _current_key(key: str) -> str:
    """``key`` under its current name, said in one warning line per old key and process."""
    new = OLD_ROW_KEYS.get(key) if isinstance(key, str) else None
    if new is None:
        return key
    if key not in _NOTED_OLD_KEYS:
        _NOTED_OLD_KEYS.add(key)
        warnings.warn(
            f'Update row key "{key}" is the old name of "{new}"; read as "{new}", the key to '
            "use from now on",
            FedhpWarning,
            stacklevel=3,
        )
    return new


class UpdateRows(dict[str, torch.Tensor]):
    """The rows of an :class:`Update` (``per_client``, ``per_edge``): a dict that reads and
    writes an old key (:data:`OLD_ROW_KEYS`, ``"params"``) as its current one (``"model"``),
    saying so once per process, so plugins written against the older name keep running."""

    def __init__(
        self,
        rows: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] = (),
        /,
        **kwargs: torch.Tensor,
    ) -> None:
        super().__init__()
        self.update(rows, **kwargs)

    def update(self, rows: Any = (), /, **kwargs: torch.Tensor) -> None:
        items = rows.items() if isinstance(rows, Mapping) else rows
        for key, value in (*items, *kwargs.items()):
            self[key] = value

    def __getitem__(self, key: str) -> torch.Tensor:
        return super().__getitem__(_current_key(key))

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        super().__setitem__(_current_key(key), value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(_current_key(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(_current_key(key) if isinstance(key, str) else key)

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(_current_key(key), default)

    def pop(self, key: str, *default: Any) -> Any:
        return super().pop(_current_key(key), *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        return super().setdefault(_current_key(key), default)


@dataclass
class Update:
    """What comes up to the cloud: rows per client of ``task.clients``, rows per edge of
    ``task.up_edges``, and the per-client training losses ``[S, len(clients)]`` (one row per
    local loss group, e.g. per local round). A client's uploaded model is the row ``"model"``
    (the message field it travels in; the old key ``"params"`` still reads and writes it, with
    one warning: :class:`UpdateRows`)."""

    per_client: dict[str, torch.Tensor] = field(default_factory=UpdateRows)
    per_edge: dict[str, torch.Tensor] = field(default_factory=UpdateRows)
    losses: torch.Tensor | None = None
    steps: torch.Tensor | None = None  # [len(clients)] int64 local steps (RunContext.local_sgd)

    def __post_init__(self) -> None:
        if not isinstance(self.per_client, UpdateRows):
            self.per_client = UpdateRows(self.per_client)
        if not isinstance(self.per_edge, UpdateRows):
            self.per_edge = UpdateRows(self.per_edge)
