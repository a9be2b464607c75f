"""sFedHP's edge step η1 is ``edge_lr``; its old name ``global_lr`` (before issue 44) is still
read from overrides, YAML files, sweep grids and old run folders, said in one warning line per
process, and gives the same run; both names given is a one-line error."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import fedhp.config as config
from fedhp.build import build_experiment, check_components
from fedhp.cli import main
from fedhp.config import config_to_dict, normalized_config, resolve_config
from fedhp.engine.checkpoint import FINAL_STATE_FILE, config_difference
from fedhp.engine.runner import run_experiment
from fedhp.errors import ConfigError, FedhpWarning

TINY = [
    "progress=false",
    "rounds=2",
    "model.name=mlr",
    "algorithm.name=sfedhp",
    "algorithm.R=2",
    "algorithm.K=1",
    "federation.num_clients=4",
    "federation.num_edges=2",
]


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts in a process that has reported no old name yet."""
    monkeypatch.setattr(config, "_NOTED_OLD_NAMES", set())


def resolve(overrides: list[str], path: Path | None = None) -> tuple[dict, list[str]]:
    """The resolved algorithm section and the fedhp warnings raised on the way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = resolve_config(path, overrides)
    return cfg.algorithm, [str(w.message) for w in caught if w.category is FedhpWarning]


def test_the_old_name_is_read_as_edge_lr_and_said_once(tmp_path: Path) -> None:
    algo, said = resolve([*TINY, "algorithm.global_lr=0.3"])
    assert algo["edge_lr"] == 0.3 and "global_lr" not in algo
    assert len(said) == 1 and "\n" not in said[0]
    assert "algorithm.global_lr" in said[0] and "algorithm.edge_lr" in said[0]
    yaml_file = tmp_path / "old.yaml"
    yaml_file.write_text("algorithm:\n  name: sfedhp\n  global_lr: 0.7\n")
    algo, said = resolve([], yaml_file)  # the YAML's old name, in the same process: no repeat
    assert algo["edge_lr"] == 0.7 and said == []


def test_the_new_name_needs_no_word() -> None:
    algo, said = resolve([*TINY, "algorithm.edge_lr=0.3"])
    assert algo["edge_lr"] == 0.3 and said == []


def test_both_names_are_a_one_line_error() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_config(None, [*TINY, "algorithm.global_lr=0.3", "algorithm.edge_lr=0.3"])
    text = str(err.value)
    assert "\n" not in text and "algorithm.global_lr" in text and "algorithm.edge_lr" in text


def test_another_method_does_not_take_it() -> None:
    with pytest.raises(ConfigError, match="algorithm.global_lr: unknown key"):
        check_components(resolve_config(None, ["algorithm.name=fedavg", "algorithm.global_lr=1"]))


def test_an_old_folder_config_compares_equal() -> None:
    cfg = resolve_config(None, [*TINY, "algorithm.edge_lr=0.3"])
    new = config_to_dict(cfg)
    old = {**new, "algorithm": {**new["algorithm"]}}
    old["algorithm"]["global_lr"] = old["algorithm"].pop("edge_lr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedhpWarning)
        assert normalized_config(old) == normalized_config(new)
        assert config_difference(old, new) is None  # an old checkpoint's config


def test_the_old_name_gives_the_same_run(tmp_path: Path) -> None:
    finals = []
    for name in ("global_lr", "edge_lr"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FedhpWarning)
            cfg = resolve_config(None, [*TINY, f"algorithm.{name}=0.3"])
        out = tmp_path / name
        run_experiment(build_experiment(cfg), out, progress=False)
        finals.append(torch.load(out / FINAL_STATE_FILE, weights_only=True)["state"])
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_resume_of_an_old_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *TINY, "checkpoint_every=1"]) == 0
    saved = out / "config.yaml"
    text = saved.read_text()
    assert "edge_lr:" in text
    saved.write_text(text.replace("edge_lr:", "global_lr:"))  # as written before the rename
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "rounds=3"]) == 0
    err = capsys.readouterr().err
    assert err.count("global_lr") == 1 and "algorithm.edge_lr" in err
