"""``benchmarks/gpu_profile.py`` on the CPU at a tiny size, so it does not rot between GPU
sessions: it builds the default experiment, times rounds and counts a profiled round's work."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_profile_line_counts_a_round(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_profile

    tiny = ["algorithm.R=1", "algorithm.K=1", "threads=1"]
    argv = ["gpu_profile.py", "--device", "cpu", "--rounds", "1", "--profile-rounds", "1", *tiny]
    monkeypatch.setattr(sys, "argv", argv)
    gpu_profile.main()
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("profile "))
    values = dict(re.findall(r"(\w+)=([-+0-9.e]+)(?:\s|$)", line))
    assert "device=cpu" in line
    assert float(values["round_s"]) > 0 and float(values["profiled_round_s"]) > 0
    # no device: the operator calls stand in for launches; a round of 20 clients makes many
    assert float(values["launches"]) > 100
    assert float(values["syncs"]) == 0 and float(values["busy"]) == 0
