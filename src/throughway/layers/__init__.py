"""Layers and blocks: gates, the augmentation, plain / residual / gated residual and highway blocks, the
one block representation (blocks: the registry, `find_branches`, closing and checking) and the gates
put into any network (adapters: `add_gates`, `fold_gates`, `restore_gates`).

Imports only torch (docs/design.md: layers know nothing of models).
"""

from .gated import AugmentedLayer, augment
from .blocks import (BlockSpec, BranchRef, ClosedGate, SpecCheck, block_spec, branch_gate_values, check_blocks,
                     close_branches, find_branches, gate_parameters, register_block, register_contract_block,
                     register_rule, registered_blocks, scalar_gate_values, unregister_block)
from .adapters import GATE_KINDS, add_gates, fold_gates, restore_gates
from .conv import PreActBlock, PreActUnit, WideBlock, ZeroPadShortcut, conv_highway_layer
from .dense import ACTIVATIONS, NORMS, PlainBlock, ResidualBlock, dense_unit, make_activation
from .gates import GATE_FUNCTIONS, ScalarGate, TransformGate, VectorGate, cait_layerscale_init
from .highway import HighwayLayer, dense_highway_layer
from .init import INIT_SCHEMES, init_weights_

__all__ = [
    "GATE_KINDS",
    "BlockSpec",
    "BranchRef",
    "ClosedGate",
    "SpecCheck",
    "add_gates",
    "block_spec",
    "branch_gate_values",
    "check_blocks",
    "close_branches",
    "find_branches",
    "fold_gates",
    "gate_parameters",
    "register_block",
    "register_contract_block",
    "register_rule",
    "registered_blocks",
    "restore_gates",
    "unregister_block",
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
]
