"""Client momentum (``algorithm.client_momentum``, issue 41) and the centred rule's state in real
(tiny) runs: β = 0 changes nothing, β > 0 is the formula round after round (FedAvg, HierFAVG's
edge rounds), checkpoint/resume is exact, an attacked ``cclip`` run completes, and bad options
are one-line errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import fedhp.engine.aggregation
from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.engine.experiment import Experiment
from fedhp.engine.runner import run_experiment
from fedhp.engine.uplink import CENTRE_KEYS, MOMENTUM_KEY, Uplink
from fedhp.unread import read_overrides
from tests.engine.test_checkpoint import FAST, kill_before_round, same_results
from tests.engine.test_checkpoint import run as checkpoint_run
from tests.engine.test_robust_runs import TINY

HIER = ["algorithm.name=hierfavg", "algorithm.kappa1=2", "algorithm.kappa2=2"]
IPM = ["faults.attack.name=ipm", "faults.attack.fraction=0.2"]


def final_state(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final_state.pt", weights_only=True)["state"]


def run(out: Path, *overrides: str) -> dict[str, torch.Tensor]:
    given = [*read_overrides(TINY, overrides), *overrides]
    run_experiment(build_experiment(resolve_config(None, given)), out)
    return final_state(out)


def test_accumulate_by_hand() -> None:
    """β = 0.25, three clients over two rounds; client 1 sits out round 1, client 0 round 2."""
    uplink = Uplink("cloud", momentum=0.25)
    memory = torch.zeros(3, 2)
    s1 = torch.tensor([1.0, 1.0])
    rows = s1 + torch.tensor([[2.0, 0.0], [0.0, 4.0]])  # clients 0 and 2
    sent = uplink.accumulate(rows, s1, memory, torch.tensor([0, 2]))
    # m = ¼·0 + ¾·u
    assert torch.equal(memory, torch.tensor([[1.5, 0.0], [0.0, 0.0], [0.0, 3.0]]))
    assert torch.equal(sent, s1 + torch.tensor([[1.5, 0.0], [0.0, 3.0]]))
    s2 = torch.tensor([[0.0, 0.0], [-1.0, 3.0]])  # per-row starts (edge models)
    rows = s2 + torch.tensor([[4.0, 4.0], [2.0, -2.0]])  # clients 1 and 2
    sent = uplink.accumulate(rows, s2, memory, torch.tensor([1, 2]))
    # m1 = ¼·0 + ¾·(4, 4); m2 = ¼·(0, 3) + ¾·(2, −2); m0 unchanged
    assert torch.equal(memory, torch.tensor([[1.5, 0.0], [3.0, 3.0], [1.5, -0.75]]))
    assert torch.equal(sent, s2 + torch.tensor([[3.0, 3.0], [1.5, -0.75]]))
    off = Uplink("cloud")
    assert off.accumulate(rows, s2, memory, torch.tensor([1, 2])) is rows


@pytest.mark.parametrize("algorithm", [["algorithm.name=fedavg"], HIER], ids=["fedavg", "hier"])
def test_momentum_zero_changes_nothing(tmp_path: Path, algorithm: list[str]) -> None:
    """β = 0 is the run without the option, byte for byte (and the same state keys)."""
    a = run(tmp_path / "a", *algorithm, *IPM, "robust.cloud.name=median")
    b = run(
        tmp_path / "b", *algorithm, *IPM, "robust.cloud.name=median", "algorithm.client_momentum=0"
    )
    assert set(a) == set(b) == {"global"}
    for name in ("metrics.csv", "per_client.csv", "final_state.pt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def record_local_sgd(exp: Experiment[Any, Any]) -> list[list[tuple[torch.Tensor, ...]]]:
    """Record every ``local_sgd`` call's clients, start rows and trained rows, by round."""
    ctx = exp.ctx
    rounds: list[list[tuple[torch.Tensor, ...]]] = []
    local_sgd: Callable[..., Any] = ctx.local_sgd
    begin: Callable[[int], Any] = ctx.begin_round

    def begin_round(rnd: int) -> Any:
        rounds.append([])
        return begin(rnd)

    def recorded(params: torch.Tensor, clients: torch.Tensor, *args: Any, **kw: Any) -> Any:
        start = params.expand(len(clients), -1).clone()
        out = local_sgd(params, clients, *args, **kw)
        rounds[-1].append((clients.clone(), start, out[0].clone()))
        return out

    ctx.local_sgd = recorded  # type: ignore[method-assign]
    ctx.begin_round = begin_round  # type: ignore[method-assign]
    return rounds


