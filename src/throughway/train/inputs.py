"""The user's data as `fit` trains on it: in-memory splits on the model's device, or a DataLoader.

See `loop.fit` for the accepted forms (DataSplits, a pair of tensors, a Dataset, a DataLoader).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from ..data import DataSplits, Split

__all__ = ["ACCEPTED_DATA", "resolve_data", "model_device", "to_device"]

ACCEPTED_DATA = ("DataSplits, a pair of tensors (x, y), a torch.utils.data.Dataset of (x, y) items, "
                 "or a torch.utils.data.DataLoader yielding (x, y) batches")


def model_device(model: nn.Module) -> torch.device:
    """The device of `model`'s first parameter or buffer; ValueError for a model without any."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    raise ValueError("model has no parameters or buffers; fit needs a model with parameters to train")


def to_device(batch: Any, device: torch.device, argument: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A DataLoader batch (x, y) moved to `device`; TypeError naming `argument` for anything else."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise TypeError(f"{argument}: a DataLoader batch is {type(batch).__name__}; accepted: a pair of tensors (x, y)")
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def _pair(x: Any, y: Any, argument: str, device: torch.device) -> Split:
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        raise TypeError(f"{argument}: (x, y) must both be tensors, got ({type(x).__name__}, {type(y).__name__})")
    if x.dim() == 0 or y.dim() == 0 or len(x) != len(y):
        raise ValueError(f"{argument}: x and y must have one row per sample and as many rows; got shapes "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    return Split(x.to(device), y.to(device))


def _stack_dataset(dataset: Dataset, argument: str, device: torch.device) -> Split:
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return _pair(*dataset.tensors, argument, device)
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise TypeError(f"{argument}: an iterable Dataset has no length to stack; pass it inside a DataLoader")
    xs, ys = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"{argument}: item {i} is {type(item).__name__}; accepted: a pair (x, y) per item "
                            f"(or pass a DataLoader that builds the batches)")
        xs.append(torch.as_tensor(item[0]))
        ys.append(torch.as_tensor(item[1]))
    if not xs:
        raise ValueError(f"{argument}: the Dataset is empty")
    return _pair(torch.stack(xs), torch.stack(ys), argument, device)


def _user_split(data: Any, argument: str, device: torch.device) -> Split | DataLoader:
    """A user's data as an in-memory Split on `device` where possible, else the DataLoader itself."""
    if isinstance(data, DataLoader):
        return data
    if isinstance(data, Split):
        return _pair(data.x, data.y, argument, device)
    if isinstance(data, Dataset):
        return _stack_dataset(data, argument, device)
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _pair(data[0], data[1], argument, device)
    raise TypeError(f"{argument}: got {type(data).__name__}; accepted: {ACCEPTED_DATA}")


def resolve_data(model: nn.Module, data: Any, eval_data: Any) -> tuple[torch.device, Split | DataLoader,
                                                                    Split | DataLoader | None,
                                                                    Split | DataLoader | None, DataSplits | None]:
    """(device, train, val, test, the DataSplits given or None)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: got {type(model).__name__}; accepted: a torch.nn.Module")
    if isinstance(data, DataSplits):
        if eval_data is not None:
            raise ValueError("eval_data: DataSplits carries its own val and test splits; give eval_data only "
                             "with tensors, a Dataset or a DataLoader")
        device = data.train.x.device
        if model_device(model) != device:
            raise ValueError(f"model is on {model_device(model)} but the data on {device}; move one")
        return device, data.train, data.val, data.test, data
    device = model_device(model)
    train = _user_split(data, "data", device)
    test = None if eval_data is None else _user_split(eval_data, "eval_data", device)
    return device, train, None, test, None
