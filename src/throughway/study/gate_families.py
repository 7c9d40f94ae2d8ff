"""The MLP families the two gate-family studies compare (`reproduce gate-family`, which trains them, and
`reproduce gate-family-init`, which measures them at initialisation): the residual branch f_r scaled by
nothing, by relu(k), by α (ReZero) or by a vector λ (LayerScale), each with and without BatchNorm in the
branch."""

from __future__ import annotations

from typing import Any

from ..layers import cait_layerscale_init

__all__ = ["FAMILIES", "family_kwargs"]

# family -> (registered model, model kwargs). "-nf": no BatchNorm in the branch (norm="none").
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "residual": ("mlp_residual", {}),
    "gated": ("mlp_gated_residual", {}),
    "rezero": ("mlp_rezero", {}),
    "layerscale": ("mlp_layerscale", {}),
    "residual-nf": ("mlp_residual", {"norm": "none"}),
    "gated-nf": ("mlp_gated_residual", {"norm": "none"}),
    "rezero-nf": ("mlp_rezero", {"norm": "none"}),
}


def family_kwargs(family: str, depth: int) -> dict[str, Any]:
    """The model arguments of `family` at depth d: FAMILIES' own, and for LayerScale the studies' ε, CaiT's
    for d, the middle layers (Touvron et al. 2021 §3, `layers.cait_layerscale_init`; recorded since the
    gate-family study began; the toolkit's default counts the d/2 blocks): 0.1 at d = 2, 10; 1e-5 at
    d = 20; 1e-6 at d = 50, 100."""
    model, kwargs = FAMILIES[family]
    if model == "mlp_layerscale":
        return {**kwargs, "k_init": cait_layerscale_init(depth)}
    return dict(kwargs)
