"""Fully connected networks of the MNIST studies: plain, residual, gated residual, augmented, highway.

Shape of every model (gated-residual-v2 section 3.1, highway paper section 3.1): a first plain
layer from the input to `width` units (the `stem`), `depth` middle layers (the paper's d), and a
linear classifier whose logits feed a softmax cross-entropy. The middle layers sit in
`model.blocks` (one `nn.ModuleList`):

* mlp_plain: d Dot-BN-ReLU layers (or Dot-activation without BatchNorm, the highway paper's plain net);
* mlp_residual: d/2 blocks u = f_r(x) + x, f_r two Dot-BN-ReLU layers;
* mlp_gated_residual: d/2 blocks u = g(k)·f_r(x) + x, so exactly d/2 parameters more than mlp_residual;
* mlp_rezero: d/2 blocks u = α·f_r(x) + x, one scalar α per block starting at 0 (ReZero,
  Bachlechner et al. 2020; with norm="none" it is SkipInit's setting, De & Smith 2020);
* mlp_layerscale: d/2 blocks u = diag(λ)·f_r(x) + x, one λ per channel starting at ε (LayerScale,
  Touvron et al. 2021 §3; ε by depth as CaiT's, `cait_layerscale_init`);
* mlp_augmented: d plain layers each augmented, u = g(k)·f(x) + (1 − g(k))·x;
* mlp_highway: d highway layers y = H(x)·T(x) + x·(1 − T(x)).

Every residual family takes norm="batch" (Dot-BN-ReLU units in the branch) or norm="none"
(Dot-ReLU: the normalisation-free variant, SkipInit's setting). Every gate module has the same
interface (layers.gates): `block.gate.k` is the parameter, `block.gate.value()` is g as a 0-d tensor
(ScalarGate) or a (C,) tensor (VectorGate), `block.gate.function` names g.

The first layer is the `stem` argument of every family:

* ``stem="linear"``: a single Dot (nn.Linear, no BatchNorm, no activation). gated-residual-v2 §3.1:
  "The networks consist of a linear layer with 50 neurons, followed by d layers with 50 neurons
  each, and lastly a softmax layer." It is the default of the gated residual paper's families
  (mlp_plain, mlp_residual, mlp_gated_residual, mlp_augmented).
* ``stem="dense"``: Dot-BN-activation like every other plain layer (Dot-activation when norm="none";
  for mlp_highway, Dot-activation with BatchNorm only when stem_norm="batch"). It is mlp_highway's
  default: the highway paper's §3.1 nets start with "a regular fully-connected layer". It was this
  toolkit's only stem for the gated residual families before the `stem` argument existed; saved models and results
  that do not record a stem were built with it and load as ``stem="dense"``
  (`LEGACY_STEM`). results/mnist-depth keeps that study as the ablation row "first layer Dot-BN-ReLU".

Weights default to Glorot uniform with zero biases, the Keras default that the gated residual
MNIST experiments ran with.

Each registered factory spells out its whole signature, although the residual families share most
of it: the registry reads the signature (`ModelEntry.parameters`: `throughway list-models`, the
check of --model-arg names, the depth and input size a run fills in) and the API reference shows it,
so a reader sees every argument and its default where the model is named. The body they share is
`_residual`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..layers import (PlainBlock, ResidualBlock, VectorGate, augment, cait_layerscale_init, dense_highway_layer,
                      dense_unit, init_weights_)
from .base import MLP, check_positive_int
from .registry import register_model

__all__ = ["MLP", "HIGHWAY_PAPER_WIDTHS", "STEMS", "LEGACY_STEM", "MLP_FAMILIES", "GATE_FAMILY_MLPS", "make_stem",
           "with_legacy_stem"]

# Highway paper section 3.1: "each layer has 50 blocks for highway networks and 71 units for plain
# networks, yielding roughly identical numbers of parameters (≈ 5000) per layer".
HIGHWAY_PAPER_WIDTHS = {"mlp_plain": 71, "mlp_highway": 50}

# The first layer's kinds (module docstring). A saved MLP whose config has no "stem" was built
# before the argument existed, with the dense stem.
STEMS = ("linear", "dense")
LEGACY_STEM = "dense"
MLP_FAMILIES = ("mlp_plain", "mlp_residual", "mlp_gated_residual", "mlp_augmented", "mlp_highway")
# The gate families (ReZero, LayerScale) came after the `stem` argument; they never existed without a
# "stem", so they are not in MLP_FAMILIES
# (whose members load as LEGACY_STEM when the config records none).
GATE_FAMILY_MLPS = ("mlp_rezero", "mlp_layerscale")


def _check_common(depth: int, width: int, in_features: int, num_classes: int) -> None:
    for field, value, low in (("depth", depth, 0), ("width", width, 1), ("in_features", in_features, 1),
                              ("num_classes", num_classes, 2)):
        check_positive_int(field, value, low)


def _check_even(depth: int, name: str) -> None:
    if depth % 2:
        raise ValueError(
            f"{name}: depth={depth} must be even: depth is the paper's d, the number of middle layers, "
            f"and every residual block holds two of them (accepted: 0, 2, 4, ...)"
        )


def with_legacy_stem(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (a model.config, {"name": ..., **arguments}) with ``stem="dense"`` added when it names
    an MLP family and records no stem: files written before the argument existed were built so."""
    if config.get("name") in MLP_FAMILIES and "stem" not in config:
        return {**config, "stem": LEGACY_STEM}
    return dict(config)


