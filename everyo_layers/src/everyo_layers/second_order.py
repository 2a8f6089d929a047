"""What the layers' fused ops need to be differentiated twice.

Each fused op (conv2d, pools, gelu, norms, losses, attention weights, embedding, dropout) has
a ``composite`` method: its forward written with differentiable EveryO ops, which the engine
differentiates when a gradient must itself be differentiable (``create_graph=True``). The
pieces those methods share live here. The fused recurrent ops have none: a second derivative
through them raises an error naming the op.
"""

from __future__ import annotations

import math

import numpy as np

from everyo import Op, dispatch

_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class NormalCDFOp(Op):
    """``Phi(x) = (1 + erf(x / sqrt 2)) / 2``, the standard normal CDF (GELU's gate)."""

    __slots__ = ()
    name = "normal_cdf"
    saved_inputs = (0,)
    saves_output = False

    def forward(self, x):
        from everyo_layers.activation import _erf

        self.saved = x
        return 0.5 * (1 + _erf(x * _INV_SQRT_2))

    def backward(self, g):
        x = self.saved
        return (g * (_INV_SQRT_2PI * np.exp(-0.5 * x * x)),)

    def backward_graph(self, g, out):
        (x,) = self.parents
        return (g * dispatch("exp", x * x * -0.5) * _INV_SQRT_2PI,)


def reduce_loss(loss, reduction: str, count):
    """A per-element loss Tensor reduced as the loss ops do (``mean`` divides by ``count``)."""
    if reduction == "none":
        return loss
    total = dispatch("sum", loss)
    return total / float(count) if reduction == "mean" else total


def spread_tensor(g, reduction: str, count, shape: tuple):
    """A loss op's output gradient (Tensor) spread over its per-element losses of ``shape``."""
    if reduction == "none":
        return g
    from everyo.kernels import broadcast_tensor

    return broadcast_tensor(g / float(count) if reduction == "mean" else g, shape)


def gather_last(t, index: np.ndarray):
    """``t[..., index]`` per position: the entry of the last axis ``index`` names."""
    full = tuple(np.indices(index.shape, sparse=True)) + (index,)
    return dispatch("getitem", t, index=full)


def softplus_neg(x):
    """``log(1 + exp(-x))``, stable and smooth everywhere (so its derivatives are right at 0)."""
    pair = dispatch("stack", x, x * 0.0, axis=-1)  # log(1 + e^-x) = -log_softmax([x, 0])[0]
    return -dispatch("getitem", dispatch("log_softmax", pair, axis=-1), index=(Ellipsis, 0))


def pad_hw_tensor(x, pads: tuple, value: float):
    """NHWC Tensor ``x`` padded on H and W by ``((top, bottom), (left, right))``."""
    if not any(pads[0] + pads[1]):
        return x
    return dispatch("pad", x, pad_width=((0, 0), pads[0], pads[1], (0, 0)), value=value)


def window_tensors(padded, kernel: tuple, stride: tuple, dilation: tuple, out_hw: tuple) -> list:
    """One ``(N, Ho, Wo, C)`` Tensor per kernel position: the elements it meets in each window."""
    from everyo_layers.windows import window_slices

    return [dispatch("getitem", padded, index=window_slices((i, j), stride, dilation, out_hw))
            for i in range(kernel[0]) for j in range(kernel[1])]
