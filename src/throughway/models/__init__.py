"""Models, one family per file, each registered by name; build them with `create_model`."""

from .mlp import LEGACY_STEM, MLP_FAMILIES, STEMS, with_legacy_stem
from .registry import ModelEntry, create_model, list_models, model_entry, register_model

__all__ = ["ModelEntry", "create_model", "list_models", "model_entry", "register_model", "STEMS", "LEGACY_STEM",
           "MLP_FAMILIES", "with_legacy_stem"]
