"""A study's runs: each one a name (its folder under the study's runs/) and a run config, and the check of
them all before anything is read or trained."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..train import RunConfig

__all__ = ["RunSpec", "check_specs"]


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: its name (the subfolder), its config."""

    name: str
    config: RunConfig


def check_specs(specs: Sequence[RunSpec]) -> None:
    """Check every run's config as `throughway train` does (`train.config.check_config`: device, dataset,
    depth, limit, recipe and its overrides, model arguments), before any data is read or any run
    starts, so that a bad study option is one error (ValueError naming the run and the field), not
    a study whose runs all fail. The model is built (on the meta device) once per stack shape
    (`train.stack.stack_key`) and model with its arguments: a stack holds models of more than one
    kind (residual and gated residual), and each kind's own arguments (a gate's k_init) are checked
    before the first stack trains; the recipe of every run is resolved."""
    from ..train.stack import stack_key
    from ..train.config import check_config, resolve_recipe

    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # a study list with a repeated value: refused before anything runs (it would train twice)
        raise ValueError(f"runs {', '.join(repeated)}: listed more than once (a study option repeats a value); "
                         f"accepted: each run once")
    checked: set[Any] = set()
    for spec in specs:
        try:
            key = (stack_key(spec.config), spec.config.model, repr(sorted(spec.config.model_kwargs.items())))
            if key not in checked:
                check_config(spec.config)
                checked.add(key)
            resolve_recipe(spec.config)
        except (ValueError, KeyError, TypeError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise ValueError(f"run {spec.name}: {message}") from exc