def test_fedavg_momentum_is_the_formula_over_rounds(tmp_path: Path) -> None:
    """β = 0.25, half the clients each round: each trained client's m ← β m + (1 − β)(x − w),
    the others' m unchanged, and the cloud's mean of w + m (uniform weights)."""
    beta = 0.25
    overrides = [*TINY, "rounds=2", "federation.client_fraction=0.5"]
    exp = build_experiment(resolve_config(None, [*overrides, f"algorithm.client_momentum={beta}"]))
    rounds = record_local_sgd(exp)
    run_experiment(exp, tmp_path)
    state = final_state(tmp_path)
    m = torch.zeros_like(state[MOMENTUM_KEY])
    trained = set()
    for calls in rounds:
        for clients, start, params in calls:
            m[clients] = beta * m[clients] + (1 - beta) * (params - start)
            trained |= set(clients.tolist())
    assert len(rounds) == 2 and 10 < len(trained) < 20  # someone sat out both rounds
    torch.testing.assert_close(state[MOMENTUM_KEY], m, rtol=0, atol=1e-7)
    untouched = [c for c in range(20) if c not in trained]
    assert bool((state[MOMENTUM_KEY][untouched] == 0).all())
    last = torch.cat([c for c, _, _ in rounds[-1]])
    w = rounds[-1][0][1][0]
    torch.testing.assert_close(state["global"], w + m[last].mean(0), rtol=0, atol=1e-6)


def test_hierfavg_momentum_advances_every_edge_round(tmp_path: Path) -> None:
    beta = 0.75
    exp = build_experiment(
        resolve_config(
            None,
            [*read_overrides(TINY, HIER), *HIER, "rounds=2", f"algorithm.client_momentum={beta}"],
        )
    )
    rounds = record_local_sgd(exp)
    run_experiment(exp, tmp_path)
    state = final_state(tmp_path)
    m = torch.zeros_like(state[MOMENTUM_KEY])
    for calls in rounds:
        assert len(calls) == 2  # κ2 = 2 edge rounds, each one local training
        for clients, start, params in calls:
            m[clients] = beta * m[clients] + (1 - beta) * (params - start)
    torch.testing.assert_close(state[MOMENTUM_KEY], m, rtol=0, atol=1e-7)


