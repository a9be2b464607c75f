"""Client-level DP in a run (issue 20): ε in metrics.csv and summary.json from the accountant,
σ = 0 and S = ∞ is plain FedAvg bit for bit, checkpoint/resume with noise, config errors."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch

from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedhp.engine.privacy_budget import round_sampling
from fedhp.engine.runner import run_experiment
from fedhp.privacy.accountant import PrivacyAccountant
from fedhp.privacy.mechanism import clip_updates
from fedhp.privacy.options import PrivacyOptions
from fedhp.robust import RobustOptions
from fedhp.unread import read_overrides
from tests.conftest import require_module
from tests.engine.test_checkpoint import FAST, kill_before_round, same_results

require_module("dp_accounting")

SMALL = [*FAST, "threads=1", "rounds=4"]
DP = ["privacy.enabled=true", "privacy.noise_multiplier=1.0", "privacy.clip_norm=0.5"]
POISSON = [*DP, "privacy.sampling=poisson", "federation.client_fraction=0.5"]


def run(out: Path, *overrides: str, resume: bool = False) -> dict[str, object]:
    cfg = resolve_config(None, [*read_overrides(SMALL, overrides), *overrides])
    return run_experiment(build_experiment(cfg), out, resume=resume)


def table(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    return rows[0], rows[1:]


def without(path: Path, column: str) -> str:
    """``path``'s CSV text without ``column``."""
    header, rows = table(path)
    keep = [i for i, name in enumerate(header) if name != column]
    return "\n".join(",".join(r[i] for i in keep) for r in [header, *rows])


def epsilons(path: Path) -> list[float]:
    header, rows = table(path)
    return [float(r[header.index("epsilon")]) for r in rows]


def test_no_noise_and_no_clipping_is_plain_fedavg_bit_for_bit(tmp_path: Path) -> None:
    plain, dp = tmp_path / "plain", tmp_path / "dp"
    run(plain)
    summary = run(
        dp, "privacy.enabled=true", "privacy.noise_multiplier=0", "privacy.clip_norm=.inf"
    )
    assert "epsilon" not in table(plain / "metrics.csv")[0]  # runs without DP: no new column
    assert epsilons(dp / "metrics.csv") == [math.inf] * 4
    assert without(dp / "metrics.csv", "epsilon") == without(plain / "metrics.csv", "epsilon")
    assert (dp / "per_client.csv").read_bytes() == (plain / "per_client.csv").read_bytes()
    a, b = (torch.load(d / "final_state.pt", weights_only=True)["state"] for d in (plain, dp))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    privacy = summary["privacy"]
    assert isinstance(privacy, dict)
    assert privacy["epsilon"] is None and privacy["clip_norm"] is None  # ε = ∞, S = ∞
    assert privacy["noise_multiplier"] == 0 and privacy["rounds"] == 4
    assert "privacy" not in json.loads((plain / "summary.json").read_text())


def test_noise_changes_the_model_and_epsilon_is_the_accountants(tmp_path: Path) -> None:
    plain, dp = tmp_path / "plain", tmp_path / "dp"
    run(plain, "federation.client_fraction=0.5")
    summary = run(dp, *POISSON)
    a, b = (torch.load(d / "final_state.pt", weights_only=True)["state"] for d in (plain, dp))
    assert not torch.equal(a["global"], b["global"])
    by_hand = PrivacyAccountant(20, sampling="poisson")
    expected = []
    for _ in range(4):
        by_hand.record_round(1.0, sample_rate=0.5)
        expected.append(by_hand.epsilon(1e-5))
    assert epsilons(dp / "metrics.csv") == expected  # every round evaluated (eval_every=1)
    assert 0 < expected[0] < expected[-1] < math.inf
    privacy = summary["privacy"]
    assert isinstance(privacy, dict)
    assert privacy == {
        "epsilon": expected[-1],
        "delta": 1e-5,
        "noise_multiplier": 1.0,
        "clip_norm": 0.5,
        "sampling": "poisson",
        "sample_rate": 0.5,
        "releases": 1,
        "accountant": "rdp",
        "where": "cloud",
        "rounds": 4,
    }
    assert json.loads((dp / "summary.json").read_text())["privacy"] == privacy


def test_resumed_private_run_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, out = tmp_path / "ref", tmp_path / "killed"
    run(ref, *POISSON)
    exp = build_experiment(resolve_config(None, [*SMALL, *POISSON]))
    kill_before_round(exp, out, 3, monkeypatch)  # the checkpoint of round 2 exists
    saved = load_checkpoint(out / CHECKPOINT_FILE)
    assert saved["round"] == 2 and saved["privacy"]["runs"][0]["rounds"] == 2
    torch.manual_seed(12345)
    run(out, *POISSON, resume=True)
    same_results(ref, out)  # metrics.csv (ε included), final state, checkpoint, summary
    assert len(epsilons(out / "metrics.csv")) == 4


