"""Every bad input ends with exit code 2 and one line naming the field and the fix.

A table of bad inputs, each run through the command line in-process (``fedhp.cli.main``), most
with ``--check`` (validate, load and partition the data, stop before training). Beside it: the
inputs where running is right (a one-line warning), the divergence exit code, and ``--help`` of
every command.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fedhp.cli import build_parser, main
from fedhp.experiments import REPRODUCTIONS

FAST = ["progress=false", "model.name=mlr", "algorithm.name=fedavg", "algorithm.local_steps=1"]
Setup = Callable[[Path], list[str]]


def _file(name: str, text: str) -> Setup:
    """A setup writing ``text`` to ``name`` in the test's folder; returns ``[path]``."""

    def make(tmp: Path) -> list[str]:
        path = tmp / name
        path.write_text(text)
        return [str(path)]

    return make


def _run_folder(tmp: Path) -> list[str]:
    """A folder that looks like a fedhp run (a config.yaml in it)."""
    (tmp / "old").mkdir()
    (tmp / "old" / "config.yaml").write_text("rounds: 1\n")
    return [str(tmp / "old")]


def _non_run_folder(tmp: Path) -> list[str]:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("my notes\n")
    return [str(tmp / "mine")]


def _broken_metrics(tmp: Path) -> list[str]:
    folder = tmp / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text("seed: 0\nalgorithm: {name: fedavg}\n")
    (folder / "metrics.csv").write_text("\x00\x01 garbage, no header\n")
    return [str(folder)]


def _none(tmp: Path) -> list[str]:
    return []


