"""Whitened MNIST with the 10 leading principal components (Demystifying ResNet appendix B).

Inputs: the images' leading principal components, each scaled to unit variance on the training
set (so the training inputs have mean 0 and identity covariance). Targets: one-hot 10-dimensional
vectors, for a squared-error loss. The principal components are computed on the training images
only, in float64, and applied unchanged to the test images.

Training set: by default the 60,000 official MNIST training images (the train and validation
splits of the toolkit's MNIST source together), as in the paper; `train_images="50k"` keeps only
the 50,000-image train split.

For linear networks a squared-error loss sees the data only through its second moments, so
`second_moment_dataset` condenses any (x, y) set into at most dim(x)+dim(y) samples with exactly
the same second moments: the loss, gradient and Hessian of any linear network on the condensed set
equal those on the full set (up to rounding). This is what makes per-epoch exact Hessians cheap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from .sources import load_arrays

__all__ = ["WhitenedData", "whiten", "load_whitened_mnist", "second_moment_dataset", "one_hot"]


@dataclass(frozen=True)
class WhitenedData:
    """Whitened inputs and one-hot targets (float64 tensors) and the transform that made them.

    `components` (D × k) and `scale` (k,) map an image x (flattened, in [0, 1)) to
    ((x − mean) @ components) / scale.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    train_labels: torch.Tensor
    test_labels: torch.Tensor
    mean: np.ndarray
    components: np.ndarray
    scale: np.ndarray
    explained_variance_ratio: float


def one_hot(labels: np.ndarray | torch.Tensor, num_classes: int = 10) -> torch.Tensor:
    """One-hot float64 rows (N, num_classes) for integer labels."""
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    return torch.nn.functional.one_hot(labels, num_classes).to(torch.float64)


def whiten(train_x: np.ndarray, test_x: np.ndarray, components: int = 10) -> tuple[np.ndarray, np.ndarray, dict]:
    """PCA-whiten flattened images: keep `components` leading principal components of `train_x`.

    Returns (train, test, info) with float64 arrays; info holds mean, components, scale and the
    fraction of the variance the kept components explain.
    """
    if components < 1 or components > train_x.shape[1]:
        raise ValueError(f"components={components}: must be between 1 and {train_x.shape[1]}")
    x = train_x.astype(np.float64)
    mean = x.mean(axis=0)
    centred = x - mean
    cov = centred.T @ centred / len(x)
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values)[::-1][:components]
    top, basis = values[order], vectors[:, order]
    # Fix each component's sign (largest-magnitude loading positive) so the transform is reproducible.
    signs = np.sign(basis[np.abs(basis).argmax(axis=0), np.arange(components)])
    basis = basis * signs
    scale = np.sqrt(top)
    train = centred @ basis / scale
    test = (test_x.astype(np.float64) - mean) @ basis / scale
    info = {"mean": mean, "components": basis, "scale": scale,
            "explained_variance_ratio": float(top.sum() / values.sum())}
    return train, test, info


def load_whitened_mnist(data_dir: str | os.PathLike[str] | None = None, components: int = 10,
                        train_images: str = "60k", device: str | torch.device = "cpu") -> WhitenedData:
    """Whitened MNIST (see the module docstring): `train_images` "60k" (paper) or "50k"."""
    if train_images not in ("60k", "50k"):
        raise ValueError(f"train_images={train_images!r} is not known; accepted values: ['60k', '50k']")
    arrays = load_arrays("mnist", data_dir)
    # The toolkit caches MNIST as uint8 round(x·256); the scale is irrelevant after whitening.
    tx = arrays.train_x.reshape(len(arrays.train_x), -1)
    ty = arrays.train_y
    if train_images == "60k":
        tx = np.concatenate([tx, arrays.val_x.reshape(len(arrays.val_x), -1)])
        ty = np.concatenate([ty, arrays.val_y])
    sx = arrays.test_x.reshape(len(arrays.test_x), -1)
    train, test, info = whiten(tx / 256.0, sx / 256.0, components)
    dev = torch.device(device)
    return WhitenedData(
        train_x=torch.from_numpy(train).to(dev), train_y=one_hot(ty).to(dev),
        test_x=torch.from_numpy(test).to(dev), test_y=one_hot(arrays.test_y).to(dev),
        train_labels=torch.as_tensor(ty.astype(np.int64), device=dev),
        test_labels=torch.as_tensor(arrays.test_y.astype(np.int64), device=dev),
        mean=info["mean"], components=info["components"], scale=info["scale"],
        explained_variance_ratio=info["explained_variance_ratio"])


def second_moment_dataset(x: torch.Tensor, y: torch.Tensor, tol: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """A set (x', y') of m ≤ dim(x)+dim(y) samples with the second moments of (x, y).

    mean(x'x'ᵀ) = mean(xxᵀ), mean(y'x'ᵀ) = mean(yxᵀ), mean(y'y'ᵀ) = mean(yyᵀ), so for any linear
    map A, mean ‖Ax' − y'‖² = mean ‖Ax − y‖²: the squared-error loss of a linear network, and hence
    its gradient and Hessian, are the same on both sets. Not valid for nonlinear networks.
    """
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
        raise ValueError(f"x and y must be matrices with the same number of rows; got {tuple(x.shape)}, {tuple(y.shape)}")
    z = torch.cat([x, y], dim=1).to(torch.float64)
    moments = z.T @ z / len(z)
    values, vectors = torch.linalg.eigh(moments)
    keep = values > tol * values.max().clamp_min(1e-300)
    values, vectors = values[keep], vectors[:, keep]
    m = len(values)
    rows = (vectors * (values * m).sqrt()).T  # mean over the m rows of r rᵀ = Σ λ v vᵀ
    return rows[:, : x.shape[1]].to(x.dtype), rows[:, x.shape[1]:].to(y.dtype)
