"""FedLPS's heterogeneity and cost model: device capability levels and simulated round times.

A client of capability z computes at z · 727 GFLOP/s (z = 1: the paper's full device) and moves
bytes at 14.0 MB/s up and 110.6 MB/s down (the authors' code; MB = 10⁶ bytes). Its round time is
T_k = training FLOPs / (z · peak) + bytes up / up rate + bytes down / down rate (Eq. 14 with
α = 1 and the download counted, which the paper's formula leaves out); a synchronous round lasts
as long as its slowest selected client (Eq. 18).

Every method that models devices has one ``capabilities`` option of one type,
:data:`CapabilityMode`: ``off`` (no device model), or each client's z drawn once (``fix``) or
again every round (``dyn``). FedLPS, HeteroFL and LotteryFL size their sub-models by z, so they
need it drawn (:data:`DrawnCapabilities`: ``fix|dyn``). The dense methods (FedAvg, FedProx,
FedNova, FedPer, Ditto, Per-FedAvg) carry the same model when asked (default ``off``), a
component they hold (:class:`DenseCostModel`): they train the full model whatever z is, so z
only stretches their compute time. Their capabilities come from a generator of their own
(:func:`capability_generator`), so drawing them leaves the training's random stream untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.options import AlgorithmOptions
from fedhp.engine.context import RunContext

CapabilityMode = Literal["off", "fix", "dyn"]
"""The device model: none (``off``), or the clients' capabilities z drawn once (``fix``) or
every round (``dyn``)."""


def _drawn(mode: CapabilityMode) -> CapabilityMode:
    if mode == "off":
        raise ValueError("this method sizes its sub-models by the capabilities: use fix or dyn")
    return mode


DrawnCapabilities = Annotated[CapabilityMode, pydantic.AfterValidator(_drawn)]
""":data:`CapabilityMode` without ``off``: the methods whose sub-models follow z."""

CAPABILITY_LEVELS = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16)
PEAK_FLOPS = 727e9
UP_BYTES_PER_S = 14.0e6
DOWN_BYTES_PER_S = 110.6e6
CAPABILITY_SEED_OFFSET = 5_000_011
"""Offset of the dense methods' capability stream from the engine generator's seed (the run's
seed + ``ENGINE_SEED_OFFSET``)."""


def draw_capabilities(
    num_clients: int, generator: torch.Generator, levels: tuple[float, ...] = CAPABILITY_LEVELS
) -> torch.Tensor:
    """Each client's capability z ``[num_clients]`` drawn uniformly from ``levels`` (FedLPS's
    "Fix" draws once; "Dyn" draws again every round)."""
    idx = torch.randint(len(levels), (num_clients,), generator=generator)
    return torch.tensor(levels, dtype=torch.float64)[idx]


def refresh_capabilities(
    state: dict[str, torch.Tensor],
    mode: CapabilityMode,
    rnd: int,
    generator: torch.Generator,
    levels: tuple[float, ...] = CAPABILITY_LEVELS,
) -> None:
    """FedLPS's "Dyn" capabilities (``mode == "dyn"``): ``state["capability"]`` drawn again for
    every client at the start of every round after the first; "Fix" keeps the first draw."""
    if mode == "dyn" and rnd > 0:
        caps = state["capability"]
        state["capability"] = draw_capabilities(len(caps), generator, levels).to(caps.device)


def capability_generator(engine: torch.Generator) -> torch.Generator:
    """A CPU generator of its own for capability draws, seeded from the run's seed (``engine``'s
    initial seed + :data:`CAPABILITY_SEED_OFFSET`; reading it draws nothing from ``engine``)."""
    seed = (engine.initial_seed() + CAPABILITY_SEED_OFFSET) % 2**63
    return torch.Generator(device="cpu").manual_seed(seed)


@dataclass(frozen=True)
class DeviceCost:
    """Compute and link rates of the cost model (defaults: the FedLPS code's)."""

    peak_flops: float = PEAK_FLOPS
    up_bytes_per_s: float = UP_BYTES_PER_S
    down_bytes_per_s: float = DOWN_BYTES_PER_S

    def client_seconds(
        self,
        train_flops: torch.Tensor,
        capability: torch.Tensor,
        bytes_up: torch.Tensor,
        bytes_down: torch.Tensor,
    ) -> torch.Tensor:
        """T_k ``[C]`` (float64 seconds) of each client's round."""
        compute = train_flops.double() / (capability.double() * self.peak_flops)
        return (
            compute
            + bytes_up.double() / self.up_bytes_per_s
            + bytes_down.double() / (self.down_bytes_per_s)
        )

    @staticmethod
    def round_seconds(client_seconds: torch.Tensor) -> float:
        """A synchronous round's time: its slowest client's (0 for an empty round)."""
        return float(client_seconds.max()) if client_seconds.numel() else 0.0

    def account(
        self,
        state: State,
        flops: torch.Tensor,
        caps: torch.Tensor,
        up: torch.Tensor,
        down: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Add a round to ``state``'s running ``sim_time_s`` and ``flops`` (float64 ``[1]``,
        :func:`cost_state`) from the clients' training ``flops``, capabilities and bytes: each
        client's T_k and the round's metrics (``sim_time_s``, ``round_sim_time_s``, ``flops``)."""
        seconds = self.client_seconds(flops, caps, up, down)
        round_s = self.round_seconds(seconds)
        state["sim_time_s"] += round_s
        state["flops"] += float(flops.double().sum())
        stats = {
            "sim_time_s": float(state["sim_time_s"]),
            "round_sim_time_s": round_s,
            "flops": float(state["flops"]),
        }
        return seconds, stats


def cost_state() -> dict[str, torch.Tensor]:
    """The running totals :meth:`DeviceCost.account` keeps (zero)."""
    return {
        "sim_time_s": torch.zeros(1, dtype=torch.float64),
        "flops": torch.zeros(1, dtype=torch.float64),
    }


def capabilities_field() -> Any:
    """The dense methods' ``capabilities`` option (:class:`DenseCostModel`)."""
    return pydantic.Field(
        "off",
        description="FedLPS's device model (docs/fedlps.md): off, or capabilities z drawn once "
        "(fix) or every round (dyn) and sim_time_s, round_sim_time_s, flops logged; the training "
        "is the same",
    )


class DenseCostModel:
    """The device model of a method that trains the full model (the module docstring), on with
    ``capabilities: fix|dyn``: a component the method holds (``self.cost_model``). Its
    :attr:`generator` is checkpointed as ``algorithm.capability_generator``. T_k counts 3 × the
    dense model's forward FLOPs per sample (``masked_flops`` with every unit kept, FedLPS's
    convention) and the bytes the ledger billed the client this round. ``off`` (default) adds
    nothing: no state entry, no generator, no metric."""

    generator: torch.Generator | None = None
    device_cost: DeviceCost
    dense_forward_flops: float

    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        """The model set up from ``options.capabilities``; options without that field (a
        plugin's subclass of FedAvg with options of its own) leave it off."""
        self.ctx = ctx
        self.mode: CapabilityMode = getattr(options, "capabilities", "off")
        if self.mode == "off":
            return
        from fedhp.models.masks import masked_flops, num_units

        model = ctx.model
        self.device_cost = DeviceCost()
        self.generator = capability_generator(ctx.generator)
        every_unit = torch.ones(1, num_units(model), dtype=torch.bool)
        self.dense_forward_flops = float(masked_flops(model, every_unit)[0])

    def state(self) -> State:
        """The initial state's entries: ``capability [C]`` and the running ``sim_time_s``,
        ``flops`` (none when off)."""
        if self.generator is None:
            return {}
        caps = draw_capabilities(self.ctx.num_clients, self.generator)
        return {"capability": caps, **cost_state()}

    def refresh(self, state: State, rnd: int) -> None:
        """Start of round ``rnd`` (cloud, in ``plan``): ``dyn`` draws every z again."""
        if self.generator is not None:
            refresh_capabilities(state, self.mode, rnd, self.generator)

    def account(
        self, state: State, clients: torch.Tensor, samples: Callable[[torch.Tensor], torch.Tensor]
    ) -> dict[str, float]:
        """End of a round (cloud, in ``aggregate``, after the uploads are billed): add the round
        of ``clients`` to ``state``, ``samples(clients)`` being the samples (float64) each
        trained on over its local work (the method's count); the round metrics ``sim_time_s``,
        ``round_sim_time_s``, ``flops`` (none when off)."""
        if self.generator is None:
            return {}
        ctx = self.ctx
        ids = ctx.global_clients(clients)
        up = ctx.ledger.round_node_bytes("client_cloud", "up", ids)
        down = ctx.ledger.round_node_bytes("client_cloud", "down", ids)
        flops = 3.0 * self.dense_forward_flops * samples(clients).double().cpu()
        caps = state["capability"][clients.cpu()]
        return self.device_cost.account(state, flops, caps, up, down)[1]


class DenseDeviceCost(Algorithm):
    """A base for a dense method holding :class:`DenseCostModel` (kept for the methods and
    plugins written against it; a new method holds the component itself)."""

    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.cost_model = DenseCostModel(options, ctx)
        self.capability_generator = self.cost_model.generator  # (checkpointed by this name)

    def device_cost_state(self) -> State:
        """:meth:`DenseCostModel.state`."""
        return self.cost_model.state()

    def refresh_device_cost(self, state: State, rnd: int) -> None:
        """:meth:`DenseCostModel.refresh`."""
        self.cost_model.refresh(state, rnd)

    def round_samples(self, clients: torch.Tensor) -> torch.Tensor:
        """The samples (float64 ``[len(clients)]``) each of ``clients`` trained on in a round,
        over every gradient evaluation of its local work (the method's own count)."""
        raise NotImplementedError

    def account_device_cost(self, state: State, clients: torch.Tensor) -> dict[str, float]:
        """:meth:`DenseCostModel.account` with the method's :meth:`round_samples`."""
        return self.cost_model.account(state, clients, self.round_samples)


class SizedCostModel:
    """The device model of the methods whose clients train sub-models sized by their capability z
    (FedLPS, HeteroFL, LotteryFL; ``capabilities: fix|dyn``, :data:`DrawnCapabilities`): a
    component the method holds (``self.sizes``). z is drawn from the run's engine generator (it
    decides the training) over ``levels``, and each round's T_k and time accounted with
    :attr:`device_cost`."""

    device_cost = DeviceCost()
    account = device_cost.account
    """:meth:`DeviceCost.account` of the round's clients under :attr:`device_cost`."""

    def __init__(self, ctx: RunContext, levels: tuple[float, ...] = CAPABILITY_LEVELS) -> None:
        self.ctx = ctx
        self.levels = levels

    def initial(self, device: torch.device) -> torch.Tensor:
        """Every client's first z ``[C]`` (float64, on ``device``), for the initial state."""
        ctx = self.ctx
        return draw_capabilities(ctx.num_clients, ctx.generator, self.levels).to(device)

    def redraw(self, state: State, rnd: int, mode: CapabilityMode) -> None:
        """Start of round ``rnd`` (cloud, in ``plan``): under ``mode`` ``dyn`` every z is drawn
        again."""
        refresh_capabilities(state, mode, rnd, self.ctx.generator, self.levels)
