"""The model registry: every model is built by `create_model(name, **kwargs)` (docs/design.md).

A leaf (the timm pattern): the family modules import `register_model` from here, and the package
`throughway.models` imports every family, so the registry is full once the package is imported and
this module imports none of them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

__all__ = ["ModelEntry", "register_model", "create_model", "list_models", "model_entry"]


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
    model = entry.factory(**kwargs)
    config = {k: v for k, v in accepted.items() if v is not inspect.Parameter.empty}
    config.update(kwargs)
    # A factory that resolves a default from other arguments (mlp_layerscale's ε by depth) records
    # the value it used, so that the config rebuilds the same model.
    config.update(getattr(model, "resolved_arguments", {}))
    model.config = {"name": name, **config}  # type: ignore[assignment]  # nn.Module types attributes as tensors
    return model


def list_models() -> list[ModelEntry]:
    """Every registered model, sorted by name."""
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]
