"""The nets a study's analyses build and measure: a model initialised from a seed as every run initialises
its own (`seeded_model`), and its test accuracy as a removal curve's metric (`test_accuracy`)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..models import create_model
from ..train.loop import evaluate

__all__ = ["seeded_model", "test_accuracy"]


def seeded_model(name: str, seed: int, device: str | torch.device = "cpu", **kwargs: Any) -> nn.Module:
    """`create_model(name, **kwargs)` on `device`, initialised from `seed`: torch.manual_seed(seed) first, as
    every run's model is (`train.config.build_model`), so that the same seed gives the same initial weights
    whatever was drawn before."""
    torch.manual_seed(seed)
    return create_model(name, **kwargs).to(device)


def test_accuracy(split: Any) -> Callable[[nn.Module], float]:
    """The metric of a removal curve (`analysis.removal.removal_curve`): a model's accuracy (%) on `split`,
    100 − its error (`train.loop.evaluate`)."""
    return lambda model: 100.0 - evaluate(model, split)[1]
