"""The model registry: every model is built by `create_model(name, **kwargs)` (docs/design.md).

A leaf (the timm pattern): the family modules import `register_model` from here, and the package
`throughway.models` imports every family, so the registry is full once the package is imported and
this module imports none of them.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

__all__ = ["ModelEntry", "register_model", "create_model", "list_models", "model_entry", "check_numeric_arguments"]


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: its name, a one-line description and the factory that builds it."""

    name: str
    description: str
    factory: Callable[..., nn.Module]

    def parameters(self) -> dict[str, Any]:
        """The factory's keyword arguments and their defaults."""
        return {
            p.name: p.default
            for p in inspect.signature(self.factory).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, description: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register `factory` under `name`. Names are unique; registering twice is an error."""

    def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is registered twice")
        _REGISTRY[name] = ModelEntry(name, description, factory)
        return factory

    return decorator


def model_entry(name: str) -> ModelEntry:
    """Return the registry entry for `name`, or raise a KeyError listing the registered names."""
    if name not in _REGISTRY:
        raise KeyError(f"model={name!r} is not registered; registered models: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the registered model `name` with `kwargs`.

    Unknown keyword arguments raise a TypeError that lists the accepted ones. The returned model
    carries `model.config` ({"name": ..., **all arguments}, with any default the factory resolved
    from other arguments replaced by the value it used), enough to rebuild it exactly.
    """
    entry = model_entry(name)
    accepted = entry.parameters()
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"create_model({name!r}) got unknown arguments {unknown}; accepted: {sorted(accepted)}")
    check_numeric_arguments(name, kwargs)
    model = entry.factory(**kwargs)
    config = {k: v for k, v in accepted.items() if v is not inspect.Parameter.empty}
    config.update(kwargs)
    # A factory that resolves a default from other arguments (mlp_layerscale's ε by depth) records
    # the value it used, so that the config rebuilds the same model.
    config.update(getattr(model, "resolved_arguments", {}))
    model.config = {"name": name, **config}  # type: ignore[assignment]  # nn.Module types attributes as tensors
    return model


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# The numeric arguments whose range torch does not check: a BatchNorm momentum
# outside [0, 1] trains to 100% error, a negative ε fails only after the data is read, a non-finite
# k or gate bias makes every output NaN. The accepted ranges, said in the message.
_NUMERIC_ARGUMENTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bn_momentum": (lambda v: _number(v) and 0 <= v <= 1, "a number from 0 to 1 (PyTorch's default 0.1, Keras's 0.01)"),
    "bn_eps": (lambda v: _number(v) and 0 < v <= 1, "a number above 0, at most 1 (PyTorch's default 1e-5, Keras's 1e-3)"),
    "k_init": (_number, "a finite number"),
    "gate_bias": (_number, "a finite number"),
}


def check_numeric_arguments(name: str, kwargs: dict[str, Any]) -> None:
    """ValueError naming the argument and the accepted values when one of `kwargs` listed in
    `_NUMERIC_ARGUMENTS` (bn_momentum, bn_eps, k_init, gate_bias) is out of its range; None (the
    factory's own default, e.g. a layout's gate bias) is accepted. Called by `create_model`, so a
    command line, a Python call and a model file's metadata are all checked before any data is
    read or any memory allocated."""
    for key, value in kwargs.items():
        if key in _NUMERIC_ARGUMENTS and value is not None:
            ok, accepted = _NUMERIC_ARGUMENTS[key]
            if not ok(value):
                raise ValueError(f"create_model({name!r}): {key}={value!r} (--model-arg {key}=..., model_kwargs.{key}); "
                                 f"accepted: {accepted}")


def list_models() -> list[ModelEntry]:
    """Every registered model, sorted by name."""
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]
