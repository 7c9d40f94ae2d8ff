"""Data: verified sources (MNIST, Fashion-MNIST, CIFAR), the numpy-only unpickler, IDX reader, tensors."""

from .idx import read_idx, write_idx
from .loader import DataSplits, Split, load_dataset, to_splits
from .safe_pickle import NumpyOnlyUnpickler, safe_load, safe_loads
from .sources import (
    DATASET_SHAPES,
    DATASETS,
    ArraySplits,
    data_root,
    load_arrays,
    load_cifar10,
    load_cifar100,
    load_fashion_mnist,
    load_mnist,
    mnist_from_pickle_bytes,
)

__all__ = [
    "ArraySplits",
    "DATASETS",
    "DATASET_SHAPES",
    "DataSplits",
    "NumpyOnlyUnpickler",
    "Split",
    "data_root",
    "load_arrays",
    "load_cifar10",
    "load_cifar100",
    "load_dataset",
    "load_fashion_mnist",
    "load_mnist",
    "mnist_from_pickle_bytes",
    "read_idx",
    "safe_load",
    "safe_loads",
    "to_splits",
    "write_idx",
]
