"""Configuration of the Flower backend: strict one-line errors, node counts, shards, the
ServerApp's run config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from fedhp.cli import main
from fedhp.config import default_config_dict, resolve_config
from fedhp.engine.sampler import BatchSampler
from fedhp.errors import FedhpError
from fedhp.flower.server_app import config_from_run_config
from fedhp.flower.shards import make_shards, node_count
from fedhp.topology import Topology


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["backend=ray"], "backend"),
        (["backend=flower-sim", "flower.nodes=0"], "flower.nodes"),
        (["backend=flower-sim", "flower.nodes=5", "algorithm.name=hierfavg"], "flower.nodes"),
        (["backend=flower-sim", "flower.nodes=21", "algorithm.name=fedavg"], "flower.nodes"),
        (["backend=flower-sim", "flower.timeout=-1"], "flower.timeout"),
        (["backend=flower-sim", "flower.bogus=1"], "flower.bogus"),
        (["backend=flower-sim", "algorithm.name=centralized"], "backend"),
        (["backend=flower-sim", "algorithm.name=pfedgp"], "backend"),
        (["backend=flower-sim", "device=cuda"], "device"),
    ],
)
def test_bad_flower_config_is_one_line_exit_2(
    overrides: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--check", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and field in err and err.startswith("fedhp: error:")


def test_node_count_defaults_and_shards() -> None:
    cfg = resolve_config(None, ["backend=flower-sim"])
    assert node_count(cfg, hierarchical=True) == 4
    assert node_count(cfg, hierarchical=False) == 4
    topo = Topology.build(20, 4, [2, 8, 5, 5])
    hier = make_shards(topo, 2, hierarchical=True)
    assert [s.edges.tolist() for s in hier] == [[0, 1], [2, 3]]
    assert [len(s.clients) for s in hier] == [10, 10]
    flat = make_shards(topo, 3, hierarchical=False)
    assert [s.clients.tolist()[0] for s in flat] == [0, 7, 14]
    assert torch.equal(torch.cat([s.clients for s in flat]), torch.arange(20))
    assert flat[0].edges.tolist() == [0, 1]


@pytest.mark.parametrize("replacement", [False, True])
def test_node_sampler_draws_the_in_process_rows(replacement: bool) -> None:
    """A node holding clients 5..9 of 20 draws exactly their rows of the in-process draw."""
    counts = torch.randint(3, 40, (20,))
    full = BatchSampler(counts, torch.Generator().manual_seed(1), replacement)
    mine = torch.arange(5, 10)
    node = BatchSampler(
        counts[mine],
        torch.Generator().manual_seed(1),
        replacement,
        rows=mine,
        total=20,
        max_count=int(counts.max()),
        min_count=int(counts.min()),
    )
    for batch in (2, 10, 50):
        expected = full.draw(torch.arange(20), batch)[mine]
        assert torch.equal(node.draw(torch.arange(5), batch), expected)
        assert torch.equal(full.generator.get_state(), node.generator.get_state())


def test_checkpoints_from_before_the_backend_keys_still_resume() -> None:
    """A checkpoint's config without ``backend``/``flower`` matches the defaults, nothing else."""
    from fedhp.config import config_to_dict
    from fedhp.engine.checkpoint import config_difference

    current = config_to_dict(resolve_config(None, []))
    saved = {k: v for k, v in current.items() if k not in ("backend", "flower")}
    assert config_difference(saved, current) is None
    flower = config_to_dict(resolve_config(None, ["backend=flower-sim"]))
    assert config_difference(saved, flower) == "backend"
    sim = {k: v for k, v in flower.items() if k != "flower"}
    nodes = config_to_dict(resolve_config(None, ["backend=flower-sim", "flower.nodes=2"]))
    assert config_difference(sim, nodes) == "flower.nodes"


def test_server_app_run_config() -> None:
    """The deployment's ServerApp reads its configuration, folder and resume flag from Flower's
    run config, with one-line errors."""
    text = yaml.safe_dump(default_config_dict())
    cfg, out, resume = config_from_run_config({"fedhp-config": text, "fedhp-out": "runs/x"})
    assert cfg.algorithm["name"] == "sfedhp" and out == Path("runs/x") and resume is False
    run_config = {"fedhp-config": text, "fedhp-out": "runs/x", "fedhp-resume": True}
    assert config_from_run_config(run_config)[2] is True
    with pytest.raises(FedhpError, match="fedhp-resume.*true or false"):
        config_from_run_config({**run_config, "fedhp-resume": "yes"})
    with pytest.raises(FedhpError, match="required"):
        config_from_run_config({"fedhp-config": text})