def make_stem(stem: str, in_features: int, width: int, norm: str, activation: str,
              bn_momentum: float = 0.1, bn_eps: float = 1e-5) -> nn.Module:
    """The first layer: a single nn.Linear for stem="linear" (gated-residual-v2 §3.1), else
    `dense_unit` (Dot-BN-activation, or Dot-activation when norm="none")."""
    if stem == "linear":
        return nn.Linear(in_features, width)
    if stem == "dense":
        return dense_unit(in_features, width, norm, activation, bn_momentum, bn_eps)
    raise ValueError(f"stem={stem!r} is not known; accepted values: {list(STEMS)}")


@register_model("mlp_plain", "fully connected plain net: stem, d Dot-BN-ReLU layers, classifier (gated-residual-v2 §3.1; highway §3.1 with norm='none')")
def mlp_plain(
    depth: int = 2,
    width: int = 50,
    in_features: int = 784,
    num_classes: int = 10,
    norm: str = "batch",
    activation: str = "relu",
    init: str = "glorot_uniform",
    bn_momentum: float = 0.1,
    bn_eps: float = 1e-5,
    stem: str = "linear",
) -> MLP:
    """Plain net with `depth` middle Dot-BN-activation layers (norm="none": Dot-activation) after
    the first layer `stem` ("linear": a single Dot, the paper's; "dense": Dot-BN-activation)."""
    _check_common(depth, width, in_features, num_classes)
    stem_layer = make_stem(stem, in_features, width, norm, activation, bn_momentum, bn_eps)
    blocks = [PlainBlock(dense_unit(width, width, norm, activation, bn_momentum, bn_eps)) for _ in range(depth)]
    return init_weights_(MLP(stem_layer, blocks, nn.Linear(width, num_classes)), init)


