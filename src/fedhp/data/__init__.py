"""Datasets (``DATASETS``) and client partitioners (``PARTITIONERS``)."""

from fedhp.data import categories, shakespeare, sparse_sim  # noqa: F401  (registration side effects)
from fedhp.data.partition import PARTITIONERS, Partitioner, split_dataset
from fedhp.data.sources import DATASETS, DatasetSource, load_dataset
from fedhp.data.types import ClientData, DatasetArrays

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "ClientData",
    "DatasetArrays",
    "DatasetSource",
    "Partitioner",
    "load_dataset",
    "split_dataset",
]
