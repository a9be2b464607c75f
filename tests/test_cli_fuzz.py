"""Strict inputs: random and malformed configs never give a traceback, only exit 0 or 2."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedhp.cli import main

KEYS = [
    "seed",
    "rounds",
    "eval_every",
    "checkpoint_every",
    "max_loss",
    "progress",
    "device",
    "dataset.name",
    "dataset.data_dir",
    "partition.name",
    "partition.labels_per_client",
    "partition.train_per_class",
    "partition.test_per_class",
    "partition.alpha",
    "federation.num_clients",
    "federation.num_edges",
    "federation.edge_sizes",
    "federation.client_fraction",
    "federation.edges_per_round",
    "federation.weighting",
    "model.name",
    "model.hidden",
    "algorithm.name",
    "algorithm.lr",
    "algorithm.lam",
    "algorithm.rho",
    "algorithm.K",
    "algorithm.mu",
    "algorithm.batch_size",
    "comm.zero_threshold",
    "faults.client_dropout",
    "faults.edge_failure",
    "faults.straggler",
    "no_such_key",
    "algorithm.no_such_option",
    "federation",
    "algorithm",
]
NAMES = [
    "mnist",
    "synthetic",
    "labels",
    "dirichlet",
    "shards",
    "dnn",
    "mlr",
    "cnn",
    "fedavg",
    "fedprox",
    "hierfavg",
    "sfedhp",
    "pfedme",
    "perfedavg",
    "heurfedamp",
    "nope",
    "cpu",
]
VALUES = st.one_of(
    st.integers(-5, 3000).map(str),
    st.sampled_from(["0", "1", "2", "-1", "10", "11", "99999999999999999999", "1e-9"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        [
            ".nan",
            ".inf",
            "-.inf",
            "null",
            "true",
            "[]",
            "[1, 2]",
            "[0]",
            "{}",
            "{a: 1}",
            "'[unclosed'",
            "[5, 5, 5, 5]",
            "x: y: z",
            "",
            "0x10",
        ]
    ),
    st.sampled_from(NAMES),
    st.text(max_size=8),
)
OVERRIDE = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), VALUES),
    st.sampled_from(["=1", "a..b=1", "noequals", ".x=1", "rounds", "algorithm.=3"]),
)


@pytest.fixture(scope="module")
def restore_threads():  # noqa: ANN201
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(overrides=st.lists(OVERRIDE, max_size=4))
def test_random_overrides_never_traceback(
    overrides: list[str], capsys: pytest.CaptureFixture[str], restore_threads: None
) -> None:
    # --check validates everything and loads/partitions the data, then stops before training.
    capsys.readouterr()
    code = main(["run", "--check", "progress=false", *overrides])
    captured = capsys.readouterr()
    assert code in (0, 2), (overrides, captured.err)
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    # warning lines (e.g. a key given twice: the later value is used), then at most one error
    warned = [line for line in lines if line.startswith("fedhp: warning: ")]
    if code == 2:
        assert len(lines) == len(warned) + 1, captured.err
        assert lines[-1].startswith("fedhp: error: "), captured.err
    else:
        assert len(lines) == len(warned), captured.err
        assert captured.out.startswith("ok:"), captured.out


# Each case: overrides and a word the one-line error must contain.
STRICT = [
    (["algorithm.lr=0"], "algorithm.lr"),
    (["algorithm.lr=.inf"], "algorithm.lr"),
    (["algorithm.name=sfedhp", "algorithm.lam=-1"], "algorithm.lam"),
    (["algorithm.name=sfedhp", "algorithm.rho=0"], "algorithm.rho"),
    (["algorithm.name=sfedhp", "algorithm.K=0"], "algorithm.K"),
    (["federation.edges_per_round=5"], "federation.edges_per_round"),
    (["partition.labels_per_client=11"], "labels_per_client"),
    (["partition.train_per_class=100000"], "train_per_class"),
    (["dataset.name=imagenet"], "dataset.name"),
    (["model.name=resnet"], "model.name"),
    (["algorithm.name=fedsgd"], "algorithm.name"),
    (["seed=-1"], "seed"),
    (["seed=99999999999999999999"], "seed"),
    (["faults.client_dropout=1.5"], "faults.client_dropout"),
    (["faults.bogus=1"], "faults.bogus"),
    (["checkpoint_every=-1"], "checkpoint_every"),
    (["max_loss=0"], "max_loss"),
]


@pytest.mark.parametrize(("overrides", "field"), STRICT, ids=[s[1] for s in STRICT])
def test_strict_inputs(
    overrides: list[str], field: str, capsys: pytest.CaptureFixture[str], restore_threads: None
) -> None:
    from fedhp.algorithms import ALGORITHMS

    # every algorithm is always registered: a missing one fails, it is never skipped
    assert "algorithm.name=sfedhp" not in overrides or "sfedhp" in ALGORITHMS.names()
    code = main(["run", "--check", *overrides])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err, err


def _idx(path: Path, magic: int, dims: list[int], payload: bytes) -> None:
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims)
    path.write_bytes(header + payload)


@pytest.mark.parametrize("damage", ["truncated", "bad_magic", "bad_gzip"])
def test_corrupt_dataset_file_is_one_line_error(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 16
    _idx(tmp_path / "train-images-idx3-ubyte", 0x803, [n, 28, 28], bytes(n * 28 * 28))
    _idx(tmp_path / "train-labels-idx1-ubyte", 0x801, [n], bytes(n))
    _idx(tmp_path / "t10k-images-idx3-ubyte", 0x803, [n, 28, 28], bytes(n * 28 * 28))
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    if damage == "truncated":
        _idx(tmp_path / "train-images-idx3-ubyte", 0x803, [n, 28, 28], bytes(100))
        _idx(labels, 0x801, [n], bytes(n))
    elif damage == "bad_magic":
        _idx(labels, 0x12345, [n], bytes(n))
    else:
        (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"x" * 64)[:20])
    code = main(["run", "--check", f"dataset.data_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
