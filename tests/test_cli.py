"""The command line: one-line errors for bad input, listing, and a real run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedhp.cli import main

BAD = [
    (["algorithm.name=nosuch"], "algorithm.name"),
    (["algorithm.lr=-0.1"], "algorithm.lr"),
    (["partition.labels_per_client=11"], "labels_per_client"),
    (["rounds=0"], "rounds"),
    (["federation.edges_per_round=9"], "edges_per_round"),
    (["model.name=resnet999"], "model.name"),
    (["dataset.name=imagenet"], "dataset.name"),
    (["no_such_key=1"], "no_such_key"),
    (["algorithm.lr=fast"], "algorithm.lr"),
    (["oops"], "config file oops"),
]


@pytest.mark.parametrize(("args", "field"), BAD, ids=[b[1] for b in BAD])
def test_bad_config_is_one_line_error(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        ["run", *args, "rounds=1" if "rounds" not in field else "seed=0", "--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert field in lines[0] and "Traceback" not in err


def test_bad_config_in_subprocess_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fedhp.cli", "run", "algorithm.lr=-1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "algorithm.lr" in proc.stderr


def test_list_shows_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in (
        "fedavg",
        "fedprox",
        "hierfavg",
        "mnist",
        "fmnist",
        "cifar10",
        "dnn",
        "vgg",
        "labels",
        "dirichlet",
    ):
        assert word in out
    assert out.count("theta_init (round|warm|reset): where theta starts") == 2  # pFedMe, sFedHP


def test_yaml_config_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("rounds: 2\nmodel: {name: mlr}\nalgorithm: {name: fedprox, mu: 0.1}\n")
    out = tmp_path / "out"
    assert (
        main(["run", str(cfg), "algorithm.local_steps=2", "progress=false", "--out", str(out)]) == 0
    )
    resolved = (out / "config.yaml").read_text()
    assert "fedprox" in resolved and "mu: 0.1" in resolved and "local_steps: 2" in resolved
    assert "results:" in capsys.readouterr().out


def test_override_order_does_not_drop_options() -> None:
    from fedhp.config import resolve_config

    a = resolve_config(None, ["algorithm.lr=0.2", "algorithm.name=fedavg"])
    b = resolve_config(None, ["algorithm.name=fedavg", "algorithm.lr=0.2"])
    assert a == b and a.algorithm == {"name": "fedavg", "lr": 0.2}
    default = resolve_config(None, [])
    assert default.algorithm["name"] == "sfedhp" and "lam" in default.algorithm


RUN = [
    "progress=false",
    "threads=1",
    "rounds=2",
    "eval_every=1",
    "checkpoint_every=0",
    "algorithm.name=fedavg",
    "algorithm.local_steps=2",
    "model.name=mlr",
    "partition.train_per_class=40",
    "partition.test_per_class=40",
]


def test_config_yaml_is_complete_and_reruns_byte_identical(tmp_path: Path) -> None:
    """config.yaml holds every option of the algorithm, model, dataset and partition the run
    reads (not only those given; none it does not read, issue 42), and ``fedhp run
    <run>/config.yaml`` gives the same metrics.csv, byte for byte, and the same config.yaml."""
    import yaml

    from fedhp.algorithms import ALGORITHMS
    from fedhp.config import resolve_config
    from fedhp.data import PARTITIONERS
    from fedhp.unread import unread_options

    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["run", *RUN, "--out", str(first)]) == 0
    config = yaml.safe_load((first / "config.yaml").read_text())
    unread = unread_options(resolve_config(None, RUN))
    assert "partition.val_stratified" in unread  # (read only with a val_fraction)
    for section, registry in (("algorithm", ALGORITHMS), ("partition", PARTITIONERS)):
        fields = registry.get(config[section]["name"]).model_fields
        read = {f for f in fields if f"{section}.{f}" not in unread}
        assert set(config[section]) == {"name", *read}, section
    assert config["algorithm"]["lr"] == 0.05 and config["algorithm"]["batch_size"] == 20
    assert config["dataset"] == {"name": "mnist", "data_dir": None, "normalize": "global"}
    assert main(["run", str(first / "config.yaml"), "--out", str(second)]) == 0
    for name in ("metrics.csv", "per_client.csv", "config.yaml"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_resolved_sections_round_trip() -> None:
    """Every registered component's options, written out in full, validate back to the same
    options; a default that holds only while unset (local_steps beside local_epochs) stays out,
    and FNR-FL hands its base method the same options."""
    from fedhp.algorithms import ALGORITHMS
    from fedhp.config import COMPONENT_SECTIONS, resolved_section
    from fedhp.unread import component_registry as _registry

    for section in COMPONENT_SECTIONS:
        registry = _registry(section)
        for name in registry.names():
            cls = registry.get(name)
            if any(f.is_required() for f in cls.model_fields.values()):
                continue  # libsvm's path
            full = resolved_section(section, {"name": name})
            assert set(full) == {"name", *cls.model_fields}, (section, name)
            assert resolved_section(section, full) == full
    epochs = resolved_section("algorithm", {"name": "fedavg", "local_epochs": 2})
    assert "local_steps" not in epochs and epochs["lr"] == 0.05
    given = {"name": "fnrfl", "local_epochs": 2}
    full = resolved_section("algorithm", given)
    base = [ALGORITHMS.build(c, "a").base_config() for c in (given, full)]  # type: ignore[attr-defined]
    assert ALGORITHMS.build(base[0], "b") == ALGORITHMS.build(base[1], "b")


def test_out_holding_a_run_needs_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    fast = [a for a in RUN if a != "rounds=2"] + ["rounds=1"]
    assert main(["run", *fast, "--out", str(out)]) == 0
    before = (out / "metrics.csv").read_bytes()
    capsys.readouterr()
    assert main(["run", *fast, "seed=1", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "metrics.csv").read_bytes() == before  # untouched
    assert main(["run", *fast, "seed=1", "--out", str(out), "--overwrite"]) == 0
    assert "seed: 1" in (out / "config.yaml").read_text()
    assert main(["run", "--resume", str(out), "--overwrite"]) == 2


def test_resume_of_a_run_written_before_full_configs(tmp_path: Path) -> None:
    """A run folder from before config.yaml held every option (its config.yaml and its
    checkpoint's configuration list only the options given) still resumes, to the same numbers
    as an uninterrupted run."""
    import torch
    import yaml

    from fedhp.config import resolve_config

    args = [a for a in RUN if a not in ("rounds=2", "checkpoint_every=0")]
    whole, old = tmp_path / "whole", tmp_path / "old"
    assert main(["run", *args, "rounds=3", "--out", str(whole)]) == 0
    assert main(["run", *args, "rounds=2", "checkpoint_every=1", "--out", str(old)]) == 0
    given = resolve_config(None, [*args, "rounds=2", "checkpoint_every=1"]).model_dump(mode="json")
    assert "lr" not in given["algorithm"]  # the old form
    (old / "config.yaml").write_text(yaml.safe_dump(given, sort_keys=False))
    checkpoint = torch.load(old / "checkpoint.pt", weights_only=True)
    checkpoint["config"] = given
    del checkpoint["digest"]  # as written then: version 1, no digest
    checkpoint["version"] = 1
    torch.save(checkpoint, old / "checkpoint.pt")
    assert main(["run", "--resume", str(old), "rounds=3"]) == 0
    assert (old / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()


def test_list_has_no_placeholders_or_cut_sentences(capsys: pytest.CaptureFixture[str]) -> None:
    """No internal placeholders (PydanticUndefined), no empty size line, no rST markup, and
    every component's summary ends a sentence."""
    from fedhp.algorithms import ALGORITHMS
    from fedhp.cli import summary_of
    from fedhp.data import DATASETS, PARTITIONERS
    from fedhp.models import MODELS

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "PydanticUndefined" not in out and "``" not in out and ":class:" not in out
    assert all(line.strip() != "size:" for line in out.splitlines())
    assert "path (required)" in out and "capability_levels=[1.0, 0.5" in out
    for registry in (ALGORITHMS, DATASETS, MODELS, PARTITIONERS):
        for name in registry.names():
            summary = summary_of(registry.get(name).__doc__)
            assert summary.endswith((".", ".)")), (name, summary)
            assert " ".join(summary.split()[:4]) in " ".join(out.split()), name


def test_reproduce_help_names_every_quick(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: no word broken at a hyphen
    assert main(["reproduce", "--help"]) == 0
    (quick,) = [line for line in capsys.readouterr().out.splitlines() if "--quick" in line][-1:]
    for name in ("fnrfl-table2", "fedlps-*", "robust", "dp", "leaf-shakespeare"):
        assert f"{name}: " in quick, name
