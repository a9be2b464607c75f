"""Malicious clients (issue 20): who they are and what they upload.

The malicious clients are a fixed set, chosen once from the run's seed: ``⌊fraction · C⌋``
clients drawn at random over all clients (``placement: spread``) or the clients of the first
edges in edge order (``concentrated``). They act on what they upload, so every algorithm that
tells :meth:`~fedhp.engine.context.RunContext.send` where its clients started from is attackable
without a change to its module; ``label_flip`` acts on their training labels instead (any
algorithm). With ``start`` the model a client received and ``u = upload − start`` its honest
update, a malicious client uploads:

* ``sign_flip``: ``start − s·u``;
* ``gaussian``: ``start + N(0, σ² I)`` (the update replaced by noise of std ``noise_std``);
* ``boost``: ``start + k·u`` (boosted model replacement, Bhagoji et al. 2019);
* ``alie``: ``start + μ − z·σ``, ``μ`` and ``σ`` the per-coordinate mean and standard deviation
  of the benign updates sent in the same aggregation (Baruch et al., "A Little Is Enough", 2019;
  ``z`` defaults to their ``z_max = Φ⁻¹((n − s)/n)``, ``s = ⌊n/2 + 1⌋ − f``), every malicious
  client the same upload;
* ``ipm``: ``start − ε·ū``, ``ū`` the plain mean of the benign updates sent in the same
  aggregation (inner-product manipulation: Xie, Koyejo and Gupta, "Fall of Empires: Breaking
  Byzantine-tolerant SGD by Inner Product Manipulation", UAI 2019; ``ε = 0.1`` by default, as in
  Karimireddy, He and Jaggi's code), every malicious client the same upload;
* ``label_flip``: trains honestly on its data with every label ``y`` replaced by ``K − 1 − y``.

Noise (``gaussian``) comes from a stream seeded by ``(seed, round)`` (like the failures), so a
resumed run draws the same and a checkpoint needs no state.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from scipy.stats import norm

from fedhp.config import AttackConfig
from fedhp.engine.federation import ClientTensors

ATTACK_SEED_OFFSET = 3_000_017
UPDATE_ATTACKS = frozenset({"sign_flip", "gaussian", "boost", "alie", "ipm"})
"""The attacks that change an upload (and so need the model the client started from)."""


def malicious_clients(cfg: AttackConfig, seed: int, edge_of_client: torch.Tensor) -> torch.Tensor:
    """``[C]`` bool on the CPU: the run's malicious clients (none unless the attack is on)."""
    num_clients = int(edge_of_client.shape[0])
    bad = torch.zeros(num_clients, dtype=torch.bool)
    if not cfg.enabled:
        return bad
    k = math.floor(cfg.fraction * num_clients + 1e-9)
    if cfg.placement == "spread":
        rng = np.random.default_rng([seed + ATTACK_SEED_OFFSET])
        chosen = torch.from_numpy(rng.permutation(num_clients)[:k])
    else:
        chosen = torch.argsort(edge_of_client.cpu(), stable=True)[:k]
    bad[chosen] = True
    return bad


def alie_z(n: int, num_malicious: int) -> float:
    """Baruch et al.'s ``z_max`` for ``n`` uploads of which ``num_malicious`` are malicious:
    the largest shift that keeps the malicious uploads inside the majority, ``Φ⁻¹((n − s)/n)``
    with ``s = ⌊n/2 + 1⌋ − f`` supporters needed."""
    s = math.floor(n / 2 + 1) - num_malicious
    return float(norm.ppf((n - s) / n))


def flip_labels(train: ClientTensors, malicious: torch.Tensor, num_classes: int) -> ClientTensors:
    """``train`` with the malicious clients' labels ``y`` replaced by ``K − 1 − y``."""
    rows = malicious.to(train.owner.device)[train.owner]
    return replace(train, y=torch.where(rows, num_classes - 1 - train.y, train.y))


class Attack:
    """The run's malicious clients and what they do to their uploads (see the module)."""

    def __init__(self, cfg: AttackConfig, malicious: torch.Tensor, seed: int) -> None:
        self.cfg = cfg
        self.malicious = malicious
        self.base_seed = seed + ATTACK_SEED_OFFSET
        self.generator = torch.Generator()

    @property
    def on_uploads(self) -> bool:
        """Whether uploads are changed (an update attack with at least one malicious client)."""
        return self.cfg.name in UPDATE_ATTACKS and bool(self.malicious.any())

    @property
    def needs_whole_rounds(self) -> bool:
        """ALIE and IPM read the benign updates of the whole aggregation: uploads must come at
        once."""
        return self.on_uploads and self.cfg.name in ("alie", "ipm")

    def begin_round(self, rnd: int) -> None:
        """Re-seed the noise stream for round ``rnd``."""
        seed = np.random.default_rng([self.base_seed, rnd]).integers(2**62)
        self.generator.manual_seed(int(seed))

    def apply(
        self, messages: torch.Tensor, nodes: torch.Tensor, start: torch.Tensor
    ) -> torch.Tensor:
        """The uploads ``messages [n, W]`` of clients ``nodes [n]`` (global ids) as the malicious
        ones among them send them; ``start`` (``[W]`` or ``[n, W]``): what each started from.
        Returns ``messages`` itself where no sender is malicious."""
        bad = self.malicious.to(nodes.device)[nodes]
        if not self.on_uploads or not bool(bad.any()):
            return messages
        start = start.expand_as(messages)
        update = messages[bad] - start[bad]
        name, cfg = self.cfg.name, self.cfg
        if name == "sign_flip":
            forged = update.mul_(-cfg.sign_scale)
        elif name == "boost":
            forged = update.mul_(cfg.boost)
        elif name == "gaussian":
            noise = torch.randn(update.shape, generator=self.generator, dtype=update.dtype)
            forged = noise.to(update.device).mul_(cfg.noise_std)
        elif name == "ipm":
            benign = messages[~bad] - start[~bad] if bool((~bad).any()) else update
            forged = benign.mean(0).mul_(-cfg.epsilon).expand_as(update)
        else:  # alie
            benign = messages[~bad] - start[~bad] if bool((~bad).any()) else update
            mean = benign.mean(0)
            std = benign.std(0, correction=1 if benign.shape[0] > 1 else 0)
            z = cfg.z if cfg.z is not None else alie_z(len(nodes), int(bad.sum()))
            forged = (mean - z * std).expand_as(update)
        out = messages.clone()
        out[bad] = start[bad] + forged
        return out
