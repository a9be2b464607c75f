"""Attacks and robust rules in real (tiny) runs: the mean path unchanged, the identities with it,
attacked runs, the one-line configuration errors, and checkpoint/resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.runner import run_experiment
from fedhp.errors import ConfigError
from fedhp.unread import read_overrides
from tests.engine.test_checkpoint import FAST, kill_before_round, same_results
from tests.engine.test_checkpoint import run as checkpoint_run

# MNIST Setting 1 (20 clients, 4 edges of 5), MLR, 2 local steps, 3 rounds.
TINY = [
    "progress=false",
    "threads=1",
    "model.name=mlr",
    "eval_every=1",
    "eval_train=false",
    "algorithm.name=fedavg",
    "algorithm.local_steps=2",
    "rounds=3",
    "checkpoint_every=0",
]
SIGN_FLIP = ["faults.attack.name=sign_flip", "faults.attack.fraction=0.2"]


def run(out: Path, *overrides: str) -> torch.Tensor:
    """Run ``TINY`` + ``overrides`` into ``out``; the final global model."""
    given = [*read_overrides(TINY, overrides), *overrides]
    run_experiment(build_experiment(resolve_config(None, given)), out)
    state = torch.load(out / "final_state.pt", weights_only=True)["state"]
    return state["global"]


def test_explicit_mean_changes_nothing_and_its_unread_options_are_refused(tmp_path: Path) -> None:
    run(tmp_path / "default")
    run(tmp_path / "mean", "robust.cloud.name=mean", "faults.attack.name=none")
    for name in ("metrics.csv", "final_state.pt"):
        assert (tmp_path / "default" / name).read_bytes() == (tmp_path / "mean" / name).read_bytes()
    for unread in ("robust.cloud.beta=0.3", "robust.cloud.f=4", "faults.attack.fraction=0.2"):
        with pytest.raises(ConfigError, match=f"^{unread.split('=')[0]} is not read"):
            resolve_config(None, [*TINY, "robust.cloud.name=mean", unread])


def test_trimmed_mean_beta0_and_multi_krum_m_n_are_the_mean(tmp_path: Path) -> None:
    mean = run(tmp_path / "mean")
    trimmed = run(tmp_path / "trim", "robust.cloud.name=trimmed_mean", "robust.cloud.beta=0")
    mk = run(
        tmp_path / "mk", "robust.cloud.name=multi_krum", "robust.cloud.f=1", "robust.cloud.m=20"
    )
    torch.testing.assert_close(trimmed, mean, rtol=0, atol=1e-5)
    torch.testing.assert_close(mk, mean, rtol=0, atol=1e-5)


def test_sign_flip_moves_the_mean_and_robust_rules_stay_finite(tmp_path: Path) -> None:
    clean = run(tmp_path / "clean")
    attacked = run(tmp_path / "attacked", *SIGN_FLIP, "faults.attack.sign_scale=4")
    assert not torch.allclose(attacked, clean, atol=1e-3)
    for rule in (
        ["robust.cloud.name=median"],
        ["robust.cloud.name=trimmed_mean", "robust.cloud.beta=0.2"],
        ["robust.cloud.name=multi_krum", "robust.cloud.f=4"],
        ["robust.cloud.name=clip", "robust.cloud.clip_norm=0.2"],
    ):
        name = rule[0].split("=")[1]
        own_clean = run(tmp_path / f"{name}-clean", *rule)
        got = run(tmp_path / name, *SIGN_FLIP, "faults.attack.sign_scale=4", *rule)
        assert torch.isfinite(got).all()
        # the attack moves a robust rule far less than it moves the mean
        assert (got - own_clean).norm() < 0.5 * (attacked - clean).norm(), rule


class Recorder:
    """Stands in for the cloud's LevelRule and records what it aggregates and returns."""

    def __init__(self, rule: LevelRule) -> None:
        self.rule, self.folds = rule, False
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def begin_round(self, rnd: int) -> None:
        self.rule.begin_round(rnd)

    def __call__(
        self,
        rows: torch.Tensor,
        weights: torch.Tensor,
        start: torch.Tensor | None = None,
        denominator: float | None = None,
    ) -> torch.Tensor:
        out = self.rule(rows, weights, start, denominator)
        self.calls.append((rows, out))
        return out