def test_ipm_against_cclip_completes_and_keeps_its_centre(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedAvg, 20 clients, 20 % IPM, cclip at the cloud (with momentum): the run completes, each
    round's rule starts from the previous round's aggregate update (0 in the first), and the
    state keeps the last one."""
    rule = ["robust.cloud.name=cclip", "robust.cloud.tau=0.5", "algorithm.client_momentum=0.9"]
    one = run(tmp_path / "one", *IPM, *rule, "rounds=1")
    two = run(tmp_path / "two", *IPM, *rule, "rounds=2")
    centres: list[torch.Tensor] = []
    aggregate = fedhp.engine.aggregation.aggregate

    def recorded(*args: Any, **kw: Any) -> torch.Tensor:
        centre = kw["centre"]
        assert centre is not None
        centres.append(centre.clone())
        return aggregate(*args, **kw)

    monkeypatch.setattr(fedhp.engine.aggregation, "aggregate", recorded)
    three = run(tmp_path / "three", *IPM, *rule)
    assert set(three) == {"global", MOMENTUM_KEY, CENTRE_KEYS["cloud"]}
    assert all(bool(torch.isfinite(v).all()) for v in three.values())
    assert len(centres) == 3 and not bool(centres[0].any())
    torch.testing.assert_close(centres[2], two["global"] - one["global"], rtol=0, atol=1e-6)
    torch.testing.assert_close(
        three[CENTRE_KEYS["cloud"]], three["global"] - two["global"], rtol=0, atol=1e-6
    )
    lines = (tmp_path / "three" / "metrics.csv").read_text().splitlines()
    assert len(lines) == 4  # a header and 3 evaluated rounds


def test_hierfavg_rules_at_both_levels_run(tmp_path: Path) -> None:
    state = run(
        tmp_path,
        *HIER,
        *IPM,
        "robust.edge.name=cclip",
        "robust.edge.tau=0.3",
        "robust.cloud.name=geomed",
        "robust.cloud.bucket=2",
        "algorithm.client_momentum=0.5",
    )
    assert set(state) == {"global", MOMENTUM_KEY, CENTRE_KEYS["edge"]}
    assert state[CENTRE_KEYS["edge"]].shape == (4, 7850)
    assert bool(state[CENTRE_KEYS["edge"]].abs().sum(1).gt(0).all())  # every edge aggregated


RESUMED = {
    "fedavg": [
        "federation.client_fraction=0.5",
        "algorithm.client_momentum=0.9",
        "robust.cloud.name=cclip",
        "robust.cloud.tau=0.5",
        *IPM,
    ],
    "hierfavg": [
        *HIER,
        "algorithm.client_momentum=0.9",
        "robust.edge.name=cclip",
        "robust.edge.tau=0.3",
        "robust.cloud.name=cclip",
        "robust.cloud.tau=0.2",
        *IPM,
    ],
}


@pytest.mark.parametrize("name", list(RESUMED))
def test_momentum_and_centres_resume_bit_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    args = [*RESUMED[name], "threads=1"]
    ref = tmp_path / "ref"
    checkpoint_run(ref, *args)
    out = tmp_path / "killed"
    exp = build_experiment(resolve_config(None, [*read_overrides(FAST, args), *args]))
    kill_before_round(exp, out, 3, monkeypatch)  # the checkpoint of round 2 exists
    torch.manual_seed(12345)
    checkpoint_run(out, *args, resume=True)
    same_results(ref, out)
    assert MOMENTUM_KEY in final_state(ref)


BAD = [
    (["algorithm.client_momentum=1"], "algorithm.client_momentum"),
    (["algorithm.client_momentum=-0.1"], "algorithm.client_momentum"),
    (["algorithm.name=fednova", "algorithm.client_momentum=0.5"], "algorithm.client_momentum"),
    (["algorithm.name=pfedme", "algorithm.client_momentum=0.5"], "algorithm.client_momentum"),
    (["robust.cloud.name=cclip", "robust.cloud.tau=0"], "robust.cloud.tau"),
    (["robust.cloud.name=median", "robust.cloud.bucket=21"], "robust.cloud.bucket"),
    ([*HIER, "robust.edge.name=geomed", "robust.edge.bucket=6"], "robust.edge.bucket"),
    (["algorithm.name=perfedavg", "robust.cloud.name=cclip"], "robust.cloud.name"),
    (["algorithm.name=fednova", "robust.cloud.name=geomed"], "robust.cloud.name"),
    (["algorithm.name=fednova", *IPM], "faults.attack.name"),
    ([*IPM, "faults.attack.epsilon=0"], "faults.attack.epsilon"),
]


@pytest.mark.parametrize(("args", "field"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_options_are_one_line_errors(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    given = {a.split("=")[0] for a in args}
    base = read_overrides([a for a in TINY if a.split("=")[0] not in given], args)
    code = main(["run", *base, *args, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in err, err
