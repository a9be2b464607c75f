"""``Update`` rows: a client's uploaded model is the row ``"model"``; the old key ``"params"``
still reads and writes it, said in one warning line per process."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedhp.algorithms import task as task_module
from fedhp.algorithms.task import Update, UpdateRows
from fedhp.errors import FedhpWarning


@pytest.fixture(autouse=True)
def _fresh_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_module, "_NOTED_OLD_KEYS", set())


def test_old_key_reads_and_writes_the_model_row_and_warns_once() -> None:
    x, y = torch.ones(2, 3), torch.zeros(2, 3)
    with pytest.warns(FedhpWarning) as caught:
        update = Update(per_client={"params": x})
        assert list(update.per_client) == ["model"]
        assert update.per_client["params"] is x
        assert "params" in update.per_client
        assert update.per_client.get("params") is x
        update.per_client["params"] = y
        assert update.per_client["model"] is y
        assert update.per_client.pop("params") is y
        assert "model" not in update.per_client
        update.per_edge["params"] = x
        assert update.per_edge["model"] is x
    assert len(caught) == 1
    message = str(caught[0].message)
    assert '"params"' in message and '"model"' in message and "\n" not in message


def test_new_key_and_other_keys_say_nothing() -> None:
    x = torch.ones(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        update = Update(per_client={"model": x, "dc": x})
        assert isinstance(update.per_client, UpdateRows)
        assert isinstance(update.per_edge, UpdateRows)
        assert update.per_client["model"] is x and "model" in update.per_client
        assert update.per_client.get("buffers") is None
        update.per_client.update(mask=x)
        assert sorted(update.per_client) == ["dc", "mask", "model"]
        assert update.per_client.pop("missing", None) is None


def test_rows_keep_their_order_and_values() -> None:
    rows = UpdateRows({"model": torch.ones(1), "dc": torch.zeros(1)})
    assert list(rows.items())[0][0] == "model" and dict(rows).keys() == {"model", "dc"}