def test_krum_never_picks_a_sign_flipped_upload(tmp_path: Path) -> None:
    krum = ["robust.cloud.name=krum", "robust.cloud.f=4", "faults.attack.sign_scale=4"]
    exp = build_experiment(resolve_config(None, [*TINY, *SIGN_FLIP, *krum]))
    assert exp.ctx.attack is not None and exp.ctx.cloud_rule is not None
    recorder = Recorder(exp.ctx.cloud_rule)
    exp.ctx.cloud_rule = recorder  # type: ignore[assignment]
    run_experiment(exp, tmp_path)
    bad = exp.ctx.attack.malicious
    assert len(recorder.calls) == 3 and int(bad.sum()) == 4
    for rows, out in recorder.calls:
        picked = [i for i in range(len(rows)) if torch.equal(rows[i], out)]
        assert len(picked) == 1 and not bad[picked[0]]


def test_label_flip_flips_the_malicious_clients_training_labels() -> None:
    clean = build_experiment(resolve_config(None, TINY))
    flipped = build_experiment(
        resolve_config(None, [*TINY, "faults.attack.name=label_flip", "faults.attack.fraction=0.2"])
    )
    y0, y1, owner = clean.ctx.fed.train.y, flipped.ctx.fed.train.y, clean.ctx.fed.train.owner
    changed = owner[y0 != y1].unique()
    assert len(changed) == 4  # ⌊0.2 · 20⌋ clients
    rows = torch.isin(owner, changed)
    assert torch.equal(y1[rows], 9 - y0[rows]) and torch.equal(y1[~rows], y0[~rows])
    attack = flipped.ctx.attack
    assert attack is not None and not attack.on_uploads  # labels only: uploads untouched


BAD_CONFIGS = [
    (["robust.cloud.name=trimmed_mean", "robust.cloud.beta=0.5"], "robust.cloud.beta"),
    (["robust.cloud.name=krum", "robust.cloud.f=9"], "robust.cloud.f"),
    (["robust.cloud.name=clip", "robust.cloud.clip_norm=0"], "robust.cloud.clip_norm"),
    (["robust.cloud.name=clip"], "robust.cloud.clip_norm"),
    (["robust.edge.name=median"], "robust.edge.name"),
    (
        ["algorithm.name=hierfavg", "robust.edge.name=krum", "robust.edge.f=2"],
        "robust.edge.f",
    ),
    (["algorithm.name=fednova", *SIGN_FLIP], "faults.attack.name"),
    (["robust.cloud.name=krum", "robust.cloud.f=1", "robust.cloud.bucket=5"], "robust.cloud.f"),
    (["faults.attack.name=sign_flip", "faults.attack.fraction=1.0"], "faults.attack.fraction"),
]


@pytest.mark.parametrize(("args", "field"), BAD_CONFIGS, ids=[b[1] for b in BAD_CONFIGS])
def test_bad_adversarial_config_is_one_line_error(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    given = {a.split("=")[0] for a in args}  # (a key given twice is a warning line)
    base = read_overrides([a for a in TINY if a.split("=")[0] not in given], args)
    code = main(["run", *base, *args, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in err, err


HIER_ATTACKED = [
    "threads=1",
    "algorithm.name=hierfavg",
    "algorithm.kappa1=2",
    "algorithm.kappa2=2",
    "faults.attack.name=gaussian",
    "faults.attack.fraction=0.2",
    "faults.attack.noise_std=0.1",
    "robust.edge.name=median",
    "robust.cloud.name=trimmed_mean",
    "robust.cloud.beta=0.25",
]


def test_attacked_robust_run_resumes_bit_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = tmp_path / "ref"
    checkpoint_run(ref, *HIER_ATTACKED)
    out = tmp_path / "killed"
    given = [*read_overrides(FAST, HIER_ATTACKED), *HIER_ATTACKED]
    exp = build_experiment(resolve_config(None, given))
    kill_before_round(exp, out, 3, monkeypatch)  # the checkpoint of round 2 exists
    torch.manual_seed(12345)
    checkpoint_run(out, *HIER_ATTACKED, resume=True)
    same_results(ref, out)
    other = tmp_path / "no-attack"
    checkpoint_run(other, *HIER_ATTACKED[:4], *HIER_ATTACKED[7:])
    assert (ref / "metrics.csv").read_bytes() != (other / "metrics.csv").read_bytes()
