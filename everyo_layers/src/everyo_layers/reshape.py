"""``Flatten``: every axis but the first into one, row-major (over H, W, C for NHWC)."""

from __future__ import annotations

from everyo import EveryOError, Module, dispatch
from everyo_layers.checks import array_of


class Flatten(Module):
    """Flatten all axes but the batch axis: ``(N, H, W, C) -> (N, H*W*C)``.

    Example:
        >>> import everyo as eo
        >>> eo.Flatten()(eo.zeros(2, 3, 4, 5)).shape
        (2, 60)
    """

    def forward(self, x):
        data = array_of(x)
        if data.ndim < 1:
            raise EveryOError(f"Flatten: expected input with a batch axis, got shape {data.shape}")
        return dispatch("reshape", x, shape=(data.shape[0], -1))


OPS: dict = {}
LAYERS = {"Flatten": Flatten}
