"""Weight initialisation schemes for the toolkit's layers, by name.

The gated residual MNIST experiments were run in Keras, whose Dense layers default to Glorot
(Xavier) uniform weights and zero biases; the highway paper uses "normalized initialization"
(Glorot). `init_weights_` applies a scheme to every Linear/Conv weight, zeroes their biases, then
restores every transform gate's constant bias (which must survive re-initialisation).
"""

from __future__ import annotations

from typing import TypeVar

from torch import nn

from .gates import TransformGate

M = TypeVar("M", bound=nn.Module)

__all__ = ["INIT_SCHEMES", "init_weights_"]

INIT_SCHEMES = ("glorot_uniform", "glorot_normal", "he_normal", "he_uniform", "torch_default")


def init_weights_(model: M, scheme: str = "glorot_uniform") -> M:
    """Initialise `model` in place with `scheme` (one of INIT_SCHEMES) and return it.

    "torch_default" keeps PyTorch's own Linear/Conv init (Kaiming uniform with a = √5, uniform
    bias). Every scheme leaves BatchNorm at weight 1, bias 0, and transform-gate biases at their
    constant `bias_init`.
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"init={scheme!r} is not known; accepted values: {list(INIT_SCHEMES)}")
    if scheme != "torch_default":
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                if scheme == "glorot_uniform":
                    nn.init.xavier_uniform_(module.weight)
                elif scheme == "glorot_normal":
                    nn.init.xavier_normal_(module.weight)
                elif scheme == "he_normal":
                    nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                else:
                    nn.init.kaiming_uniform_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, TransformGate):
            module.reset_bias()
    return model
