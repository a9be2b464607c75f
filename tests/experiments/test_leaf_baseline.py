"""``leaf-shakespeare``'s trivial baseline: rows at or near it are flagged in the table and the
log (issue 43), and ``--quick`` states each row's hyperparameters."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fedhp.experiments import leaf


def _row(method: str, acc: float, personal: float = math.nan) -> dict[str, Any]:
    stat = {"mean": acc, "std": 0.0}
    return {
        "method": method,
        "label": leaf.LABELS[method],
        "metric": "global_acc" if method in leaf.GLOBAL_ROWS else "personal_acc",
        "acc": stat,
        "best_acc": stat,
        "global_acc": stat,
        "personal_acc": {"mean": personal, "std": 0.0},
        "rounds": 100,
        "seconds": {"mean": 60.0, "std": 0.0},
        "train_flops": None,
        "hyperparameters": "lr **0.8**",
        "flagged": leaf.flagged(acc, 0.1867),
    }


BASELINE = {"acc": {"mean": 0.1867, "std": 0.0}, "majority": "' '", "margin": 0.01}


@pytest.mark.parametrize(
    ("acc", "flag"),
    [(0.1787, True), (0.1867, True), (0.1960, True), (0.1968, False), (0.30, False)],
)
def test_flagged_at_or_within_a_point_of_the_baseline(acc: float, flag: bool) -> None:
    assert leaf.flagged(acc, 0.1867) is flag


def test_a_stopped_run_is_flagged() -> None:
    assert leaf.flagged(math.nan, 0.1867)


def test_table_prints_the_baseline_and_marks_flagged_rows() -> None:
    rows = [_row("fedavg", 0.31), _row("fedlps", 0.1867, 0.1867)]
    text = leaf.markdown(rows, BASELINE)
    lines = text.splitlines()
    trivial = next(ln for ln in lines if ln.startswith("| always a space"))
    assert "| 0.1867 |" in trivial
    fedavg = next(ln for ln in lines if ln.startswith("| FedAvg"))
    fedlps = next(ln for ln in lines if ln.startswith("| FedLPS"))
    assert leaf.FLAG not in fedavg and "0.3100 |" in fedavg
    assert fedlps.startswith(f"| FedLPS {leaf.FLAG} |") and f"0.1867 {leaf.FLAG}" in fedlps
    assert "| lr **0.8** |" in fedavg
    note = lines[-1]
    assert note.startswith("Trivial baseline: always predicting a space scores 0.1867")
    assert f"{leaf.FLAG}: at or within 1 point" in note and "not a result" in note
    # no baseline: the plain table (no footnote, no flags)
    assert leaf.FLAG not in leaf.markdown([_row("fedavg", 0.31)])


def test_hyper_text_marks_the_tuned_values() -> None:
    fed = leaf.Federation(clients=17, mean_steps_per_epoch=90.0)
    overrides = leaf.method_overrides("pfedme", leaf.QUICK_SCALE, fed)
    text = leaf.hyper_text(overrides, leaf.QUICK_SCALE.tuned["pfedme"])
    assert "K 1" in text and "R 20" in text and "lam 1.0" in text
    for key, value in leaf.QUICK_SCALE.tuned["pfedme"].items():
        assert f"{key} **{value}**" in text
    assert "name" not in text and "batch_size" not in text


def test_quick_rows_take_their_tuned_values_last() -> None:
    fed = leaf.Federation(clients=17, mean_steps_per_epoch=90.0)
    for method in ("fedavg", "fedprox", "pfedme", "sfedhp", "ditto", "fedper", "fedlps"):
        overrides = leaf.method_overrides(method, leaf.QUICK_SCALE, fed)
        for key, value in leaf.QUICK_SCALE.tuned[method].items():
            chosen = [o for o in overrides if o.startswith(f"algorithm.{key}=")]
            assert chosen[-1] == f"algorithm.{key}={value}", method
    # the paper's scale is untuned
    assert not leaf.PAPER_SCALE.tuned
    assert leaf.QUICK_SCALE.rounds >= 100  # enough rounds to leave the baseline (issue 43)


def test_fedlps_score_step_defaults_to_lr() -> None:
    from fedhp.algorithms.fedlps import FedLPSOptions

    assert FedLPSOptions(lr=0.8).score_step == 0.8  # the paper's one η for ω and Q
    assert FedLPSOptions(lr=0.8, score_lr=0.01).score_step == 0.01
