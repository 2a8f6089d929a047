"""``Linear``: the fully connected layer, ``y = x @ W + b`` as one addmm-style matmul op, and
weight tying (a Linear sharing another layer's parameter, e.g. an Embedding's table)."""

from __future__ import annotations

from everyo import EveryOError, Module, Parameter, dispatch
from everyo_layers.checks import argument, check_last_axis
from everyo_layers.embedding import is_embedding_table
from everyo_layers.initializers import fan_in_bound, layer_generator, uniform_parameter


class Linear(Module):
    """Fully connected layer: ``y = x @ weight + bias`` over the last axis.

    Args:
        in_features: size of the input's last axis.
        out_features: size of the output's last axis.
        bias: learn an additive bias.
        seed: seed of the initialisation (PyTorch's scheme: U(-1/sqrt(in), 1/sqrt(in))).

    Attributes:
        weight: Parameter of shape ``(in_features, out_features)`` (Keras's layout), or
            ``(out_features, in_features)`` after ``tie_weight`` of a table in PyTorch's layout
            (``weight_transposed`` is then True).
        bias: Parameter of shape ``(out_features,)`` or None.

    Weight tying: ``decoder.weight = other.weight`` shares a parameter of shape ``(in, out)``;
    ``decoder.tie_weight(encoder.weight)`` also shares an ``Embedding``'s ``(num, dim)`` table,
    used transposed (PyTorch's ``decoder.weight = encoder.weight``, which is refused here for
    an Embedding's table, square ones too, as its layout differs).

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

    def __setattr__(self, name: str, value) -> None:
        if name == "weight" and isinstance(value, Parameter) and "weight" in self.__dict__:
            if value.shape != (self.in_features, self.out_features):
                raise EveryOError(self._tie_refusal(value.shape, False))
            if is_embedding_table(value):  # square: the shape fits, the layout does not
                raise EveryOError(f"{self.label}: the Parameter is an Embedding's "
                                  f"(num_embeddings, embedding_dim) table, PyTorch's (out, in) "
                                  f"layout, not the weight's (in, out); tie it with "
                                  f"layer.tie_weight(encoder.weight, transposed=True)")
        super().__setattr__(name, value)
        if name == "weight":
            object.__setattr__(self, "weight_transposed", False)

    def tie_weight(self, shared: Parameter, transposed=None) -> "Linear":
        """Use ``shared`` (another layer's Parameter) as this layer's weight; returns self.

        ``shared`` of shape ``(in, out)`` is used as it is; of shape ``(out, in)`` (PyTorch's
        layout, as an ``Embedding``'s ``(num_embeddings, embedding_dim)`` table) transposed.
        For a square weight say which with ``transposed=True``/``False``. The tied parameter is
        trained and saved once, under its first name in ``state_dict``.

        Example:
            >>> import everyo as eo
            >>> encoder, decoder = eo.Embedding(10, 4), eo.Linear(4, 10)
            >>> decoder.tie_weight(encoder.weight)(eo.ones(2, 4)).shape
            (2, 10)
        """
        if not isinstance(shared, Parameter):
            raise EveryOError(f"{self.label}.tie_weight: expected a Parameter (e.g. "
                              f"encoder.weight), got {type(shared).__name__}")
        normal, flipped = (self.in_features, self.out_features), (self.out_features,
                                                                 self.in_features)
        if transposed is None and normal == flipped and shared.shape == normal:
            raise EveryOError(f"{self.label}.tie_weight: the weight is square "
                              f"{normal}, so its layout cannot be told from its shape: pass "
                              f"transposed=True for PyTorch's (out, in) layout (an Embedding's "
                              f"table), transposed=False for EveryO's (in, out)")
        if transposed is None:
            transposed = shared.shape == flipped
        if shared.shape != (flipped if transposed else normal):
            raise EveryOError(self._tie_refusal(shared.shape, True))
        Module.__setattr__(self, "weight", shared)
        object.__setattr__(self, "weight_transposed", bool(transposed))
        return self

    def _tie_refusal(self, shape: tuple, tying: bool) -> str:
        expected = (f"(in, out) = {(self.in_features, self.out_features)} or, transposed, "
                    f"(out, in) = {(self.out_features, self.in_features)}" if tying else
                    f"(in, out) = {(self.in_features, self.out_features)}")
        hint = ("" if tying else "; to share a table in PyTorch's (out, in) layout (an "
                "Embedding's weight) use layer.tie_weight(encoder.weight)")
        return (f"{self.label}: cannot tie a Parameter of shape {tuple(shape)} as the weight, "
                f"which must be {expected}{hint}")

    @property
    def label(self) -> str:
        return f"Linear({self.in_features}→{self.out_features})"

    def forward(self, x):
        check_last_axis(self.label, x, self.in_features)
        weight = (dispatch("transpose", self.weight, axes=(1, 0)) if self.weight_transposed
                  else self.weight)
        if self.bias is None:
            return dispatch("matmul", x, weight)
        return dispatch("matmul", x, weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


OPS: dict = {}
LAYERS = {"Linear": Linear}
