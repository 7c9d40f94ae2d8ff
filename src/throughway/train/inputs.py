"""The user's data as `fit` trains on it: in-memory splits on the model's device, a map-style Dataset
read item by item every epoch (`ItemSplit`), or a DataLoader.

See `loop.fit` for the accepted forms (DataSplits, a pair of tensors, a Dataset, a DataLoader).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from ..data import DataSplits, Split

__all__ = ["ACCEPTED_DATA", "ItemSplit", "resolve_data", "user_split", "model_device", "check_materialised", "to_device",
           "loader_length"]

ACCEPTED_DATA = ("DataSplits, a pair of tensors (x, y), a torch.utils.data.Dataset of (x, y) items, "
                 "or a torch.utils.data.DataLoader yielding (x, y) batches")


def model_device(model: nn.Module) -> torch.device:
    """The device of `model`'s first parameter or buffer; ValueError for a model without any, and one
    naming the meta device and the tensor when any of them is a meta tensor (`check_materialised`)."""
    check_materialised(model)
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    raise ValueError("model has no parameters or buffers; fit needs a model with parameters to train")


def check_materialised(model: nn.Module) -> None:
    """ValueError naming `model`, the meta device and the first parameter or buffer on it: a meta tensor
    has a shape but no values (a model built under `torch.device("meta")`, or loaded with empty weights
    that were never filled), so nothing can be trained or evaluated; said before the first step, not as
    torch's "Tensor.item() cannot be called on meta tensors" after it."""
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in named:
            if tensor.is_meta:
                raise ValueError(f"model: its {kind} {name!r} is on the meta device, which holds shapes but no "
                                 f"values (a model built under torch.device('meta'), or loaded with empty weights); "
                                 f"nothing was trained; accepted: a model on a real device (cpu, cuda): "
                                 f"model.to_empty(device=...) and then load or initialise its weights")


def to_device(batch: Any, device: torch.device, argument: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A DataLoader batch (x, y) moved to `device`; TypeError naming `argument` for anything else."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise TypeError(f"{argument}: a DataLoader batch is {type(batch).__name__}; accepted: a pair of tensors (x, y)")
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def loader_length(loader: DataLoader) -> int | None:
    """The batches of an epoch of `loader`, or None when it has no length (an iterable Dataset's)."""
    try:
        return len(loader)
    except TypeError:
        return None


def _pair(x: Any, y: Any, argument: str, device: torch.device) -> Split:
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        raise TypeError(f"{argument}: (x, y) must both be tensors, got ({type(x).__name__}, {type(y).__name__})")
    if x.dim() == 0 or y.dim() == 0 or len(x) != len(y):
        raise ValueError(f"{argument}: x and y must have one row per sample and as many rows; got shapes "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    return Split(x.to(device), y.to(device))


def _item_pair(item: Any, i: int, argument: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise TypeError(f"{argument}: item {i} is {type(item).__name__}; accepted: a pair (x, y) per item "
                        f"(or pass a DataLoader that builds the batches)")
    return torch.as_tensor(item[0]), torch.as_tensor(item[1])


class ItemSplit:
    """A map-style Dataset of (x, y) items that `fit` trains on: `take(index)` reads the items of a
    batch (calling `dataset[i]` each time, so per-item random augmentation differs across epochs) and
    stacks them on `device`. Batches and their order follow the in-memory path's rule (the same
    permutation from `fit`'s seed, the same batch starts)."""

    def __init__(self, dataset: Dataset, argument: str, device: torch.device) -> None:
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError(f"{argument}: an iterable Dataset has no length to index; pass it inside a DataLoader")
        if len(dataset) == 0:
            raise ValueError(f"{argument}: the Dataset is empty")
        # The item form is checked once, before training; fit probes the model with this item (train.checks).
        self.first = _item_pair(dataset[0], 0, argument)
        self.dataset, self.argument, self.device = dataset, argument, device

    def __len__(self) -> int:
        return len(self.dataset)

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The items at `index` (a 1-d tensor of positions), read now and stacked on the device."""
        pairs = [_item_pair(self.dataset[i], i, self.argument) for i in index.tolist()]
        return (torch.stack([x for x, _ in pairs]).to(self.device), torch.stack([y for _, y in pairs]).to(self.device))


def _stack_dataset(dataset: Dataset, argument: str, device: torch.device) -> Split:
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return _pair(*dataset.tensors, argument, device)
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise TypeError(f"{argument}: an iterable Dataset has no length to stack; pass it inside a DataLoader")
    xs, ys = [], []
    for i in range(len(dataset)):
        x, y = _item_pair(dataset[i], i, argument)
        xs.append(x)
        ys.append(y)
    if not xs:
        raise ValueError(f"{argument}: the Dataset is empty")
    return _pair(torch.stack(xs), torch.stack(ys), argument, device)


def user_split(data: Any, argument: str, device: torch.device) -> Split | DataLoader:
    """A user's evaluation data as an in-memory Split on `device` where possible (a map-style Dataset is
    read once and stacked), else the DataLoader itself; TypeError naming `argument` for other kinds."""
    if isinstance(data, DataLoader):
        return data
    if isinstance(data, Split):
        return _pair(data.x, data.y, argument, device)
    if isinstance(data, Dataset):
        return _stack_dataset(data, argument, device)
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _pair(data[0], data[1], argument, device)
    raise TypeError(f"{argument}: got {type(data).__name__}; accepted: {ACCEPTED_DATA}")


def resolve_data(model: nn.Module, data: Any, val_data: Any, test_data: Any) -> tuple[
        torch.device, Split | ItemSplit | DataLoader, Split | DataLoader | None, Split | DataLoader | None,
        DataSplits | None]:
    """(device, train, val, test, the DataSplits given or None). The training data is a Split (tensors,
    a TensorDataset), an ItemSplit (any other map-style Dataset, read every epoch) or a DataLoader."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: got {type(model).__name__}; accepted: a torch.nn.Module")
    if isinstance(data, DataSplits):
        for name, given in (("val_data", val_data), ("test_data", test_data)):
            if given is not None:
                raise ValueError(f"{name}: DataSplits carries its own val and test splits; give {name} only "
                                 f"with tensors, a Dataset or a DataLoader")
        device = data.train.x.device
        if model_device(model) != device:
            raise ValueError(f"model is on {model_device(model)} but the data on {device}; move one")
        return device, data.train, data.val, data.test, data
    device = model_device(model)
    train: Split | ItemSplit | DataLoader
    if isinstance(data, Dataset) and not isinstance(data, (TensorDataset, IterableDataset)):
        train = ItemSplit(data, "data", device)
    else:
        train = user_split(data, "data", device)
    val = None if val_data is None else user_split(val_data, "val_data", device)
    test = None if test_data is None else user_split(test_data, "test_data", device)
    return device, train, val, test, None