def _residual(depth: int, width: int, in_features: int, num_classes: int, norm: str, activation: str,
              init: str, bn_momentum: float, bn_eps: float, gated: bool, k_init: float, gate_function: str, name: str,
              stem: str, vector_gate: bool = False) -> MLP:
    _check_common(depth, width, in_features, num_classes)
    _check_even(depth, name)
    stem_layer = make_stem(stem, in_features, width, norm, activation, bn_momentum, bn_eps)
    blocks = [
        ResidualBlock(
            nn.Sequential(dense_unit(width, width, norm, activation, bn_momentum, bn_eps),
                          dense_unit(width, width, norm, activation, bn_momentum, bn_eps)),
            gated=gated, k_init=k_init, gate_function=gate_function,
            gate=VectorGate(width, k_init, gate_function) if vector_gate else None,
        )
        for _ in range(depth // 2)
    ]
    return init_weights_(MLP(stem_layer, blocks, nn.Linear(width, num_classes)), init)


@register_model("mlp_residual", "fully connected ResNet: d/2 blocks u = f_r(x) + x of two Dot-BN-ReLU layers (gated-residual-v2 §3.1)")
def mlp_residual(
    depth: int = 2,
    width: int = 50,
    in_features: int = 784,
    num_classes: int = 10,
    norm: str = "batch",
    activation: str = "relu",
    init: str = "glorot_uniform",
    bn_momentum: float = 0.1,
    bn_eps: float = 1e-5,
    stem: str = "linear",
) -> MLP:
    """Residual net with depth/2 ungated blocks (depth even) after the first layer `stem`."""
    return _residual(depth, width, in_features, num_classes, norm, activation, init, bn_momentum, bn_eps,
                     gated=False, k_init=1.0, gate_function="relu", name="mlp_residual", stem=stem)


@register_model("mlp_gated_residual", "fully connected gated ResNet: d/2 blocks u = g(k)·f_r(x) + x, one scalar k per block (gated-residual-v2 §2.2)")
def mlp_gated_residual(
    depth: int = 2,
    width: int = 50,
    in_features: int = 784,
    num_classes: int = 10,
    norm: str = "batch",
    activation: str = "relu",
    init: str = "glorot_uniform",
    bn_momentum: float = 0.1,
    bn_eps: float = 1e-5,
    k_init: float = 1.0,
    gate_function: str = "relu",
    stem: str = "linear",
) -> MLP:
    """Gated residual net with depth/2 gated blocks after the first layer `stem`: exactly depth/2
    parameters more than mlp_residual."""
    return _residual(depth, width, in_features, num_classes, norm, activation, init, bn_momentum, bn_eps,
                     gated=True, k_init=k_init, gate_function=gate_function, name="mlp_gated_residual",
                     stem=stem)


@register_model("mlp_rezero", "fully connected ReZero net: d/2 blocks u = α·f_r(x) + x, one scalar α per block, α = 0 at the start (Bachlechner et al. 2020; norm='none': SkipInit, De & Smith 2020)")
def mlp_rezero(
    depth: int = 2,
    width: int = 50,
    in_features: int = 784,
    num_classes: int = 10,
    norm: str = "batch",
    activation: str = "relu",
    init: str = "glorot_uniform",
    bn_momentum: float = 0.1,
    bn_eps: float = 1e-5,
    k_init: float = 0.0,
    gate_function: str = "identity",
    stem: str = "linear",
) -> MLP:
    """ReZero net: depth/2 blocks u = α·f_r(x) + x after the first layer `stem`, α a scalar per block
    (the ScalarGate's k with g the identity, so α may turn negative) initialised at `k_init` = 0, so
    that every block starts as the identity (ReZero, Bachlechner et al. 2020, eq. 1 / §3). With
    norm="none" the branch has no BatchNorm: SkipInit's setting (De & Smith 2020, §4). The same
    parameter count as mlp_gated_residual: depth/2 more than mlp_residual."""
    return _residual(depth, width, in_features, num_classes, norm, activation, init, bn_momentum, bn_eps,
                     gated=True, k_init=k_init, gate_function=gate_function, name="mlp_rezero", stem=stem)


@register_model("mlp_layerscale", "fully connected LayerScale net: d/2 blocks u = diag(λ)·f_r(x) + x, one λ per channel, λ = ε at the start (Touvron et al. 2021 §3)")
def mlp_layerscale(
    depth: int = 2,
    width: int = 50,
    in_features: int = 784,
    num_classes: int = 10,
    norm: str = "batch",
    activation: str = "relu",
    init: str = "glorot_uniform",
    bn_momentum: float = 0.1,
    bn_eps: float = 1e-5,
    k_init: float | None = None,
    gate_function: str = "identity",
    stem: str = "linear",
) -> MLP:
    """LayerScale net: depth/2 blocks u = diag(λ)·f_r(x) + x after the first layer `stem`, λ a vector
    of `width` values per block (a VectorGate), all initialised at `k_init`; None (the default) takes
    CaiT's ε for the net's depth/2 residual blocks (`cait_layerscale_init`: 0.1 up to 18, 1e-5 up to
    24, 1e-6 beyond), counted as CaiT counts transformer layers and as `add_gates(..., "layerscale")`
    counts the blocks of any network, so both ways of building this net start alike.
    depth/2·width parameters more than mlp_residual. The resolved ε is recorded in
    model.config["k_init"] (`resolved_arguments`), so the model rebuilds exactly."""
    eps = cait_layerscale_init(depth // 2) if k_init is None else float(k_init)
    model = _residual(depth, width, in_features, num_classes, norm, activation, init, bn_momentum, bn_eps,
                      gated=True, k_init=eps, gate_function=gate_function, name="mlp_layerscale", stem=stem,
                      vector_gate=True)
    model.resolved_arguments = {"k_init": eps}  # type: ignore[assignment]  # create_model records it in config
    return model


@register_model("mlp_augmented", "fully connected plain net with every layer augmented: u = g(k)·f(x) + (1−g(k))·x (gated-residual-v1 §3)")
def mlp_augmented(
    depth: int = 2,
    width: int = 50,
    in_features: int = 784,
    num_classes: int = 10,
    norm: str = "batch",
    activation: str = "relu",
    init: str = "glorot_uniform",
    bn_momentum: float = 0.1,
    bn_eps: float = 1e-5,
    k_init: float = 1.0,
    gate_function: str = "relu",
    stem: str = "linear",
) -> MLP:
    """Plain net whose `depth` middle layers are each wrapped by `augment` (depth parameters more),
    after the first layer `stem`."""
    _check_common(depth, width, in_features, num_classes)
    stem_layer = make_stem(stem, in_features, width, norm, activation, bn_momentum, bn_eps)
    blocks = [augment(dense_unit(width, width, norm, activation, bn_momentum, bn_eps), k_init, gate_function)
              for _ in range(depth)]
    return init_weights_(MLP(stem_layer, blocks, nn.Linear(width, num_classes)), init)


@register_model("mlp_highway", "fully connected highway net: stem, d layers y = H(x)·T(x) + x·(1−T(x)), classifier (highway §3.1)")
def mlp_highway(
    depth: int = 2,
    width: int = 50,
    in_features: int = 784,
    num_classes: int = 10,
    activation: str = "relu",
    gate_bias: float = -2.0,
    stem_norm: str = "none",
    init: str = "glorot_uniform",
    stem: str = "dense",
) -> MLP:
    """Highway net: a plain first layer (stem="dense": Dot-activation, as in the highway paper;
    stem_norm="batch" adds BN; stem="linear": a single Dot), `depth` highway layers of `width`
    blocks with transform-gate bias `gate_bias`, a linear classifier.
    The highway paper's "10-layer" net is depth=9 (1 plain + 9 highway layers)."""
    _check_common(depth, width, in_features, num_classes)
    stem_layer = make_stem(stem, in_features, width, stem_norm, activation)
    blocks = [dense_highway_layer(width, activation, gate_bias) for _ in range(depth)]
    return init_weights_(MLP(stem_layer, blocks, nn.Linear(width, num_classes)), init)
