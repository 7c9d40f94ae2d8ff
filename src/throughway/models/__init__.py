"""Models, one family per file, each registered by name; build them with `create_model`."""

from typing import Any

from .registry import ModelEntry, create_model, list_models, model_entry, register_model

# Importing the families runs their @register_model decorators (registry.py imports none of them).
from . import gpt, highway_conv, mlp, preact_resnet, shortcut, vit, wide_resnet  # noqa: E402,F401  isort: skip
from .base import MLP, ConvNet, StemBlocksHead  # noqa: E402
from .highway_conv import LEGACY_MNIST_ARCH, with_legacy_layout  # noqa: E402
from .mlp import LEGACY_STEM, MLP_FAMILIES, STEMS, with_legacy_stem  # noqa: E402

__all__ = ["ModelEntry", "create_model", "list_models", "model_entry", "register_model", "STEMS", "LEGACY_STEM",
           "MLP_FAMILIES", "with_legacy_stem", "StemBlocksHead", "MLP", "ConvNet", "LEGACY_MNIST_ARCH",
           "with_legacy_layout", "with_legacy_config"]


def with_legacy_config(config: dict[str, Any]) -> dict[str, Any]:
    """A saved model.config ({"name": ..., **arguments}) as today's factories read it: MLPs without
    a stem get the stem they were built with (`with_legacy_stem`), highway_conv "mnist-10" nets saved
    before the authors' layout took that name get LEGACY_MNIST_ARCH (`with_legacy_layout`)."""
    return with_legacy_layout(with_legacy_stem(config))
