"""The on-disk cache of a Flower node's data: a second process (here: a cleared in-process
cache) reads the node's clients from the file instead of loading and partitioning the dataset,
and gets the same tensors; the key follows what the partition depends on; a broken file is
rebuilt; ``flower.node_cache=false`` writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.config import RunConfig, resolve_config
from fedhp.data.sources import ENV_CACHE_DIR, cache_dir
from fedhp.data.types import ClientData
from fedhp.flower import node as node_module
from fedhp.flower.node import build_node
from fedhp.flower.node_cache import cache_key, cached_node_data


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path))
    node_module._PARTITIONS.clear()
    return cache_dir("nodes")


def _partition_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = node_module._partition

    def counting(cfg: RunConfig) -> tuple[list[ClientData], int]:
        calls.append(1)
        return real(cfg)

    monkeypatch.setattr(node_module, "_partition", counting)
    return calls


def test_second_build_reads_the_node_data_from_the_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _partition_calls(monkeypatch)
    cfg = resolve_config(None, ["algorithm.name=sfedhp"])
    first = build_node(cfg, 1)
    assert calls == [1] and len(list(cache.glob("*.pt"))) == 1
    node_module._PARTITIONS.clear()  # as in a fresh ClientApp process
    second = build_node(cfg, 1)
    assert calls == [1]  # not partitioned again
    a, b = first.ctx.fed, second.ctx.fed
    for split in ("train", "test"):
        assert torch.equal(getattr(a, split).x, getattr(b, split).x)
        assert torch.equal(getattr(a, split).y, getattr(b, split).y)
        assert torch.equal(getattr(a, split).counts, getattr(b, split).counts)
    assert first.ctx.sampler.max_count == second.ctx.sampler.max_count
    build_node(cfg, 2)  # another node: its own file
    assert len(list(cache.glob("*.pt"))) == 2


def test_key_follows_the_partition_inputs(cache: Path) -> None:
    base = {"dataset": {"name": "mnist"}, "seed": 0, "clients": [0, 1]}
    assert cache_key(base) == cache_key(dict(base))
    assert cache_key(base) != cache_key({**base, "seed": 1})
    assert cache_key(base) != cache_key({**base, "clients": [0, 2]})


def test_broken_file_is_rebuilt_and_disabled_cache_writes_nothing(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _partition_calls(monkeypatch)
    cfg = resolve_config(None, ["algorithm.name=sfedhp"])
    build_node(cfg, 0)
    (path,) = cache.glob("*.pt")
    path.write_bytes(b"not a torch file")
    node_module._PARTITIONS.clear()
    build_node(cfg, 0)
    assert len(calls) == 2 and path.stat().st_size > 1000  # rebuilt and rewritten
    path.unlink()
    off = resolve_config(
        None, ["algorithm.name=sfedhp", "backend=flower-sim", "flower.node_cache=false"]
    )
    build_node(off, 0)
    assert not list(cache.glob("*.pt"))


def test_unwritable_cache_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv(ENV_CACHE_DIR, str(blocker))
    data = cached_node_data({"x": 1}, lambda: ([], 10, 5, 1), enabled=True)
    assert data == ([], 10, 5, 1)
