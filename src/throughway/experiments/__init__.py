"""Experiments: one module per paper table or figure, with the paper's numbers beside ours.

Each experiment module provides NAME, DESCRIPTION, Config, add_arguments(parser),
config_from_args(args), run(config, out, resume=..., jobs=...) and write_report(out).
"""

from __future__ import annotations

from types import ModuleType

from . import mnist_depth

EXPERIMENTS: dict[str, ModuleType] = {mnist_depth.NAME: mnist_depth}

__all__ = ["EXPERIMENTS", "get_experiment"]


def get_experiment(name: str) -> ModuleType:
    """The experiment module called `name`, or a KeyError listing the known ones."""
    if name not in EXPERIMENTS:
        raise KeyError(f"experiment={name!r} is not known; accepted values: {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name]
