"""Experiments: one module per paper table or figure, with the paper's numbers beside ours.

Each experiment module provides NAME, DESCRIPTION, Config (a frozen dataclass whose fields are
declared with `study.options.option`, so that each option is declared once), run(config, out,
resume=..., jobs=...) and write_report(out). `add_arguments(parser)` and `config_from_args(args)`
are optional: without them the command line is generated from Config (`study.options`); a module
defines them only to add a mode (e.g. --estimate) or to start from a preset.
"""

from __future__ import annotations

from types import ModuleType

from . import (cifar_gated, gate_family, gate_family_init, hessian_dynamics, hessian_init, highway_depth,
               identity_distance, layer_drop, mnist_depth, sdi_table, shortcut_lr, transformer_gates, weight_norms)

# Every experiment by its NAME, in the order `throughway list` and `reproduce --help` show them: the
# papers' tables and figures first, then the studies beyond them.
EXPERIMENTS: dict[str, ModuleType] = {module.NAME: module for module in (
    mnist_depth, highway_depth,  # gated-residual-v2 Table 1; highway §3.1 figure 1
    hessian_init, hessian_dynamics, shortcut_lr, weight_norms,  # Demystifying ResNet
    sdi_table,  # gated-residual-v1 Table 1
    identity_distance,  # beyond the papers: distance to identity along training
    cifar_gated,  # gated-residual-v2 Tables 3 and 4 (CIFAR)
    gate_family, gate_family_init,  # ours: ReZero, SkipInit and LayerScale beside the 2017 gate
    transformer_gates,  # ours: the 2017 gate in a transformer
    layer_drop,  # ours: which layers a trained language model can lose
)}

__all__ = ["EXPERIMENTS", "get_experiment"]


def get_experiment(name: str) -> ModuleType:
    """The experiment module called `name`, or a KeyError listing the known ones."""
    if name not in EXPERIMENTS:
        raise KeyError(f"experiment={name!r} is not known; accepted values: {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name]
