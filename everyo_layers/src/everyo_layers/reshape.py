"""``Flatten``: every axis but the first into one, row-major (over H, W, C for NHWC); or
PyTorch's ``start_dim``..``end_dim``."""

from __future__ import annotations

import math

from everyo import EveryOError, Module, dispatch
from everyo_layers.checks import argument, array_of


class Flatten(Module):
    """Flatten axes ``start_dim`` to ``end_dim`` into one, PyTorch's ``nn.Flatten``: by
    default all axes but the batch axis, ``(N, H, W, C) -> (N, H*W*C)``.

    Example:
        >>> import everyo as eo
        >>> eo.Flatten()(eo.zeros(2, 3, 4, 5)).shape
        (2, 60)
        >>> eo.Flatten(0, 1)(eo.zeros(2, 3, 4)).shape
        (6, 4)
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = argument("Flatten", "start_dim", start_dim, "int")
        self.end_dim = argument("Flatten", "end_dim", end_dim, "int")

    def forward(self, x):
        data = array_of(x)
        if (self.start_dim, self.end_dim) == (1, -1):
            if data.ndim < 1:
                raise EveryOError(f"Flatten: expected input with a batch axis, got shape "
                                  f"{data.shape}")
            return dispatch("reshape", x, shape=(data.shape[0], -1))
        rank = max(data.ndim, 1)
        start, end = (d + rank if d < 0 else d for d in (self.start_dim, self.end_dim))
        if not 0 <= start <= end < rank:
            raise EveryOError(f"Flatten: start_dim={self.start_dim}, end_dim={self.end_dim} do "
                              f"not fit an input of shape {data.shape}")
        shape = data.shape[:start] + (math.prod(data.shape[start:end + 1]),) + \
            data.shape[end + 1:]
        return dispatch("reshape", x, shape=shape)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


OPS: dict = {}
LAYERS = {"Flatten": Flatten}
