"""``fedhp reproduce dp``: its configurations, the calibrated noise, the result lines, table and
figure (the runs themselves faked: a real one needs 1,000 MNIST clients)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from fedhp.config import resolve_config
from fedhp.errors import ConfigError
from fedhp.experiments import REPRODUCTIONS, common, dp
from fedhp.experiments.common import ReproOptions
from fedhp.privacy.accountant import PrivacyAccountant
from tests.conftest import require_module

require_module("dp_accounting")

LINE = re.compile(r"^dp (fedavg|hierfavg) eps=(inf|[0-9.]+) acc=([0-9.]+)$")


def test_runs_resolve_and_the_noise_meets_each_target() -> None:
    opts = ReproOptions(rounds=20, rounds_given=True)
    for eps in dp.EPSILONS:
        cfg = resolve_config(None, dp.run_overrides(opts, "fedavg", eps, 0))
        fed, privacy = cfg.federation, cfg.privacy
        assert cfg.partition["name"] == "shards" and fed.num_clients == 1000
        assert fed.client_fraction == 0.1 and privacy.sampling == "poisson"
        assert privacy.enabled and cfg.rounds == 20 and cfg.algorithm["name"] == "fedavg"
        if math.isinf(eps):
            assert privacy.noise_multiplier == 0 and math.isinf(privacy.clip_norm)
            continue
        assert privacy.clip_norm == dp.CLIP
        acc = PrivacyAccountant(1000, sampling="poisson")
        acc.record_round(privacy.noise_multiplier, sample_rate=0.1, rounds=20)
        assert 0.99 * eps <= acc.epsilon(dp.DELTA) <= eps
    hier = resolve_config(None, dp.run_overrides(opts, "hierfavg", 8.0, 0))
    assert hier.privacy.where == "edge" and hier.privacy.sampling == "fixed"
    acc = PrivacyAccountant(1000, sampling="fixed")
    acc.record_round(hier.privacy.noise_multiplier, sample_size=1000, releases=2, rounds=20)
    assert 7.92 <= acc.epsilon(dp.DELTA) <= 8.0


def _fake_run(overrides: list[str], folder: Path) -> dict[str, Any]:
    cfg = resolve_config(None, overrides)
    sigma = cfg.privacy.noise_multiplier
    eps = None
    if sigma > 0:
        acc = PrivacyAccountant(1000, sampling=cfg.privacy.sampling)
        kwargs: dict[str, Any] = (
            {"sample_rate": 0.1} if cfg.privacy.sampling == "poisson" else {"sample_size": 1000}
        )
        acc.record_round(sigma, rounds=cfg.rounds, **kwargs)
        eps = acc.epsilon(dp.DELTA)
    acc_value = 0.95 - 0.02 * sigma
    return {
        "final_global_acc": acc_value,
        "best_global_acc": acc_value + 0.01,
        "seconds": 1.0,
        "privacy": {"epsilon": eps, "noise_multiplier": sigma, "clip_norm": 0.5 if eps else None},
    }


def test_reproduce_prints_one_line_per_epsilon_and_writes_table_and_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(common, "run_config", _fake_run)
    opts = ReproOptions(rounds=10, rounds_given=True, out=tmp_path, quiet=True)
    result = REPRODUCTIONS["dp"](opts)
    lines = capsys.readouterr().out.splitlines()
    matches = [LINE.match(line) for line in lines]
    assert len(lines) == 5 and all(matches)
    assert [m.group(2) for m in matches if m] == ["1.0000", "2.0000", "4.0000", "8.0000", "inf"]
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["rows"] == json.loads(json.dumps(result["rows"]))
    assert [r["target_epsilon"] for r in table["rows"]] == [1.0, 2.0, 4.0, 8.0, None]
    assert "| fedavg | ∞ |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "acc-vs-eps.png").stat().st_size > 1000


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="--methods"):
        dp.reproduce(ReproOptions(methods=["scaffold"]))
    with pytest.raises(ConfigError, match="--dataset"):
        dp.reproduce(ReproOptions(dataset="fmnist"))
    with pytest.raises(ConfigError, match="--model"):
        dp.reproduce(ReproOptions(model="vgg"))
