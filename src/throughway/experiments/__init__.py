"""Experiments: one module per paper table or figure, with the paper's numbers beside ours.

Each experiment module provides NAME, DESCRIPTION, Config (a frozen dataclass whose fields are
declared with `study.options.option`, so that each option is declared once), run(config, out,
resume=..., jobs=...) and write_report(out). `add_arguments(parser)` and `config_from_args(args)`
are optional: without them the command line is generated from Config (`study.options`); a module
defines them only to add a mode (e.g. --estimate) or to start from a preset.
"""

from __future__ import annotations

from types import ModuleType

from . import highway_depth, mnist_depth

EXPERIMENTS: dict[str, ModuleType] = {mnist_depth.NAME: mnist_depth}
EXPERIMENTS[highway_depth.NAME] = highway_depth
from . import hessian_init  # noqa: E402  (issue 4)
EXPERIMENTS[hessian_init.NAME] = hessian_init
from . import hessian_dynamics  # noqa: E402  (issue 4)
EXPERIMENTS[hessian_dynamics.NAME] = hessian_dynamics
from . import shortcut_lr  # noqa: E402  (issue 4)
EXPERIMENTS[shortcut_lr.NAME] = shortcut_lr
from . import weight_norms  # noqa: E402  (issue 4)
EXPERIMENTS[weight_norms.NAME] = weight_norms
from . import sdi_table  # noqa: E402  (issue 4)
EXPERIMENTS[sdi_table.NAME] = sdi_table
from . import identity_distance  # noqa: E402  (issue 4)
EXPERIMENTS[identity_distance.NAME] = identity_distance
from . import cifar_gated  # noqa: E402  (issue 6)
EXPERIMENTS[cifar_gated.NAME] = cifar_gated
from . import gate_family  # noqa: E402  (issue 24)
EXPERIMENTS[gate_family.NAME] = gate_family
from . import gate_family_init  # noqa: E402  (issue 24)
EXPERIMENTS[gate_family_init.NAME] = gate_family_init
from . import transformer_gates  # noqa: E402  (ours: the 2017 gate in a transformer)
EXPERIMENTS[transformer_gates.NAME] = transformer_gates
from . import layer_drop  # noqa: E402  (ours: which layers a trained language model can lose)
EXPERIMENTS[layer_drop.NAME] = layer_drop


__all__ = ["EXPERIMENTS", "get_experiment"]


def get_experiment(name: str) -> ModuleType:
    """The experiment module called `name`, or a KeyError listing the known ones."""
    if name not in EXPERIMENTS:
        raise KeyError(f"experiment={name!r} is not known; accepted values: {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name]
