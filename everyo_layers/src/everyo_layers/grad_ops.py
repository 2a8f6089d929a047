"""The gradients of conv2d and max_pool2d as ops, so that they can be differentiated again.

A convolution's gradients are convolutions too: with one geometry (stride, padding, dilation,
shapes), ``conv2d(x, w)``, its input gradient ``T(g, w)`` and its weight gradient ``W(x, g)``
are three bilinear maps, each of whose derivatives is one of the three. The same holds for max
pooling with the winners forward recorded: "gather the winners" and "scatter to the winners"
are each other's derivative. These ops run the fused kernels (no window-by-window graph),
which keeps a gradient penalty on a CNN within a small factor of a first-order step.
"""

from __future__ import annotations

import numpy as np

from everyo import Op, dispatch
from everyo_layers.conv import pad_hw


def _convolve(conv, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    kh, kw, cin, cout = conv.w_shape
    n, (ho, wo) = x.shape[0], conv.out_hw
    return (conv._columns(x) @ w.reshape(kh * kw * cin, cout)).reshape(n, ho, wo, cout)


def _input_grad(conv, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    kh, kw, cin, cout = conv.w_shape
    return conv._input_grad(g.reshape(-1, cout), w.reshape(kh * kw * cin, cout))


def _columns(conv, x: np.ndarray) -> np.ndarray:
    """The window matrix of ``x``; the one the conv op kept for its own backward when ``x`` is
    that op's input (gathering it is a large share of a convolution's cost)."""
    saved = conv.saved
    if (type(saved) is tuple and saved[0] is not None and conv.parents is not None
            and x is conv.parents[0].data and saved[0].dtype == x.dtype
            and saved[0].ndim == 2):
        return saved[0]
    return conv._columns(x)


def _weight_grad(conv, x: np.ndarray, g: np.ndarray, columns=None) -> np.ndarray:
    columns = _columns(conv, x) if columns is None else columns
    return (columns.T @ g.reshape(-1, g.shape[-1])).reshape(conv.w_shape)


def conv2d_like(conv, x, w):
    """``conv2d(x, w)`` (Tensors) with the geometry of the recorded conv2d op ``conv``."""
    return dispatch("conv2d", x, w, stride=conv.stride, padding=conv.pads,
                    dilation=conv.dilation)


class Conv2DInputGradOp(Op):
    """``T(g, w)``: the input gradient of the convolution ``conv`` (a transposed convolution)."""

    __slots__ = ("conv",)
    name = "conv2d_input_grad"
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, g, w, conv):
        self.conv, self.saved = conv, (g, w)
        return _input_grad(conv, g, w)

    def backward(self, h):
        g, w = self.saved
        need_g, need_w = self.needs_input_grad
        return (_convolve(self.conv, h, w) if need_g else None,
                _weight_grad(self.conv, h, g) if need_w else None)

    def backward_graph(self, h, out):
        g, w = self.parents
        need_g, need_w = self.needs_input_grad
        return (conv2d_like(self.conv, h, w) if need_g else None,
                Conv2DWeightGradOp.apply(h, g, conv=self.conv) if need_w else None)


class Conv2DWeightGradOp(Op):
    """``W(x, g)``: the weight gradient of the convolution ``conv``."""

    __slots__ = ("conv",)
    name = "conv2d_weight_grad"
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, x, g, conv):
        columns = _columns(conv, x)
        self.conv, self.saved = conv, (x, g, columns)
        return _weight_grad(conv, x, g, columns)

    def backward(self, h):
        x, g, columns = self.saved
        need_x, need_g = self.needs_input_grad
        kh, kw, cin, cout = self.conv.w_shape
        n, (ho, wo) = x.shape[0], self.conv.out_hw
        return (_input_grad(self.conv, g, h) if need_x else None,
                (columns @ h.reshape(kh * kw * cin, cout)).reshape(n, ho, wo, cout)
                if need_g else None)

    def backward_graph(self, h, out):
        x, g = self.parents
        need_x, need_g = self.needs_input_grad
        return (Conv2DInputGradOp.apply(g, h, conv=self.conv) if need_x else None,
                conv2d_like(self.conv, x, h) if need_g else None)


def conv2d_backward_graph(conv, g):
    """The differentiable gradients of the recorded conv2d op ``conv`` for output gradient
    ``g``: one Tensor (or None) per operand."""
    x, w = conv.parents[:2]
    needs = conv.needs_input_grad
    gx = Conv2DInputGradOp.apply(g, w, conv=conv) if needs[0] else None
    gw = Conv2DWeightGradOp.apply(x, g, conv=conv) if needs[1] else None
    gb = dispatch("sum", g, axis=(0, 1, 2)) if len(needs) > 2 and needs[2] else None
    return gx, gw, gb


class _Winners:
    """What MaxPool2DOp.backward reads (windows, input shape, winners), kept by the gradient
    ops so that they still work after the pooling op's graph was freed."""

    __slots__ = ("windows", "x_shape", "saved")

    def __init__(self, pool) -> None:
        self.windows, self.x_shape, self.saved = pool.windows, pool.x_shape, pool.saved


def _gather(winners: _Winners, x: np.ndarray) -> np.ndarray:
    views = winners.windows.views(pad_hw(x, winners.windows.pads, value=0))
    out = np.zeros(views[0].shape, x.dtype)
    for position, view in enumerate(views):
        np.copyto(out, view, where=winners.saved == position)
    return out


def _scatter(winners: _Winners, g: np.ndarray) -> np.ndarray:
    from everyo_layers.pool import MaxPool2DOp

    return MaxPool2DOp.backward(winners, g)[0]


class MaxPoolScatterOp(Op):
    """Each window's gradient placed on the element that won it (max pooling's backward)."""

    __slots__ = ("winners",)
    name = "max_pool2d_backward"
    saved_inputs = ()
    saves_output = False

    def forward(self, g, winners):
        self.winners = winners
        return _scatter(winners, g)

    def backward(self, h):
        return (_gather(self.winners, h),)

    def backward_graph(self, h, out):
        return (MaxPoolGatherOp.apply(h, winners=self.winners),)


class MaxPoolGatherOp(Op):
    """The element that won each window (max pooling with the winners fixed)."""

    __slots__ = ("winners",)
    name = "max_pool2d_gather"
    saved_inputs = ()
    saves_output = False

    def forward(self, x, winners):
        self.winners = winners
        return _gather(winners, x)

    def backward(self, g):
        return (_scatter(self.winners, g),)

    def backward_graph(self, g, out):
        return (MaxPoolScatterOp.apply(g, winners=self.winners),)


def max_pool2d_backward_graph(pool, g):
    """The differentiable input gradient of the recorded max_pool2d op ``pool``."""
    return (MaxPoolScatterOp.apply(g, winners=_Winners(pool)),)
