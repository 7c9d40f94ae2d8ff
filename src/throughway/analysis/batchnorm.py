"""BatchNorm running statistics re-estimated over a data set ("precise BN").

BatchNorm's momentum never touches training: in training mode every layer normalises with the
batch's own mean and variance, and the momentum only sets how the running mean and variance used
in evaluation mode follow them. So the largest effect any momentum can have on a trained network is
bounded by replacing those running statistics with their exact averages over the training set,
weights unchanged: the limit of momentum → 0, which Keras's default momentum 0.99 (PyTorch's 0.01)
approaches and PyTorch's default 0.1 does not (it averages about the last ten batches). This is how
`throughway analyze bn-stats` tests whether BatchNorm's momentum explains a gap to a paper that used
Keras (docs/reproductions/mnist-depth.md). BatchNorm's ε, which does act in training, is not covered by it.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["reestimate_bn_statistics"]

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@torch.no_grad()
def reestimate_bn_statistics(model: nn.Module, x: torch.Tensor, *, batch_size: int = 128,
                             generator: torch.Generator | None = None) -> int:
    """Replace the running mean and variance of every BatchNorm layer of `model` by their exact
    averages over the batches of `x` (in a random order drawn from `generator`; the last batch may be
    smaller), computed with the model's weights as they are. Returns the number of BatchNorm layers.

    Each layer's statistics are the equal-weight mean of its per-batch statistics (torch's
    cumulative average, `momentum=None`), i.e. the limit of a small momentum. The weights, the layers'
    momentum and `num_batches_tracked`'s meaning are kept; the model is left in evaluation mode.
    Raises ValueError when `x` is empty or `batch_size` < 2 (a batch of one has no variance).
    """
    if batch_size < 2:
        raise ValueError(f"batch_size={batch_size}: must be at least 2 (BatchNorm needs a batch variance)")
    if len(x) < 2:
        raise ValueError(f"x holds {len(x)} samples: at least 2 are needed to estimate BatchNorm statistics")
    layers = [m for m in model.modules() if isinstance(m, _BATCH_NORMS) and m.track_running_stats]
    if not layers:
        return 0
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
    try:
        model.train()
        order = torch.randperm(len(x), generator=generator).to(x.device)
        for start in range(0, len(x), batch_size):
            index = order[start:start + batch_size]
            if len(index) >= 2:
                model(x.index_select(0, index))
    finally:
        for m, momentum in zip(layers, momenta):
            m.momentum = momentum
        model.eval()
    return len(layers)
