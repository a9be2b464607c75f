"""The uplink pipeline: what happens to the rows a level (the edges, or the cloud) receives.

One :class:`Uplink` per level, owned by the engine (``RunContext.edge_uplink`` and
``RunContext.cloud_uplink``, made of the run's attack and the level's rule), applies to every
upload of that level, in this order:

0. **client momentum** (``algorithm.client_momentum`` β > 0, issue 41; where the clients upload):
   each client that trained keeps the momentum of its updates, ``m_i ← β m_i + (1 − β)(x_i −
   start)``, and uploads ``start + m_i`` (:meth:`Uplink.accumulate`), so every later step acts on
   the momenta; the momenta live in the method's state (:data:`MOMENTUM_KEY`);
1. **attack** (:mod:`fedhp.engine.attacks`): where the clients upload (the edges in a hierarchy,
   else the cloud), the malicious clients' models are forged (:meth:`Uplink.forge`, before the
   message is billed);
2. **robust rule** (:mod:`fedhp.robust`), then 3. **DP** (clip + noise with the Poisson
   denominator, :mod:`fedhp.privacy`): the level's
   :class:`~fedhp.engine.aggregation.LevelRule` turns the rows that arrived into one
   (:meth:`Uplink.aggregate`); with neither configured, the method's own aggregation
   (``combine``, a pure function of the rows and weights; default: the weighted mean
   :func:`~fedhp.engine.ops.weighted_mean`, which the engine may fold part by part,
   :attr:`Uplink.folds`).

A centred rule (``cclip``) also needs the level's previous aggregate: the method keeps it in its
state (:data:`CENTRE_KEYS`, an update ``[P]`` at the cloud, ``[E, P]`` at the edges) and passes it
to :meth:`Uplink.aggregate`.

An algorithm declares what it uploads at each level (``AlgorithmOptions.uploads``, one of
:data:`UPLOAD_KINDS`), and :func:`safeguards` derives from it where the run's attack, robust rules
and DP can act (``fedhp.build.check_adversarial`` refuses the rest).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

from fedhp.engine.aggregation import LevelRule
from fedhp.engine.attacks import Attack
from fedhp.engine.ops import weighted_mean

Combine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""A method's aggregation ``combine(rows [n, P], weights [n]) -> [P]``, a pure function: what a
level without a robust or DP rule makes of the rows that arrived (:meth:`Uplink.aggregate`)."""
C = TypeVar("C", bound=Callable[..., torch.Tensor])


def foldable(combine: C) -> C:
    """Declare ``combine`` the weighted mean ``Σ_i (w_i / Σ_j w_j) rows_i``: the engine may then
    fold it part by part, each part's rows adding their share (an optimization the method does
    not see, :class:`~fedhp.algorithms.task.UploadFold`); a round in one part is ``combine``
    itself."""
    combine.foldable = True  # type: ignore[attr-defined]
    return combine


