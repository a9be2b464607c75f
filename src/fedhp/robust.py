"""The ``robust:`` section of the configuration: which Byzantine-robust rule aggregates a level's
rows, and its parameters (issue 20). The rules themselves are
:mod:`fedhp.engine.robust_rules`; this module imports no torch, so that :mod:`fedhp.config`
stays light."""

from __future__ import annotations

from typing import Literal

import pydantic
from pydantic_core import PydanticCustomError

from fedhp.errors import ConfigError

RobustName = Literal[
    "mean", "median", "trimmed_mean", "krum", "multi_krum", "clip", "cclip", "geomed"
]

RULE_OPTIONS: dict[str, tuple[str, ...]] = {
    "beta": ("trimmed_mean",),
    "f": ("krum", "multi_krum"),
    "m": ("multi_krum",),
    "clip_norm": ("clip",),
    "tau": ("cclip",),
    "clip_iters": ("cclip",),
    "max_iter": ("geomed",),
    "nu": ("geomed",),
    "tol": ("geomed",),
    "bucket": ("median", "trimmed_mean", "krum", "multi_krum", "clip", "cclip", "geomed"),
}
"""Each rule parameter of :class:`RobustOptions` and the rules that read it (issue 42: a
parameter set for a rule that does not read it is refused)."""

CENTRED_RULES = frozenset({"cclip"})
"""The rules that keep the previous round's aggregate as their centre (state across rounds)."""


class RobustOptions(pydantic.BaseModel):
    """Which robust rule aggregates a level's rows, and its parameters (each read by the rules
    of :data:`RULE_OPTIONS` only, and refused when set for another). Checks that need the number
    of rows ``n`` are in :meth:`check`."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    name: RobustName = pydantic.Field(
        "mean",
        description="mean (weighted, FedAvg's), median (coordinate-wise, unweighted), "
        "trimmed_mean (beta per side), krum / multi_krum (f attackers), clip (norm clip_norm), "
        "cclip (centered clipping: tau, clip_iters) or geomed (geometric median: max_iter, nu, "
        "tol)",
    )
    beta: float = pydantic.Field(
        0.1, description="trimmed_mean: fraction of the rows dropped per side, in [0, 0.5)"
    )
    f: int = pydantic.Field(
        1, ge=0, description="krum, multi_krum: attackers assumed (needs n > 2f + 2 rows)"
    )
    m: int | None = pydantic.Field(
        None, ge=1, description="multi_krum: rows averaged, 1..n (default n - f)"
    )
    clip_norm: float | None = pydantic.Field(
        None,
        validate_default=True,
        description="clip: the norm bound S > 0 on each update (required by clip)",
    )
    tau: float = pydantic.Field(
        10.0,
        description="cclip: the clipping radius around the centre (the previous aggregate), in "
        "the units of the updates; > 0 (default 10: Karimireddy et al. 2022's code)",
    )
    clip_iters: int = pydantic.Field(
        3, ge=1, description="cclip: clipping iterations L (default 3: Karimireddy et al. 2022)"
    )
    max_iter: int = pydantic.Field(
        4, ge=1, description="geomed: Weiszfeld iterations at most (default 4: RFA's)"
    )
    nu: float = pydantic.Field(
        1e-5,
        gt=0,
        description="geomed: smoothing nu, distances below it count as nu (default 1e-5: RFA's)",
    )
    tol: float = pydantic.Field(
        1e-6,
        ge=0,
        description="geomed: stop when the objective decreases by less than tol times itself "
        "(default 1e-6: RFA's)",
    )
    bucket: int = pydantic.Field(
        1,
        ge=1,
        description="rows averaged in random buckets of this size before the rule (1: none; "
        "Karimireddy et al. 2022's s-bucketing for heterogeneous clients)",
    )

    @pydantic.field_validator("beta")
    @classmethod
    def _beta_in_range(cls, value: float) -> float:
        if value >= 0.5:
            raise PydanticCustomError(
                "robust_beta", "0.5 or more per side trims every row; use a value below 0.5"
            )
        if value < 0:
            raise PydanticCustomError(
                "robust_beta", "a negative fraction is not a trim; use a value in [0, 0.5)"
            )
        return value

    @pydantic.field_validator("tau")
    @classmethod
    def _tau_positive(cls, value: float) -> float:
        if value <= 0:
            raise PydanticCustomError(
                "robust_tau", "a radius tau <= 0 clips every update to the centre; use tau > 0"
            )
        return value

    @pydantic.field_validator("clip_norm")
    @classmethod
    def _clip_norm_positive(
        cls, value: float | None, info: pydantic.ValidationInfo
    ) -> float | None:
        if value is None:
            if info.data.get("name") == "clip":
                raise PydanticCustomError(
                    "robust_clip_norm", "name: clip needs a norm bound S; set clip_norm > 0"
                )
            return value
        if value <= 0:
            raise PydanticCustomError(
                "robust_clip_norm",
                "a norm bound S <= 0 discards every update; use a positive value",
            )
        return value

    def unread(self, level: str) -> dict[str, str]:
        """The options this rule does not read (its parameters belong to other rules), each
        with the rule that reads it; ``level``: ``"cloud"`` or ``"edge"``, for the message."""
        out: dict[str, str] = {}
        for option, rules in RULE_OPTIONS.items():
            if self.name not in rules:
                names = " or ".join(rules)
                out[option] = (
                    f"robust.{level}.name is {self.name}, and only {names} reads it; set "
                    f"robust.{level}.name to use it, or drop it"
                )
        return out

    @property
    def centred(self) -> bool:
        """Whether the rule keeps the previous round's aggregate as its centre (``cclip``)."""
        return self.name in CENTRED_RULES

    def keep(self, n: int) -> int:
        """Rows Multi-Krum averages among ``n``: ``m``, or ``n − f`` when unset."""
        return self.m if self.m is not None else n - self.f

    def check(self, n: int, field: str = "robust") -> None:
        """Raise a one-line :class:`ConfigError` naming ``field.<option>`` if the rule cannot
        aggregate ``n`` rows: Krum needs ``n > 2f + 2``; Multi-Krum's ``m`` must be in 1..n."""
        if n < 1:
            raise ConfigError(f"{field}: no rows to aggregate (a level with 0 clients)")
        if self.name not in ("krum", "multi_krum"):
            return
        if n <= 2 * self.f + 2:
            fix = (
                f"use f <= {(n - 3) // 2}"
                if n >= 3
                else "Krum needs at least 3 rows; use another rule"
            )
            raise ConfigError(
                f"{field}.f: {self.name} with f={self.f} needs more than 2f + 2 = "
                f"{2 * self.f + 2} rows, got {n}; {fix}"
            )
        if self.name == "multi_krum" and not 1 <= self.keep(n) <= n:
            raise ConfigError(
                f"{field}.m: multi_krum keeps m={self.keep(n)} of {n} rows; use 1 <= m <= {n}"
            )
