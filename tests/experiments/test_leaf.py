"""``leaf-shakespeare`` end to end on fabricated plays at a tiny scale (every method, 1 round)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedhp.data import shakespeare
from fedhp.errors import ConfigError
from fedhp.experiments import REPRODUCTIONS, ReproOptions, leaf
from tests.data.shakespeare_play import write_plays

TINY = leaf.Scale(
    sample_fraction=1.0,
    seq_len=6,
    hidden=4,
    rounds=1,
    local_epochs=None,
    local_steps=2,
    lr=0.5,
    batch=4,
    per_round=3,
    eval_every=1,
    test_windows=None,
)


def test_reproduction_runs_every_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEDHP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("fedhp.engine.runner.plot_run", lambda *args, **kwargs: None)  # speed
    shakespeare._load.cache_clear()
    write_plays(tmp_path / "texts", count=2, speeches=4, per_speech=4)
    opts = ReproOptions(data_dir=str(tmp_path / "texts"), out=tmp_path / "out", quiet=True)
    result = leaf.reproduce(opts, TINY)
    printed = capsys.readouterr().out.splitlines()
    assert any(
        ln.startswith("trivial baseline: leaf shakespeare always-space acc=") for ln in printed
    )
    lines = [ln for ln in printed if ln.startswith("leaf ")]
    for line in lines:  # a flagged row says so on its line
        assert (leaf.FLAG in line) == ("NOT ABOVE THE ALWAYS-SPACE BASELINE" in line)
    assert [ln.split()[2] for ln in lines] == list(leaf.METHODS)
    for line in lines:
        fields = dict(f.split("=") for f in line.split()[3:6])
        assert 0.0 <= float(fields["acc"]) <= 1.0 and fields["rounds"] == "1"
        assert float(fields["time_s"]) >= 0  # wall time, printed to 0.01 s
    assert result["clients"] == 6  # ALPHA, BETA, BOTH of two plays (GAMMA has no window)
    # the trivial baseline: printed, in the table and the JSON, and every row flagged or not
    base = result["baseline"]["acc"]["mean"]
    assert 0.0 < base < 1.0
    assert "always a space (trivial baseline)" in (tmp_path / "out" / "table.md").read_text()
    for row in result["rows"]:
        assert row["flagged"] == leaf.flagged(row["acc"]["mean"], base)
    assert result["flagged"] == [r["method"] for r in result["rows"] if r["flagged"]]
    for row in result["rows"]:
        scored = row["global_acc"] if row["method"] in leaf.GLOBAL_ROWS else row["personal_acc"]
        assert row["acc"]["mean"] == scored["mean"] and not math.isnan(scored["mean"])
    saved = json.loads((tmp_path / "out" / "table.json").read_text())
    assert [r["method"] for r in saved["rows"]] == list(leaf.METHODS)
    assert (tmp_path / "out" / "acc.png").stat().st_size > 0
    assert "| FedAvg " in (tmp_path / "out" / "table.md").read_text()


def test_paper_and_quick_settings() -> None:
    fed = leaf.Federation(clients=137, mean_steps_per_epoch=481.0)
    paper = leaf.method_overrides("fedprox", leaf.PAPER_SCALE, fed)
    assert paper == [
        "algorithm.name=fedprox",
        "algorithm.batch_size=10",
        "algorithm.lr=0.8",
        "algorithm.local_epochs=20",
        "algorithm.mu=0.001",
    ]
    # pFedMe gets FedAvg's mean number of steps: 20 epochs × 481 steps = R·K, K = 1
    pfedme = leaf.method_overrides("pfedme", leaf.PAPER_SCALE, fed)
    assert "algorithm.R=9620" in pfedme and "algorithm.K=1" in pfedme
    quick = leaf.method_overrides("sfedhp", leaf.QUICK_SCALE, fed)
    assert f"algorithm.R={leaf.QUICK_SCALE.local_steps}" in quick
    assert "algorithm.edge_lr=2.0" in quick  # η1·λ = 2
    assert fed.edges == 14
    with pytest.raises(ConfigError, match="--methods"):
        leaf.method_overrides("scaffold", leaf.QUICK_SCALE, fed)
    assert "leaf-shakespeare" in REPRODUCTIONS


def test_the_paper_scale_runs_fedprox_s_tensorflow_lstm() -> None:
    """The paper's size runs FedProx's model (``model.init=tf``); ``--quick`` keeps torch's
    initialization, the one its validation grid chose its step sizes with."""
    fed = leaf.Federation(clients=137, mean_steps_per_epoch=481.0)
    opts = ReproOptions()
    paper = leaf.run_overrides(opts, "fedavg", 0, leaf.PAPER_SCALE, fed)
    quick = leaf.run_overrides(opts, "fedavg", 0, leaf.QUICK_SCALE, fed)
    assert "model.init=tf" in paper and "model.init=torch" in quick
    assert "model.init=tf" in leaf.PAPER_SCALE.text()
