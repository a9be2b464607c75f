"""The ``privacy:`` section of the configuration (client-level DP, :mod:`fedhp.privacy`); imports
no torch, so that :mod:`fedhp.config` stays light."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from fedhp.registry import validate

Sampling = Literal["poisson", "fixed"]
AccountantKind = Literal["rdp", "pld"]


class PrivacyOptions(pydantic.BaseModel):
    """Client-level DP (DP-FedAvg): clip each client's update to norm ``clip_norm`` and add
    Gaussian noise of std ``noise_multiplier * clip_norm`` to the sum at the aggregator; ε at
    ``delta`` reported every evaluated round."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = False
    clip_norm: float = pydantic.Field(
        1.0,
        allow_inf_nan=True,
        description="L2 bound S on each client's update (.inf: no clipping)",
    )
    noise_multiplier: float = pydantic.Field(
        1.0, ge=0, description="σ: the noise std on the sum is σ·S (0: no noise, ε = ∞)"
    )
    delta: float = pydantic.Field(1e-5, gt=0, lt=1, description="δ at which ε is reported")
    sampling: Sampling = pydantic.Field(
        "fixed",
        description="how clients are drawn: poisson (each with probability q) or fixed "
        "(m of N without replacement)",
    )
    where: Literal["cloud", "edge"] = pydantic.Field(
        "cloud",
        description="who clips and adds noise: the cloud (central DP) or each edge (trusted edges)",
    )
    accountant: AccountantKind = pydantic.Field(
        "rdp", description="dp-accounting's RDP accountant or its PLD accountant (poisson only)"
    )

    @pydantic.field_validator("clip_norm")
    @classmethod
    def _positive_clip(cls, value: float) -> float:
        if not value > 0:  # also NaN
            raise ValueError(
                "must be > 0 (the L2 bound S on each update; use .inf for no clipping)"
            )
        return value

    @pydantic.model_validator(mode="after")
    def _supported(self) -> PrivacyOptions:
        if self.accountant == "pld" and self.sampling == "fixed":
            raise ValueError(
                "accountant=pld supports only sampling=poisson "
                "(use accountant=rdp, or sampling=poisson)"
            )
        if self.noise_multiplier > 0 and math.isinf(self.clip_norm):
            raise ValueError(
                "noise needs a finite clip_norm (set clip_norm, or noise_multiplier=0)"
            )
        return self


def privacy_options(data: Mapping[str, Any], prefix: str = "privacy") -> PrivacyOptions:
    """:class:`PrivacyOptions` from a mapping, or a one-line :class:`fedhp.errors.ConfigError`
    naming the field (``privacy.clip_norm: ...``) and the fix."""
    return validate(PrivacyOptions, data, prefix)
