"""An on-disk cache of each Flower node's partition of the data.

In a deployment Flower starts a fresh ClientApp process for every message, so without a cache
each message would load the whole dataset and partition it again (≈1.6 s for MNIST here) only to
keep the node's few clients. The first message stores the node's clients' tensors in one file;
later messages memory-map it.

Location: ``$FEDHP_CACHE_DIR/nodes`` (default ``~/.cache/fedhp/nodes``); ``flower.node_cache:
false`` turns it off. The file name is a digest of everything the partition depends on: the
dataset, subsample and partition options, number of clients, seed, the node's client ids,
``$FEDHP_DATA_DIR``, fedhp's version and the source of its data modules. Replacing dataset files
in place under the same path is not detected: delete the folder then.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedhp.data import partition, sources, subsample
from fedhp.data.sources import ENV_DATA_DIR, cache_dir
from fedhp.data.types import ClientData
from fedhp.version import __version__

FORMAT = 1
_FIELDS = ("train_x", "train_y", "test_x", "test_y", "val_x", "val_y")

NodeData = tuple[list[ClientData], int, int, int]
"""The node's clients, the number of classes, and the largest/smallest training set of all
clients (the minibatch sampler needs both)."""


def cache_key(spec: dict[str, Any]) -> str:
    """A digest of ``spec`` (JSON-able), the data environment and the data code."""
    code = hashlib.sha256()
    for module in (partition, sources, subsample):
        code.update(Path(str(module.__file__)).read_bytes())
    full = {
        "spec": spec,
        "format": FORMAT,
        "fedhp": __version__,
        "code": code.hexdigest(),
        "data_dir": os.environ.get(ENV_DATA_DIR, ""),
    }
    return hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:32]


def _save(path: Path, data: NodeData) -> None:
    clients, num_classes, max_count, min_count = data
    blob: dict[str, torch.Tensor] = {
        "meta": torch.tensor([len(clients), num_classes, max_count, min_count]),
    }
    for i, client in enumerate(clients):
        for name in _FIELDS:
            blob[f"{i}.{name}"] = getattr(client, name).contiguous()
        blob[f"{i}.train_noise_std"] = torch.tensor(client.train_noise_std)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)  # atomic: concurrent nodes never read a half-written file


def _load(path: Path) -> NodeData | None:
    try:
        blob = torch.load(path, weights_only=True, mmap=True)
        n, num_classes, max_count, min_count = (int(v) for v in blob["meta"])
        clients = [
            ClientData(
                **{f: blob[f"{i}.{f}"] for f in _FIELDS},
                train_noise_std=float(blob[f"{i}.train_noise_std"]),
            )
            for i in range(n)
        ]
    except Exception:  # noqa: BLE001  (unreadable or foreign file: rebuild it)
        return None
    return clients, num_classes, max_count, min_count


def cached_node_data(
    spec: dict[str, Any], build: Callable[[], NodeData], enabled: bool
) -> NodeData:
    """The node's data from the cache, else ``build()`` (stored for next time when ``enabled``).
    A cache that cannot be written (read-only home, full disk) is skipped silently."""
    if not enabled:
        return build()
    path = cache_dir("nodes") / f"{cache_key(spec)}.pt"
    if path.is_file() and (found := _load(path)) is not None:
        return found
    data = build()
    with contextlib.suppress(OSError):
        _save(path, data)
    return data
