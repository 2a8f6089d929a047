"""``Linear``: the fully connected layer, ``y = x @ W + b`` as one addmm-style matmul op."""

from __future__ import annotations

from everyo import Module, dispatch
from everyo_layers.checks import argument, check_last_axis
from everyo_layers.initializers import fan_in_bound, layer_generator, uniform_parameter


class Linear(Module):
    """Fully connected layer: ``y = x @ weight + bias`` over the last axis.

    Args:
        in_features: size of the input's last axis.
        out_features: size of the output's last axis.
        bias: learn an additive bias.
        seed: seed of the initialisation (PyTorch's scheme: U(-1/sqrt(in), 1/sqrt(in))).

    Attributes:
        weight: Parameter of shape ``(in_features, out_features)`` (Keras's layout).
        bias: Parameter of shape ``(out_features,)`` or None.

    Example:
        >>> import everyo as eo
        >>> layer = eo.Linear(3, 2, seed=0)
        >>> layer(eo.ones(4, 3)).shape, layer.weight.shape
        ((4, 2), (3, 2))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, seed=None):
        super().__init__()
        self.in_features = argument("Linear", "in_features", in_features, "positive int")
        self.out_features = argument("Linear", "out_features", out_features, "positive int")
        rng = layer_generator(seed)
        bound = fan_in_bound(self.in_features)
        self.weight = uniform_parameter(rng, (self.in_features, self.out_features), bound)
        self.bias = uniform_parameter(rng, (self.out_features,), bound) if bias else None

    @property
    def label(self) -> str:
        return f"Linear({self.in_features}→{self.out_features})"

    def forward(self, x):
        check_last_axis(self.label, x, self.in_features)
        if self.bias is None:
            return dispatch("matmul", x, self.weight)
        return dispatch("matmul", x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


OPS: dict = {}
LAYERS = {"Linear": Linear}
