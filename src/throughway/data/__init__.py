"""Data: verified sources (MNIST, Fashion-MNIST, CIFAR, the shakespeare-char text corpus), the numpy-only
unpickler, IDX reader, tensors, character vocabularies and blocks."""

from .idx import read_idx, write_idx
from .loader import TEXT_DATASETS, DataSplits, Split, load_dataset, load_text_dataset, to_splits
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
from .text import TextSplits, evaluation_blocks, random_blocks

__all__ = [
    "ArraySplits",
    "DATASETS",
    "DATASET_SHAPES",
    "DataSplits",
    "NumpyOnlyUnpickler",
    "Split",
    "TEXT_DATASETS",
    "TextSplits",
    "data_root",
    "load_arrays",
    "load_cifar10",
    "load_cifar100",
    "load_dataset",
    "load_text_dataset",
    "evaluation_blocks",
    "random_blocks",
    "load_fashion_mnist",
    "load_mnist",
    "mnist_from_pickle_bytes",
    "read_idx",
    "safe_load",
    "safe_loads",
    "to_splits",
    "write_idx",
]
