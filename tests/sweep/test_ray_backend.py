"""``fedhp sweep --backend ray``: batches as Ray tasks give the in-process sweep's files, and a
worker's errors come back as fedhp's one-line errors.

Each test runs a private local Ray (its temp dir a fresh short folder, not the shared /tmp/ray;
``RAY_ADDRESS`` unset so no other cluster is joined). Starting Ray on a loaded 2-core machine takes
10-20 s, hence ``slow``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhp.errors import ConfigError, DatasetError, FedhpError
from fedhp.sweep.execute import run_batch
from fedhp.sweep.grid import parse_grid, points_of
from fedhp.sweep.plan import make_batches, plan_runs
from tests.conftest import require_module

ray = require_module("ray")

from fedhp.sweep.ray_backend import run_batches_ray  # noqa: E402 (after the skip)

BASE = [
    "rounds=2",
    "eval_every=1",
    "progress=false",
    "threads=1",
    "checkpoint_every=0",
    "model.name=mlr",
    "algorithm.local_steps=2",
]

BOOM = '''
"""FedAvg whose clients fail in training: a fedhp error, a plain bug or a dying worker."""

import os

from fedhp.algorithms.base import ALGORITHMS
from fedhp.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhp.errors import ConfigError, DatasetError, FedhpError


class Boom(FedAvg):
    def train(self, state, task):
        if self.options.error == "fedhp":
            raise DatasetError("boom: client data vanished on the worker; check the data")
        if self.options.error == "exit":
            os._exit(3)
        raise ValueError("boom: a bug")


@ALGORITHMS.register("boom")
class BoomOptions(FedAvgOptions):
    error: str = "fedhp"

    def build(self, ctx):
        return Boom(self, ctx)
'''


@pytest.fixture
def private_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Ray's files in a fresh short temp dir (its socket paths must stay short); no
    ``RAY_ADDRESS``; no Ray left connected afterwards."""
    tmp = tempfile.mkdtemp(prefix="fedhp-ray-")
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def test_missing_ray_is_a_one_line_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"^--backend ray: Ray is not installed; pip install"):
        run_batches_ray([])


def test_no_batches_start_no_ray() -> None:
    assert run_batches_ray([]) == []
    assert not ray.is_initialized()


@pytest.mark.slow
def test_ray_sweep_writes_the_in_process_files(
    tmp_path: Path, private_ray: None, capfd: pytest.CaptureFixture[str]
) -> None:
    points = points_of(parse_grid(["algorithm.lr=0.05,0.1"]))
    base = [*BASE, "algorithm.name=fedavg"]

    here = plan_runs(base, points, [0, 1], tmp_path / "inprocess")
    for batch in make_batches(here, 2):
        run_batch(batch, "sequential")

    runs = plan_runs(base, points, [0, 1], tmp_path / "ray")
    batches = make_batches(runs, 2)
    assert [len(b) for b in batches] == [2, 2]
    ticks: list[int] = []
    capfd.readouterr()
    reports = run_batches_ray(batches, "sequential", progress=ticks.append, num_cpus=2)
    assert capfd.readouterr() == ("", "")  # Ray says nothing (fedhp's lines go to `log`)

    assert not ray.is_initialized()  # the local Ray it started is shut down
    assert ticks == [4, 4]  # each batch's rounds as it finished
    assert [r.batching for r in reports] == ["sequential", "sequential"]
    # reports in the batches' order, summaries in each batch's order
    got = [(s["seed"], s["rounds"]) for r in reports for s in r.summaries]
    assert got == [(run.seed, 2) for batch in batches for run in batch]
    for a, b in zip(here, runs, strict=True):
        assert (Path(a.out_dir) / "metrics.csv").read_bytes() == (
            Path(b.out_dir) / "metrics.csv"
        ).read_bytes(), b.out_dir

    # a second sweep over the same folder keeps the finished runs (decided in the workers)
    ticks.clear()
    again = run_batches_ray(batches, progress=ticks.append, num_cpus=2)
    assert [r.batching for r in again] == ["kept", "kept"]
    assert ticks == [4, 4]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")  # Ray's tip from the test's own ray.init
def test_worker_errors_come_back_one_line(
    tmp_path: Path, private_ray: None, capfd: pytest.CaptureFixture[str]
) -> None:
    plugin = tmp_path / "boom.py"
    plugin.write_text(textwrap.dedent(BOOM))
    base = [*BASE, "algorithm.name=boom"]
    fedhp_error = plan_runs(base, points_of({}), [0], tmp_path / "a", plugins=[str(plugin)])
    bug = plan_runs(
        [*base, "algorithm.error=bug"], points_of({}), [0], tmp_path / "b", plugins=[str(plugin)]
    )
    # A Ray this process already runs is used and left running.
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)

    with pytest.raises(DatasetError) as caught:
        run_batches_ray([fedhp_error], num_cpus=1)
    assert str(caught.value) == "boom: client data vanished on the worker; check the data"
    assert "\n" not in str(caught.value)

    with pytest.raises(RuntimeError) as crashed:
        run_batches_ray([bug])
    first, _, rest = str(crashed.value).partition("\n")
    assert first.startswith("--backend ray: batch 1/1 (")
    assert first.endswith("failed in its Ray worker: ValueError: boom: a bug")
    assert "Traceback" in rest and "boom.py" in rest  # the worker's traceback comes along

    died = plan_runs(
        [*base, "algorithm.error=exit"], points_of({}), [0], tmp_path / "c", plugins=[str(plugin)]
    )
    with pytest.raises(FedhpError) as lost:
        run_batches_ray([died])
    assert str(lost.value).startswith("--backend ray: batch 1/1 (")
    assert "failed in Ray (" in str(lost.value) and "\n" not in str(lost.value)
    assert ray.is_initialized()  # the Ray this process had started is still connected
    ray.shutdown()  # here, so Ray's own note on the dead worker lands in this test's capture
