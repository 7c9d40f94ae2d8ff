"""Deprecated alias of `throughway.layers.gated` (renamed: `data.augment` is image
augmentation, a different thing). Import `AugmentedLayer` and `augment` from `throughway.layers`."""

from __future__ import annotations

import warnings

from .gated import AugmentedLayer, augment

__all__ = ["AugmentedLayer", "augment"]

warnings.warn("throughway.layers.augment is renamed throughway.layers.gated; import from throughway.layers",
              DeprecationWarning, stacklevel=2)
