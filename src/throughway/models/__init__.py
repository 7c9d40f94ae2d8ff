"""Models, one family per file, each registered by name; build them with `create_model`."""

from typing import Any

from .highway_conv import LEGACY_MNIST_ARCH, with_legacy_layout
from .mlp import LEGACY_STEM, MLP_FAMILIES, STEMS, with_legacy_stem
from .registry import ModelEntry, create_model, list_models, model_entry, register_model

__all__ = ["ModelEntry", "create_model", "list_models", "model_entry", "register_model", "STEMS", "LEGACY_STEM",
           "MLP_FAMILIES", "with_legacy_stem", "LEGACY_MNIST_ARCH", "with_legacy_layout", "with_legacy_config"]


def with_legacy_config(config: dict[str, Any]) -> dict[str, Any]:
    """A saved model.config ({"name": ..., **arguments}) as today's factories read it: MLPs without
    a stem get the stem they were built with (`with_legacy_stem`), highway_conv "mnist-10" nets saved
    before the authors' layout took that name get LEGACY_MNIST_ARCH (`with_legacy_layout`)."""
    return with_legacy_layout(with_legacy_stem(config))
