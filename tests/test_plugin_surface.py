"""The plugin surface holds (issue 44): the names a plugin may use are :mod:`fedhp.extend`'s, all
listed in docs/extending.md; a frozen copy of d4acd93's tutorial plugin still runs through
``fedhp run --plugin``; a plugin written against an older surface stops with one line naming the
replacement, never a traceback.

The fixtures in tests/fixtures/plugins/ are frozen: their hashes are checked here, so a change
that breaks them must change the surface (and CHANGELOG.md), not them. The runs go through
``python -m fedhp.cli`` in a subprocess: a process imports a plugin once, and tests/test_plugins.py
registers the tutorial's ``fedavgm`` in this one.
"""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fedhp.extend
from fedhp.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "plugins"
D4ACD93 = FIXTURES / "fedavgm_d4acd93.py"
OLD_SURFACE = FIXTURES / "fedavgm_old_surface.py"
FROZEN = {
    D4ACD93: "980e402b544b841902519595692c23048c3c6866b286517df831c142538dd0b8",
    OLD_SURFACE: "a52652126ad415a9caaecd1e0e1d24bc9105c54009d68190fe59c3f8498df9a5",
}
RUN = ["progress=false", "threads=1", "model.name=mlr", "rounds=2", "eval_every=1"]


def fedhp_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``fedhp ARGS`` in a fresh process."""
    cmd = [sys.executable, "-m", "fedhp.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def imported_names(code: str) -> dict[str, str]:
    """The fedhp names a plugin's code imports: name -> module."""
    names = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedhp"):
            names.update({alias.name: str(node.module) for alias in node.names})
    return names


def surface_section() -> str:
    text = (ROOT / "docs" / "extending.md").read_text()
    match = re.search(r"\n## 8\. The plugin surface\n(.*?)\n## ", text, re.S)
    assert match is not None, "docs/extending.md lost its section 8, The plugin surface"
    return match.group(1)


@pytest.mark.parametrize("path", sorted(FROZEN), ids=lambda p: p.name)
def test_fixtures_are_frozen(path: Path) -> None:
    """The frozen plugins are never edited (a new surface change gets a new fixture)."""
    assert hashlib.sha256(path.read_bytes()).hexdigest() == FROZEN[path], f"{path} was edited"
    assert path.read_text().startswith("# FROZEN: ")


