"""One round of each method of issue 32 on the character LSTM, through the normal run path, on
a tiny fabricated text dataset (uint8 character indices, natural clients)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch

from fedhp.api import run
from fedhp.data.sources import DATASETS, DatasetSource
from fedhp.data.types import DatasetArrays
from fedhp.models import lstm
from fedhp.models.lstm import LSTMOptions

CLIENTS, SEQ, VOCAB = 4, 10, 81


def tiny_text(clients: int = CLIENTS, seq_len: int = SEQ, seed: int = 0) -> DatasetArrays:
    """Each client a random "text" of 40–70 characters over a few letters of its own; samples:
    every window of ``seq_len`` indices (uint8) → the next index; first 80% train, rest test."""
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[torch.Tensor]] = {
        k: [] for k in ("trx", "try", "tex", "tey", "tro", "teo")
    }
    for c in range(clients):
        letters = torch.randint(1, VOCAB, (6,), generator=gen)
        length = int(torch.randint(40, 70, (1,), generator=gen))
        text = letters[torch.randint(0, 6, (length,), generator=gen)]
        windows = text.unfold(0, seq_len + 1, 1)
        cut = int(0.8 * len(windows))
        for split, rows in (("tr", windows[:cut]), ("te", windows[cut:])):
            parts[split + "x"].append(rows[:, :seq_len].to(torch.uint8))
            parts[split + "y"].append(rows[:, seq_len].long())
            parts[split + "o"].append(torch.full((len(rows),), c, dtype=torch.long))
    cat = {k: torch.cat(v) for k, v in parts.items()}
    return DatasetArrays(
        "tinytext", cat["trx"], cat["try"], cat["tex"], cat["tey"], VOCAB, cat["tro"], cat["teo"]
    )


class TinyText(DatasetSource):
    """The fabricated text of :func:`tiny_text` as a registered dataset."""

    def load(self) -> DatasetArrays:
        return tiny_text()


@contextlib.contextmanager
def tinytext_registered() -> Iterator[None]:
    """``tinytext`` in the dataset registry while inside (other tests list the registry)."""
    DATASETS.register("tinytext")(TinyText)
    try:
        yield
    finally:
        DATASETS.forget_module(__name__)


@pytest.fixture(autouse=True, scope="module")
def _tinytext() -> Iterator[None]:
    with tinytext_registered():
        yield


BASE = {
    "rounds": 1,
    "progress": False,
    "eval_every": 1,
    "checkpoint_every": 0,
    "dataset": {"name": "tinytext"},
    "partition": {"name": "natural"},
    "federation": {"num_clients": CLIENTS, "num_edges": 1},
    "model": {"name": "lstm", "hidden": 8},
}
METHODS: dict[str, dict[str, object]] = {
    "fedavg": {"local_steps": 3},
    "fedprox": {"local_steps": 3, "mu": 0.1},
    "scaffold": {"local_steps": 3},
    "pfedme": {"R": 2, "K": 2},
    "sfedhp": {"R": 2, "K": 2},
    "ditto": {"local_steps": 3},
    "fedper": {"local_steps": 3},
    "fedlps": {"local_steps": 3, "ratio": "fixed", "rounds": 1},
    # the other unit-mask methods, through the same hidden-unit groups
    "heterofl": {"local_steps": 3},
    "lotteryfl": {"local_steps": 3},
}


CASES = (
    [(m, None, "bmm") for m in METHODS]
    + [(m, 0.05, "bmm") for m in ("fedavg", "pfedme", "fedlps")]
    + [(m, None, "fused") for m in METHODS]
)


@pytest.mark.parametrize(("method", "clip", "path"), CASES)
def test_one_round_on_the_lstm(
    method: str, clip: float | None, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finite losses after the round and a trained model that moved (with and without
    ``clip_grad_norm`` for the three kinds of local step: FedAvg's, pFedMe's, FedLPS's), with
    the recurrence batched over clients (``bmm``) and per client through PyTorch's fused LSTM
    kernel (``fused``, the CPU form from ``FUSED_MIN_HIDDEN`` hidden units on)."""
    monkeypatch.setattr("fedhp.engine.runner.plot_run", lambda *args, **kwargs: None)  # speed
    monkeypatch.setattr(lstm, "FUSED_MIN_HIDDEN", 1 if path == "fused" else 10**9)
    algorithm = {"name": method, "batch_size": 4, "lr": 0.5, **METHODS[method]}
    if clip is not None:
        algorithm["clip_grad_norm"] = clip
    result = run({**BASE, "algorithm": algorithm}, save=False)
    last = result.metrics[-1]
    finite = [v for k, v in last.items() if isinstance(v, float) and "loss" in k]
    assert finite and all(math.isfinite(v) for v in finite), last
    model = LSTMOptions(hidden=8).build((SEQ,), VOCAB)
    init = model.init_params(0)
    moved = [
        float((t.float() - init).abs().max())
        for t in result.state.values()
        if t.dtype == torch.float32 and t.shape[-1] == model.num_params
    ]
    assert moved and max(moved) > 1e-3, f"{method}: no model moved"