def test_checkpoints_of_runs_without_dp_have_no_privacy_entry(tmp_path: Path) -> None:
    run(tmp_path, "rounds=2")
    assert "privacy" not in load_checkpoint(tmp_path / CHECKPOINT_FILE)


BAD = [
    (["federation.weighting=samples"], "federation.weighting"),
    (["privacy.accountant=pld"], "privacy"),
    (["privacy.clip_norm=0"], "privacy.clip_norm"),
    (["privacy.clip_norm=-1"], "privacy.clip_norm"),
    (["privacy.where=edge"], "privacy.where"),
]


@pytest.mark.parametrize(("args", "field"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_privacy_config_errors_are_one_line(
    args: list[str], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = {a.split("=")[0] for a in args}  # (a key given twice is a warning line)
    base = [a for a in DP if a.split("=")[0] not in given]
    argv = ["run", "--out", str(tmp_path), "rounds=1", "algorithm.name=fedavg", *base, *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err


def test_round_sampling_per_method() -> None:
    def sampling(*overrides: str) -> dict[str, object]:
        cfg = resolve_config(None, [*DP, *overrides])
        from fedhp.algorithms import ALGORITHMS

        return round_sampling(cfg, ALGORITHMS.build(cfg.algorithm, "algorithm"))

    flat = ["algorithm.name=fedavg", "federation.num_clients=40"]
    assert sampling(*flat, "federation.client_fraction=0.1") == {"sample_size": 4, "releases": 1}
    assert sampling(*flat, "federation.client_fraction=0.01") == {"sample_size": 1, "releases": 1}
    assert sampling(*flat, "federation.client_fraction=0.3", "privacy.sampling=poisson") == {
        "sample_rate": 0.3,
        "releases": 1,
    }
    # HierFAVG, noise at the edges: every client, kappa2 noised edge models per round (sampled
    # edges are not accounted for: an upper bound).
    hier = ["algorithm.name=hierfavg", "algorithm.kappa2=3", "privacy.where=edge"]
    assert sampling(*hier, "federation.edges_per_round=2") == {"sample_size": 20, "releases": 3}


def test_hierfavg_edge_noise_is_accounted_with_its_releases(tmp_path: Path) -> None:
    hier = ["algorithm.name=hierfavg", "algorithm.kappa1=2", "algorithm.kappa2=2"]
    summary = run(
        tmp_path, *hier, *DP, "privacy.where=edge", "privacy.noise_multiplier=4", "rounds=2"
    )
    by_hand = PrivacyAccountant(20, sampling="fixed")
    by_hand.record_round(4.0, sample_size=20, releases=2, rounds=2)
    privacy = summary["privacy"]
    assert isinstance(privacy, dict)
    assert privacy["epsilon"] == by_hand.epsilon(1e-5) and privacy["releases"] == 2


def test_clipping_without_noise_changes_only_through_the_clipped_rows() -> None:
    """σ = 0, finite S: the level's aggregate is the start plus the mean of the clipped updates;
    rows within S enter unchanged (factor exactly 1), so with S above every norm the result is
    the plain mean up to rounding."""
    g = torch.Generator().manual_seed(0)
    start = torch.randn(50, generator=g)
    updates = (
        torch.randn(6, 50, generator=g) * torch.tensor([0.1, 0.2, 3.0, 0.3, 5.0, 0.05])[:, None]
    )
    rows = start + updates
    norms = torch.linalg.vector_norm(rows - start, dim=1)
    s = 1.0
    options = PrivacyOptions(enabled=True, noise_multiplier=0.0, clip_norm=s)
    rule = LevelRule(RobustOptions(), "robust.cloud", options)
    rule.begin_round(0)
    out = rule(rows, torch.ones(6), start)
    clipped = clip_updates(rows - start, s)
    small = norms <= s
    assert torch.equal(clipped[small], (rows - start)[small])  # unclipped rows: bit for bit
    assert torch.allclose(torch.linalg.vector_norm(clipped[~small], dim=1), torch.tensor(s))
    assert torch.equal(out, start + clipped.sum(0) / 6)
    loose = LevelRule(
        RobustOptions(), "robust.cloud", options.model_copy(update={"clip_norm": 1e9})
    )
    torch.testing.assert_close(loose(rows, torch.ones(6), start), rows.mean(0))
