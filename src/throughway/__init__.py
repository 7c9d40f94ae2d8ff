"""throughway: very deep networks that learn identity mappings through shortcuts.

Highway, residual, gated residual and n-shortcut networks; the papers' recipes; the analyses that
explain why they train; and a command line that reproduces the papers' tables and figures.
"""

from .layers import add_gates, register_block
from .models import create_model, list_models

__version__ = "0.1.0"

__all__ = ["__version__", "add_gates", "create_model", "list_models", "register_block"]