# (id, setup, argv given the setup's paths, words the one-line error must contain)
CASES: list[tuple[str, Setup, Callable[[list[str]], list[str]], tuple[str, ...]]] = [
    # --- the list ---
    (
        "more-clients-than-samples",
        _none,
        # the num_clients=5000 on Setting 1, scaled down (3 s -> 0.2 s): 300 clients,
        # 200 training samples
        lambda p: [
            "run",
            "--check",
            *FAST,
            "federation.num_clients=300",
            "partition.train_per_class=20",
        ],
        ("federation.num_clients", "no training samples", "fewer clients"),
    ),
    (
        "out-is-a-file",
        _file("afile", "x"),
        lambda p: ["run", *FAST, "rounds=1", "--out", p[0]],
        ("--out", "is a file"),
    ),
    (
        "out-below-a-file",
        _file("afile", "x"),
        lambda p: ["run", *FAST, "rounds=1", "--out", f"{p[0]}/sub"],
        ("--out", "cannot be written"),
    ),
    (
        "out-holds-a-run",
        _run_folder,
        lambda p: ["run", *FAST, "rounds=1", "--out", p[0]],
        ("--out", "holds a fedhp run", "--overwrite", "--resume"),
    ),
    (
        "out-is-not-a-run",
        _non_run_folder,
        lambda p: ["run", *FAST, "rounds=1", "--out", p[0]],
        ("--out", "holds no fedhp run"),
    ),
    (
        "check-out-holds-a-run",
        _run_folder,
        lambda p: ["run", "--check", *FAST, "--out", p[0]],
        ("--out", "--overwrite"),
    ),
    (
        "methods-unknown",
        _none,
        lambda p: ["reproduce", "sfedhp-table1", "--methods", "foo,bar"],
        ("--methods", "'foo', 'bar'", "fedavg", "sfedhp"),
    ),
    (
        "methods-empty",
        _none,
        lambda p: ["reproduce", "sfedhp-table1", "--methods", ","],
        ("--methods", "choose from"),
    ),
    (
        "compare-broken-metrics",
        _broken_metrics,
        lambda p: ["compare", p[0], "--out", f"{Path(p[0]).parent}/fig.png"],
        ("metrics.csv", "no rows with a round number", "nothing to compare"),
    ),
    ("compare-no-runs", _none, lambda p: ["compare", "--out", "fig.png"], ("RUN_DIR",)),
    (
        "compare-not-a-run",
        _non_run_folder,
        lambda p: ["compare", p[0], "--out", f"{p[0]}/fig.png"],
        ("not a fedhp run folder",),
    ),
    (
        "rounds-huge",
        _none,
        lambda p: ["run", "--check", *FAST, "rounds=100000000000000000000"],
        ("rounds", "less than or equal to 10000000"),
    ),
    (
        "rounds-above-limit",
        _none,
        lambda p: ["run", "--check", *FAST, "rounds=10000001"],
        ("rounds", "10000000"),
    ),
    (
        "int-beyond-int64",
        _none,
        lambda p: ["run", "--check", *FAST, "partition.train_per_class=100000000000000000000"],
        ("partition.train_per_class", "out of range"),
    ),
    # --- configuration files ---
    (
        "yaml-invalid",
        _file("c.yaml", "rounds: [1,\n"),
        lambda p: ["run", "--check", p[0]],
        ("invalid YAML",),
    ),
    (
        "yaml-not-a-mapping",
        _file("c.yaml", "- 1\n- 2\n"),
        lambda p: ["run", "--check", p[0]],
        ("must be a mapping",),
    ),
    (
        "yaml-key-twice",
        _file("c.yaml", "rounds: 2\nseed: 1\nrounds: 3\n"),
        lambda p: ["run", "--check", p[0]],
        ("'rounds' appears twice", "lines 1 and 3"),
    ),
    ("yaml-missing", _none, lambda p: ["run", "--check", "nope.yaml"], ("nope.yaml", "not found")),
    ("yaml-is-a-folder", _non_run_folder, lambda p: ["run", "--check", p[0]], ("is a folder",)),
    (
        "yaml-unknown-key",
        _file("c.yaml", "rounds: 2\nroundz: 3\n"),
        lambda p: ["run", "--check", p[0]],
        ("roundz", "unknown key"),
    ),
    # --- keys, types, ranges ---
    ("unknown-key", _none, lambda p: ["run", "--check", "foo=1"], ("foo", "unknown key")),
    (
        "unknown-option",
        _none,
        lambda p: ["run", "--check", *FAST, "algorithm.nope=1"],
        ("algorithm.nope", "unknown key"),
    ),
    ("wrong-type-int", _none, lambda p: ["run", "--check", "rounds=abc"], ("rounds", "integer")),
    (
        "wrong-type-fraction",
        _none,
        lambda p: ["run", "--check", "federation.num_clients=1.5"],
        ("federation.num_clients",),
    ),
    (
        "zero-batch",
        _none,
        lambda p: ["run", "--check", *FAST, "algorithm.batch_size=0"],
        ("algorithm.batch_size", "greater than 0"),
    ),
    ("zero-edges", _none, lambda p: ["run", "--check", "federation.num_edges=0"], ("num_edges",)),
    ("zero-eval-every", _none, lambda p: ["run", "--check", "eval_every=0"], ("eval_every",)),
    (
        "zero-fraction",
        _none,
        lambda p: ["run", "--check", "federation.client_fraction=0"],
        ("client_fraction",),
    ),
    (
        "negative-dirichlet-alpha",
        _none,
        lambda p: ["run", "--check", *FAST, "partition={name: dirichlet, alpha: -1}"],
        ("partition.alpha",),
    ),
    (
        "zero-labels-per-client",
        _none,
        lambda p: ["run", "--check", *FAST, "partition.labels_per_client=0"],
        ("labels_per_client",),
    ),
    (
        "edge-sizes-mismatch",
        _none,
        lambda p: ["run", "--check", *FAST, "federation.edge_sizes=[5,5]"],
        ("edge_sizes",),
    ),
    (
        "attack-fraction-one",
        _none,
        lambda p: ["run", "--check", *FAST, "faults.attack.fraction=1"],
        ("faults.attack.fraction",),
    ),
    (
        "malformed-override",
        _none,
        lambda p: ["run", "--check", "a..b=1"],
        ("key=value",),
    ),
    # --- plugins, data, devices ---
    (
        "plugin-missing",
        _none,
        lambda p: ["run", "--check", "--plugin", "/nonexistent/fedhp_plugin.py"],
        ("fedhp_plugin.py",),
    ),
    (
        "plugin-missing-in-config",
        _none,
        lambda p: ["run", "--check", "plugins=[/nonexistent/fedhp_plugin.py]"],
        ("fedhp_plugin.py",),
    ),
    (
        "dataset-dir-missing",
        _none,
        lambda p: ["run", "--check", *FAST, "dataset.data_dir=/nonexistent/mnist"],
        ("/nonexistent/mnist",),
    ),
    (
        "dataset-unknown",
        _none,
        lambda p: ["run", "--check", "dataset.name=imagenet"],
        ("dataset.name", "mnist"),
    ),
    ("device-tpu", _none, lambda p: ["run", "--check", *FAST, "device=tpu"], ("device",)),
    ("device-cuda-9", _none, lambda p: ["run", "--check", *FAST, "device=cuda:9"], ("device",)),
    ("device-garbage", _none, lambda p: ["run", "--check", *FAST, "device=cpu:x"], ("device",)),
    (
        "subsample-below-clients",
        _none,
        lambda p: ["run", "--check", *FAST, "subsample.train=5"],
        ("num_clients",),
    ),
    (
        "eval-split-val-without-val-data",
        _none,
        lambda p: ["run", "--check", *FAST, "eval_split=val"],
        ("eval_split", "partition.val_per_class"),
    ),
    ("threads-huge", _none, lambda p: ["run", "--check", *FAST, "threads=10**14"], ("threads",)),
    (
        "threads-beyond-c-int",
        _none,
        lambda p: ["run", "--check", *FAST, "threads=100000000000000"],
        ("threads", "4096"),
    ),
    # --- resume ---
    (
        "resume-non-run",
        _non_run_folder,
        lambda p: ["run", "--resume", p[0]],
        ("--resume", "no config.yaml"),
    ),
    (
        "resume-with-out",
        _run_folder,
        lambda p: ["run", "--resume", p[0], "--out", p[0]],
        ("--resume", "--out"),
    ),
    (
        "resume-changes-lr",
        _run_folder,
        lambda p: ["run", "--resume", p[0], "algorithm.lr=0.1"],
        ("algorithm.lr", "cannot change"),
    ),
    # --- arguments ---
    ("unknown-flag", _none, lambda p: ["run", "--bogus"], ("--bogus",)),
    ("no-command", _none, lambda p: [], ("command",)),
    ("reproduce-unknown", _none, lambda p: ["reproduce", "nosuch"], ("nosuch", "sfedhp-table1")),
    (
        "reproduce-zero-seeds",
        _none,
        lambda p: ["reproduce", "sfedhp-table1", "--seeds", "0"],
        ("--seeds", "at least 1"),
    ),
    (
        "reproduce-bad-dataset",
        _none,
        lambda p: ["reproduce", "sfedhp-table1", "--dataset", "imagenet"],
        ("--dataset",),
    ),
    ("compare-bad-x", _none, lambda p: ["compare", ".", "--x", "time", "--out", "f.png"], ("--x",)),
    (
        "list-plugin-missing",
        _none,
        lambda p: ["list", "--plugin", "/nonexistent/fedhp_plugin.py"],
        ("fedhp_plugin.py",),
    ),
]


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert "Traceback" not in err + captured.out, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fedhp: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("setup", "argv", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_exit_2(
    setup: Setup,
    argv: Callable[[list[str]], list[str]],
    words: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    args = argv(setup(tmp_path))
    capsys.readouterr()
    code = main(args)
    line = _one_line_error(capsys)
    assert code == 2, line
    for word in words:
        assert word in line, (word, line)


def test_the_table_has_forty_inputs() -> None:
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_unknown_methods_refused_by_every_reproduction(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything runs: the output folder is not even created."""
    monkeypatch.chdir(tmp_path)
    code = main(["reproduce", name, "--methods", "nosuch", "--out", str(tmp_path / "out")])
    line = _one_line_error(capsys)
    assert code == 2 and "--methods" in line
    assert "choose from" in line or "fixed set" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only folders"
)
def test_read_only_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        for check in ([], ["--check"]):
            code = main(["run", *check, *FAST, "rounds=1", "--out", str(locked / "run")])
            line = _one_line_error(capsys)
            assert code == 2 and "--out" in line and "cannot be written" in line
    finally:
        locked.chmod(0o755)


@pytest.mark.skipif(importlib.util.find_spec("flwr") is None, reason="Flower is not installed")
def test_flower_certs_onto_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "afile"
    target.write_text("x")
    assert main(["flower", "certs", str(target)]) == 2
    assert "is a file" in _one_line_error(capsys)
    assert main(["flower", "keys", str(target), "--nodes", "0"]) == 2
    assert "--nodes" in _one_line_error(capsys)


def test_help_of_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Every command's --help prints (a stray % in a help text breaks argparse) without rST."""

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        text = parser.format_help()
        assert "``" not in text, path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])

    walk(build_parser(), [])
    for argv in (["reproduce", "--help"], ["reproduce", "-h"], ["--help"], ["run", "--help"]):
        assert main(argv) == 0
        assert "usage: fedhp" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"fedhp {metadata.version('fedhp')}"


def test_batch_larger_than_a_client_is_one_warning_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Running is right (the engine repeats a small client's samples to fill the batch): exit 0,
    one warning line saying so and how to avoid it."""
    assert main(["run", "--check", *FAST, "algorithm.batch_size=5000"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedhp: warning: algorithm.batch_size=5000")
    assert "20 of 20 clients (smallest: 100)" in lines[0] and "batch_size=100 or less" in lines[0]
    assert captured.out.startswith("ok:")
    assert main(["run", "--check", *FAST]) == 0
    assert capsys.readouterr().err == ""  # batch 20 ≤ 100 samples: no warning


def test_key_given_twice_is_one_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A key given twice on the command line: the later value is used (scripts add to a base
    list of options), and a warning line names both."""
    assert main(["run", "--check", *FAST, "rounds=2", "federation.num_clients=10"]) == 0
    assert capsys.readouterr().err == ""
    argv = ["run", "--check", *FAST, "federation.num_clients=10", "federation.num_clients=5"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "fedhp: warning: federation.num_clients given twice (federation.num_clients=10, then "
        "federation.num_clients=5); the later one is used\n"
    )
    assert ", 5 clients," in captured.out
    assert main(["run", "--check", *FAST, "algorithm={name: fedprox}"]) == 0  # a section
    captured = capsys.readouterr()
    assert "algorithm.name given twice" in captured.err and "fedprox" in captured.out


def test_huge_learning_rate_exits_3_diverged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Valid input whose training blows up: exit 3 (not 2), one line naming the cause."""
    out = tmp_path / "run"
    code = main(["run", *FAST, "rounds=2", "algorithm.lr=1e30", "--out", str(out)])
    line = _one_line_error(capsys)
    assert code == 3 and "diverged" in line and "algorithm.lr" in line
    assert (out / "summary.json").is_file()


def test_python_api_errors(tmp_path: Path) -> None:
    """fedhp.run: the same one-line errors as the command line, as exceptions."""
    import fedhp
    from fedhp.errors import ConfigError, DatasetError

    small = {"progress": False, "rounds": 1, "model__name": "mlr", "algorithm__name": "fedavg"}
    with pytest.raises(DatasetError, match="federation.num_clients: 260 of 300 clients"):
        fedhp.run(save=False, federation__num_clients=300, partition__train_per_class=20, **small)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text("rounds: 1\n")
    with pytest.raises(ConfigError, match="out .*holds a fedhp run already"):
        fedhp.run(out=tmp_path / "old", **small)
