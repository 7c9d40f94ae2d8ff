"""Layers and blocks: gates, the augmentation, plain / residual / gated residual and highway blocks, and
the registry of other libraries' block types with `add_gates` (adapters).

Imports only torch (docs/design.md: layers know nothing of models).
"""

from .gated import AugmentedLayer, augment
from .adapters import (GATE_KINDS, BlockSpec, GatedOutput, add_gates, block_spec, gate_parameters, register_block,
                       registered_blocks)
from .conv import PreActBlock, PreActUnit, WideBlock, ZeroPadShortcut, conv_highway_layer
from .dense import ACTIVATIONS, NORMS, PlainBlock, ResidualBlock, dense_unit, make_activation
from .gates import (GATE_FUNCTIONS, ScalarGate, TransformGate, VectorGate, cait_layerscale_init, scalar_gate_values,
                    scalar_gates)
from .highway import HighwayLayer, dense_highway_layer
from .init import INIT_SCHEMES, init_weights_

__all__ = [
    "GATE_KINDS",
    "BlockSpec",
    "GatedOutput",
    "add_gates",
    "block_spec",
    "gate_parameters",
    "register_block",
    "registered_blocks",
    "PreActBlock",
    "PreActUnit",
    "WideBlock",
    "ZeroPadShortcut",
    "conv_highway_layer",
    "ACTIVATIONS",
    "AugmentedLayer",
    "GATE_FUNCTIONS",
    "HighwayLayer",
    "INIT_SCHEMES",
    "NORMS",
    "PlainBlock",
    "ResidualBlock",
    "ScalarGate",
    "TransformGate",
    "VectorGate",
    "cait_layerscale_init",
    "augment",
    "dense_highway_layer",
    "dense_unit",
    "init_weights_",
    "make_activation",
    "scalar_gate_values",
    "scalar_gates",
]