def test_the_surface_is_listed_in_one_place() -> None:
    """docs/extending.md's table names exactly fedhp.extend's exports, each importable."""
    table = [row for row in surface_section().splitlines() if row.startswith("| `")]
    listed = {name for row in table for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert listed == set(fedhp.extend.__all__)
    for name in fedhp.extend.__all__:
        assert getattr(fedhp.extend, name) is not None
    assert "CHANGELOG.md" in (fedhp.extend.__doc__ or "")


def test_d4acd93_plugin_imports_only_the_surface() -> None:
    """Every name d4acd93's tutorial plugin imports is on the surface (from its old home too)."""
    names = imported_names(D4ACD93.read_text())
    assert set(names) <= set(fedhp.extend.__all__)


def test_current_docs_plugins_import_only_fedhp_extend() -> None:
    """The plugin files of the current docs/extending.md import fedhp's names from the surface."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", text, re.S)
    assert blocks, "docs/extending.md has no plugin file"
    for _, code in blocks:
        names = imported_names(code)
        assert set(names.values()) == {"fedhp.extend"}
        assert set(names) <= set(fedhp.extend.__all__)


def test_d4acd93_plugin_runs(tmp_path: Path) -> None:
    """d4acd93's FedAvgM runs end to end through `fedhp run --plugin`, its ``aggregate`` in
    place of FedAvg's; with momentum 0 and server_lr 1 it is FedAvg (up to float rounding of
    w - (w - mean))."""
    out, ref = tmp_path / "fedavgm", tmp_path / "fedavg"
    plugin = ["--plugin", str(D4ACD93), "algorithm.name=fedavgm", "algorithm.momentum=0"]
    done = fedhp_cli("run", "--out", str(out), *plugin, *RUN)
    assert done.returncode == 0, done.stderr
    done = fedhp_cli("run", "--out", str(ref), "algorithm.name=fedavg", *RUN)
    assert done.returncode == 0, done.stderr
    run, avg = fedhp.load_run(out), fedhp.load_run(ref)
    for name in ("metrics.csv", "summary.json", "config.yaml", "final_state.pt"):
        assert (out / name).is_file(), name
    assert f"- {D4ACD93}" in (out / "config.yaml").read_text()
    assert set(run.state) == {"global", "velocity"}
    assert float(run.state["velocity"].abs().sum()) > 0  # its own aggregate ran
    assert len(run.metrics) == len(avg.metrics) and run.metrics[-1]["round"] == 2
    for a, b in zip(run.metrics, avg.metrics, strict=True):
        assert a["global_acc"] == pytest.approx(b["global_acc"], abs=1e-4)
        assert a["global_loss"] == pytest.approx(b["global_loss"], rel=1e-5)
        assert a["cum_bytes_total"] == b["cum_bytes_total"]


def test_old_surface_plugin_stops_with_one_line(tmp_path: Path) -> None:
    """A FedAvgM calling the old ``ctx.local_sgd(params, clients, steps, batch, lr, extra)``
    stops with one line naming the new call (LocalWork), no traceback, exit code 2."""
    out = tmp_path / "old"
    done = fedhp_cli(
        "run", "--out", str(out), "--plugin", str(OLD_SURFACE), "algorithm.name=fedavgm_old", *RUN
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "local_sgd" in lines[0] and "LocalWork(" in lines[0]


OLD_NAMES = {
    "moved": (
        "from fedhp.algorithms.base import DenseDeviceCost\n",
        "line 1: DenseDeviceCost is the old surface: import it from fedhp.algorithms.device_cost",
    ),
    "surface_name_from_old_home": (
        "from fedhp.algorithms.base import ExtraGrad\n",
        "line 1: ExtraGrad is the old surface: import it from fedhp.extend",
    ),
    "moved_module": (
        "from fedhp.algorithms.flat import FlatRounds\n",
        "line 1: fedhp.algorithms.flat is the old surface: FlatRounds is part of FedAvg",
    ),
    "renamed_rules_module": (
        "from fedhp.engine.robust import coordinate_median\n",
        "line 1: fedhp.engine.robust is the old surface: the robust rules are in "
        "fedhp.engine.robust_rules",
    ),
    "capability_flag": (
        "from fedhp.extend import ALGORITHMS, AlgorithmOptions\n\n\n"
        "@ALGORITHMS.register('oldflags')\n"
        "class OldFlags(AlgorithmOptions):\n"
        "    attack_ready = True\n",
        "line 5: attack_ready is the old surface: declare uploads = ",
    ),
}


WITHDRAWN_USES = {
    "local_update": (
        "class Old:\n    def train(self, state, task):\n"
        "        return self.local_update(task.broadcast['global'], task.clients)\n",
        "line 3: self.local_update is the old surface: call self.ctx.local_sgd(",
    ),
    "cloud_mean": (
        "def mean(ctx, rows, weights, start):\n    return ctx.cloud_mean(rows, weights, start)\n",
        "line 2: ctx.cloud_mean is the old surface: call ctx.cloud_uplink.aggregate(",
    ),
    "sample_clients": (
        "class Old:\n    def plan(self, state, rnd):\n        return self.ctx.sample_clients()\n",
        "line 3: ctx.sample_clients is the old surface: call ctx.participation.sample_clients()",
    ),
    "stacked_train": (
        "from fedhp.extend import FedAvg\n\n\nclass Mine(FedAvg):\n"
        "    def stack_key(self, state, task):\n        return None\n",
        "line 5: stack_key is the old surface: write the round over a list of (algorithm, "
        "state, task) and call it from train through self.ctx.together(",
    ),
}
OLD_NAMES.update(WITHDRAWN_USES)


@pytest.mark.parametrize("kind", sorted(OLD_NAMES))
def test_old_names_are_one_line_naming_the_replacement(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin importing a name that moved, setting an options flag that was withdrawn, or
    using a withdrawn member of the run context or the algorithm stops at its import with one
    line naming the replacement."""
    code, message = OLD_NAMES[kind]
    path = tmp_path / f"{kind}.py"
    path.write_text(code)
    assert main(["list", "--plugin", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"plugin {path}: {message}" in err and "(CHANGELOG.md)" in err


def test_every_superseded_name_has_a_replacement_that_imports() -> None:
    """Each row of the loader's table of old names points at a home that has the name."""
    import importlib

    from fedhp.plugins import SUPERSEDED

    for old, new in SUPERSEDED.items():
        home = re.fullmatch(r"import it from ([\w.]+)", new)
        if home is not None:
            name = old.rpartition(".")[2]
            assert hasattr(importlib.import_module(home.group(1)), name), old
            assert not hasattr(importlib.import_module(old.rpartition(".")[0]), name), old


def test_moved_modules_are_gone_and_their_new_homes_import() -> None:
    """Each module of the loader's table of moved modules is really gone, and the module its
    line names imports."""
    import importlib
    import importlib.util

    from fedhp.plugins import MOVED_MODULES

    for old, new in MOVED_MODULES.items():
        assert importlib.util.find_spec(old) is None, old
        homes = re.findall(r"fedhp(?:\.\w+)+", new)
        assert homes, new
        for home in homes:
            importlib.import_module(home)


def test_withdrawn_members_are_gone_and_their_replacements_exist() -> None:
    """The loader's withdrawn members are really gone (a plugin of today is not refused), and
    the participation and buffer calls that replace them exist."""
    from fedhp.algorithms.buffers import BufferPolicy
    from fedhp.engine.participation import Participation
    from fedhp.extend import Algorithm, FedAvg, RunContext
    from fedhp.plugins import WITHDRAWN, withdrawn_use

    homes = {"ctx.participation": Participation, "self.buffers": BufferPolicy}
    for member, new in WITHDRAWN.items():
        owner, _, name = member.partition(".")
        classes = (RunContext,) if owner == "ctx" else (Algorithm, FedAvg)
        assert not any(hasattr(cls, name) for cls in classes), member
        call = re.match(r"call (ctx\.participation|self\.buffers)\.(\w+)\(", new)
        if call is not None:
            assert hasattr(homes[call.group(1)], call.group(2)), new
    for path in (D4ACD93, ROOT / "src" / "fedhp" / "algorithms" / "fedavg.py"):
        assert withdrawn_use(path.read_text()) is None, path