class Summed(ABC):
    """A method's aggregation that is a sum over the senders, finished once::

        combine(rows, weights) = finish(share(rows, 0))

    ``share(rows, first)``: the term of the round's senders ``first .. first + n - 1`` (their
    ``rows [n, W]``; the weights, and whatever else the sum needs, bound when it was built for
    the round); ``finish(total)``: the aggregate from the summed terms. The engine may fold it
    part by part, adding the parts' shares in the round's order (an optimization the method does
    not see; a round in one part is ``combine`` itself)."""

    @abstractmethod
    def share(self, rows: torch.Tensor, first: int) -> torch.Tensor:
        """The summed term of the senders ``first ..`` whose rows these are."""

    @abstractmethod
    def finish(self, total: torch.Tensor) -> torch.Tensor:
        """The aggregate from the sum of every sender's term."""

    def __call__(self, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.finish(self.share(rows, 0))


def folds_in_parts(combine: Callable[..., torch.Tensor]) -> bool:
    """Whether ``combine`` was declared :func:`foldable` or is :class:`Summed`."""
    return isinstance(combine, Summed) or bool(getattr(combine, "foldable", False))


LEVELS = ("edge", "cloud")
UPLOAD_KINDS = {
    "model": "the senders' models as trained from the model they received (FedAvg's upload): "
    "attack, robust rule and client-level DP",
    "estimate": "model-shaped rows the method derives or combines further (a meta-model, a "
    "mixed or thresholded model, a shared body): attack and robust rule; no DP (its clipping "
    "and accounting are derived for FedAvg's average of models)",
    "own": "rows the pipeline does not touch (control variates, normalized steps, masks)",
}
"""What a level may receive (``AlgorithmOptions.uploads``) and what the pipeline does to it."""
MOMENTUM_KEY = "client_momentum"
"""The state entry of the clients' momenta ``[C, P]`` (``algorithm.client_momentum`` > 0)."""
CENTRE_KEYS = {"cloud": "cclip_centre", "edge": "cclip_centre_edge"}
"""The state entries of a centred rule's previous aggregate update, by level: ``[P]`` at the
cloud, one row per edge ``[E, P]`` at the edges."""


def client_level(hierarchical: bool) -> str:
    """The level the clients upload to: the edges in a hierarchy, else the cloud."""
    return "edge" if hierarchical else "cloud"


def safeguards(uploads: Mapping[str, str], hierarchical: bool) -> dict[str, frozenset[str]]:
    """Where each safeguard can act, from what a method uploads at each level: ``{"attack":
    levels, "robust": levels, "privacy": levels}``. Attacks and DP act on client uploads only
    (at :func:`client_level`); a robust rule on any level receiving model rows."""
    for level, kind in uploads.items():
        if level not in LEVELS or kind not in UPLOAD_KINDS:
            raise ValueError(
                f"uploads: {level!r}: {kind!r} is not a level ({', '.join(LEVELS)}) and an "
                f"upload kind ({', '.join(UPLOAD_KINDS)})"
            )
    models = frozenset(lvl for lvl, kind in uploads.items() if kind in ("model", "estimate"))
    clients = client_level(hierarchical)
    private = uploads.get(clients) == "model"
    return {
        "attack": models & {clients},
        "robust": models,
        "privacy": frozenset({clients}) if private else frozenset(),
    }


@dataclass
class Uplink:
    """The pipeline of one ``level``: the run's ``attack`` on the client uploads it receives
    (None: all honest), then its ``rule`` (robust and/or DP; None: the weighted mean).
    ``poisson_rate``: ``q`` where clients are drawn by Poisson sampling (DP then divides by
    ``q·N`` for a population of ``N``); None: fixed-size sampling."""

    level: str
    rule: LevelRule | None = None
    attack: Attack | None = None
    poisson_rate: float | None = None
    momentum: float = 0.0
    """β of the client momentum (step 0) at this level; 0: none (the uploads as trained)."""

    @property
    def centred(self) -> bool:
        """Whether the level's rule measures from the previous aggregate (``cclip``): the caller
        keeps it (:data:`CENTRE_KEYS`) and passes it to :meth:`aggregate`."""
        return bool(getattr(self.rule, "centred", False))  # (a stand-in rule may lack it)

    @property
    def folds(self) -> bool:
        """Whether the aggregate is the weighted mean (so it can be folded part by part)."""
        return self.rule is None or self.rule.folds

    @property
    def forges_from_whole_round(self) -> bool:
        """Whether forging reads the benign updates of the whole aggregation (ALIE, IPM): the
        uploads must be trained at once, even where the rule could keep the parts' rows."""
        return self.attack is not None and self.attack.needs_whole_rounds

    @property
    def whole_rounds(self) -> bool:
        """Whether an aggregation's uploads must arrive at once (a robust or private rule, or an
        attack reading the benign updates): no streamed parts."""
        return self.forges_from_whole_round or not self.folds

    def begin_round(self, rnd: int) -> None:
        """Re-seed the rule's stream (DP noise, buckets) for round ``rnd``."""
        if self.rule is not None:
            self.rule.begin_round(rnd)

    def denominator(self, population: int | None) -> float | None:
        """The DP average's denominator for rows drawn from ``population`` clients: ``q·N``
        under Poisson sampling, else the number of rows (None)."""
        if self.poisson_rate is None or population is None:
            return None
        return self.poisson_rate * population

    def accumulate(
        self,
        rows: torch.Tensor,
        start: torch.Tensor,
        memory: torch.Tensor | None,
        clients: torch.Tensor,
    ) -> torch.Tensor:
        """Step 0, client momentum: for the models ``rows [n, P]`` that clients ``clients``
        (their rows of ``memory``, the momenta ``[C, P]`` of the state's :data:`MOMENTUM_KEY`)
        trained from ``start`` (``[P]`` or ``[n, P]``), ``m_i ← β m_i + (1 − β)(row_i − start_i)``
        written into ``memory``; returns ``start + m_i``, what they upload. ``rows`` itself when
        β = 0 (or no memory): nothing is computed, so such runs are unchanged bit for bit."""
        beta = self.momentum
        if beta == 0 or memory is None:
            return rows
        start = start.expand_as(rows)
        index = clients.to(memory.device)
        m = memory[index].to(rows.device).mul_(beta).add_(rows - start, alpha=1 - beta)
        memory[index] = m.to(memory.device)
        return start + m

    @property
    def forges(self) -> bool:
        """Whether the run's attack forges uploads (:meth:`forge` changes rows)."""
        return self.attack is not None and self.attack.on_uploads

    def forge(self, rows: torch.Tensor, senders: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Step 1: the models ``rows [n, P]`` of clients ``senders`` (global ids) as they upload
        them, the malicious ones' forged; ``start`` (``[P]`` or ``[n, P]``): what each started
        from. ``rows`` itself where nothing is forged."""
        if self.attack is None or not self.forges:
            return rows
        return self.attack.apply(rows, senders, start)

    def aggregate(
        self,
        rows: torch.Tensor,
        weights: torch.Tensor,
        start: torch.Tensor,
        population: int | None = None,
        centre: torch.Tensor | None = None,
        *,
        combine: Combine = weighted_mean,
    ) -> torch.Tensor:
        """Steps 2–3: the level's aggregate ``[P]`` of the ``rows [n, P]`` that arrived, with
        ``weights [n]``: the method's own ``combine(rows, weights)`` (a pure function; default:
        the weighted mean) where the level has no robust or DP rule, else the robust rule's, or
        the DP mean of the clipped updates from ``start`` plus noise (``population``: the
        clients the senders were drawn from, for the Poisson denominator). ``centre``
        (``[P]``): a centred rule's previous aggregate update (:attr:`centred`; None: 0); the
        caller keeps ``result − start`` as the next one."""
        if self.rule is None or self.rule.folds:
            return combine(rows, weights)
        denominator = self.denominator(population)
        if centre is None or not self.centred:
            return self.rule(rows, weights.to(rows.dtype), start, denominator)
        return self.rule(rows, weights.to(rows.dtype), start, denominator, centre)

    def __call__(
        self,
        rows: torch.Tensor,
        senders: torch.Tensor,
        weights: torch.Tensor,
        start: torch.Tensor,
        *,
        send: Callable[[torch.Tensor], torch.Tensor] | None = None,
        population: int | None = None,
        combine: Combine = weighted_mean,
    ) -> torch.Tensor:
        """The whole pipeline over one aggregation's uploads: :meth:`forge`, ``send`` (bills the
        messages, returns what arrives; None: they arrive as they are), :meth:`aggregate` (the
        method's ``combine`` where the level has no robust or DP rule)."""
        sent = self.forge(rows, senders, start)
        if send is not None:
            sent = send(sent)
        return self.aggregate(sent, weights, start, population, combine=combine)


def level_aggregate(
    uplink: Uplink,
    state: dict[str, torch.Tensor],
    rows: torch.Tensor,
    weights: torch.Tensor,
    start: torch.Tensor,
    *,
    edge: int = 0,
    population: int | None = None,
    combine: Combine = weighted_mean,
) -> torch.Tensor:
    """``uplink``'s aggregate ``[P]`` (at the cloud, or at edge ``edge``) of the ``rows [n, P]``
    that arrived with their ``weights [n]`` from senders who received ``start [P]``: its rule
    (``population``: the clients the senders were drawn from, for DP's Poisson denominator),
    else the method's ``combine``. A centred rule (``cclip``) measures from the level's previous
    aggregate update, kept in ``state`` (:data:`CENTRE_KEYS`: ``[P]`` at
    the cloud, row ``edge`` of ``[E, P]`` at the edges), which this one's replaces."""
    key = CENTRE_KEYS[uplink.level]
    centres = state.get(key) if uplink.centred else None
    if centres is None:
        return uplink.aggregate(rows, weights, start, population, combine=combine)
    at_edge = uplink.level == "edge"
    centre = centres[edge] if at_edge else centres
    out = uplink.aggregate(rows, weights, start, population, centre, combine=combine)
    if at_edge:  # the next aggregation's centre: this one's update
        centres[edge] = out - start
    else:
        state[key] = out - start
    return out
