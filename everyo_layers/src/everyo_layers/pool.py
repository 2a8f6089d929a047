"""``MaxPool2D`` and ``AvgPool2D`` on NHWC input, and their ops ``max_pool2d``/``avg_pool2d``.

Both reduce over the pool's kh*kw kernel positions, each position being one view of the whole
batch: a reshape when the windows tile the input (no padding, stride == pool size, divisible
sizes), a strided slice of the padded input otherwise. No loop runs over pixels.

Max pooling's gradient is an op too, so that it can be differentiated again: with the winners
forward recorded, "scatter to the winners" (the gradient) and "gather the winners" are each
other's derivative.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo.kernels import kernel
from everyo_layers.checks import check_float
from everyo_layers.padding import output_size, resolve_padding
from everyo_layers.pool_kernels import pool_views
from everyo_layers.precision import accumulation_dtype
from everyo_layers.windows import (
    check_geometry,
    pad_hw,
    pad_hw_tensor,
    window_arguments,
    window_tensors,
)

_NO_PADS = ((0, 0), (0, 0))


def check_pool_pads(owner: str, padding, pads: tuple, pool: tuple) -> None:
    """Refuse pads as large as the pool: such a window could hold nothing but padding."""
    for (lo, hi), size in zip(pads, pool):
        if max(lo, hi) >= size:
            raise EveryOError(f"{owner}: padding {padding!r} resolves to {pads}; each pad "
                              f"must be smaller than the pool size {pool}")


class _Windows:
    """The kernel-position views of an NHWC array for one pooling geometry."""

    __slots__ = ("pool", "stride", "pads", "out_hw", "tiled")

    def __init__(self, op: str, x: np.ndarray, pool, stride, padding):
        # NOTE: called directly (eo.max_pool2d) the op takes the layer's forms; stride
        # defaults to the pool size, as the layers and PyTorch do.
        pool, stride, pads, _ = window_arguments(op, x, pool, pool if stride is None else stride,
                                                 padding)
        check_pool_pads(op, padding, pads, pool)
        n, h, w, c = shape = x.shape
        self.pool, self.stride, self.pads = pool, stride, pads
        self.out_hw = (output_size(h, pool[0], stride[0], 1, pads[0]),
                       output_size(w, pool[1], stride[1], 1, pads[1]))
        if min(self.out_hw) <= 0:
            raise EveryOError(f"pooling: a {pool[0]}x{pool[1]} window does not fit input "
                              f"{shape} with padding {pads}")
        self.tiled = (pads == _NO_PADS and stride == pool
                      and h == self.out_hw[0] * pool[0] and w == self.out_hw[1] * pool[1])

    def views(self, padded: np.ndarray):
        """One ``(N, Ho, Wo, C)`` view per kernel position (writable if ``padded`` is)."""
        return pool_views(padded, self.pool, self.stride, self.out_hw, self.tiled)

    def padded_shape(self, shape: tuple) -> tuple:
        (top, bottom), (left, right) = self.pads
        return shape[0], shape[1] + top + bottom, shape[2] + left + right, shape[3]

    def crop(self, padded: np.ndarray, shape: tuple) -> np.ndarray:
        (top, _), (left, _) = self.pads
        return padded[:, top:top + shape[1], left:left + shape[2], :]


class MaxPool2DOp(Op):
    """Maximum over each window; padding counts as -inf. Gradient to the first maximum of each
    window (PyTorch's choice when values tie, e.g. the zeros after a ReLU)."""

    __slots__ = ("windows", "x_shape")

    def forward(self, x, pool_size=(2, 2), stride=None, padding=_NO_PADS):
        self.windows = windows = _Windows("max_pool2d", x, pool_size, stride, padding)
        self.x_shape = x.shape
        # NOTE: the winner (the kernel position of each window's first maximum, one byte per
        # output) is all backward needs: the max_pool2d_forward kernel (pool_kernels.py).
        out, self.saved = kernel.max_pool2d_forward(x, windows.pool, windows.stride,
                                                    windows.pads, windows.out_hw, windows.tiled)
        return out

    def backward(self, g):
        return (scatter_to_winners(self.windows, self.x_shape, self.saved, g),)

    def backward_graph(self, g, out):
        return (MaxPoolScatterOp.apply(g, winners=_Winners(self)),)

    def composite(self, x):
        """Each window's winning element (as recorded by forward) with differentiable ops."""
        w = self.windows
        views = window_tensors(pad_hw_tensor(x, w.pads, -np.inf), w.pool, w.stride, (1, 1),
                               w.out_hw)
        out = None
        for position, view in enumerate(views):
            picked = dispatch("where", self.saved == position, view, 0.0)
            out = picked if out is None else out + picked
        return out


def scatter_to_winners(windows: _Windows, x_shape: tuple, winner: np.ndarray,
                       g: np.ndarray) -> np.ndarray:
    """Each window's gradient ``g`` placed on the element that won it (``winner`` holds the
    winning kernel position per output); the input's gradient, of ``x_shape``."""
    w = windows  # (the max_pool2d_backward kernel, pool_kernels.py)
    return kernel.max_pool2d_backward(g, winner, x_shape, w.pool, w.stride, w.pads, w.out_hw,
                                      w.tiled)


def gather_winners(windows: _Windows, winner: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The element of ``x`` that won each window (max pooling with the winners fixed)."""
    views = windows.views(pad_hw(x, windows.pads, value=0))
    out = np.zeros(views[0].shape, x.dtype)
    for position, view in enumerate(views):
        np.copyto(out, view, where=winner == position)
    return out


class _Winners:
    """What max pooling's gradient ops read (windows, input shape, winners), kept by them so
    that they still work after the pooling op's graph was freed."""

    __slots__ = ("windows", "x_shape", "winner")

    def __init__(self, pool: MaxPool2DOp) -> None:
        self.windows, self.x_shape, self.winner = pool.windows, pool.x_shape, pool.saved

    def scatter(self, g: np.ndarray) -> np.ndarray:
        return scatter_to_winners(self.windows, self.x_shape, self.winner, g)

    def gather(self, x: np.ndarray) -> np.ndarray:
        return gather_winners(self.windows, self.winner, x)


class MaxPoolScatterOp(Op):
    """Each window's gradient placed on the element that won it (max pooling's backward)."""

    __slots__ = ("winners",)
    name = "max_pool2d_backward"
    saved_inputs = ()
    saves_output = False

    def forward(self, g, winners):
        self.winners = winners
        return winners.scatter(g)

    def backward(self, h):
        return (self.winners.gather(h),)

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
        return winners.gather(x)

    def backward(self, g):
        return (self.winners.scatter(g),)

    def backward_graph(self, g, out):
        return (MaxPoolScatterOp.apply(g, winners=self.winners),)


class AvgPool2DOp(Op):
    """Mean over each window, excluding padding from the count (as Keras) unless
    ``count_include_pad`` (PyTorch's default: padded zeros count)."""

    __slots__ = ("windows", "x_shape", "dtype", "count_include_pad")

    def forward(self, x, pool_size=(2, 2), stride=None, padding=_NO_PADS,
                count_include_pad=False):
        self.windows = windows = _Windows("avg_pool2d", x, pool_size, stride, padding)
        self.x_shape, self.dtype = x.shape, x.dtype
        self.count_include_pad = bool(count_include_pad)
        accumulate = accumulation_dtype(x.dtype)  # float16 sums in float32
        total = None
        for view in windows.views(pad_hw(x, windows.pads)):
            total = view.astype(accumulate) if total is None else np.add(total, view, out=total)
        count = self._count()
        self.saved = count
        return (total / count).astype(x.dtype, copy=False)

    def _count(self):
        """How many real (unpadded) elements each window holds, shaped to broadcast."""
        if self.windows.pads == _NO_PADS or self.count_include_pad:
            return np.float32(self.windows.pool[0] * self.windows.pool[1])
        ones = pad_hw(np.ones((1,) + self.x_shape[1:3] + (1,), np.float32), self.windows.pads)
        count = None
        for view in self.windows.views(ones):
            count = view.copy() if count is None else count + view
        return count

    def backward(self, g):
        share = (g / self.saved).astype(g.dtype, copy=False)
        windows = self.windows
        if windows.tiled:
            grad = np.empty(self.x_shape, dtype=g.dtype)
            for target in windows.views(grad):
                target[...] = share
            return (grad,)
        grad = np.zeros(windows.padded_shape(self.x_shape), dtype=g.dtype)
        for target in windows.views(grad):
            target += share
        return (windows.crop(grad, self.x_shape),)

    def composite(self, x):
        """The window sums divided by the real-element counts, with differentiable ops."""
        w = self.windows
        total = None
        for view in window_tensors(pad_hw_tensor(x, w.pads, 0.0), w.pool, w.stride, (1, 1),
                                   w.out_hw):
            total = view if total is None else total + view
        return total / self.saved


class _Pool2D(Module):
    op_name = ""

    def __init__(self, pool_size=2, stride=None, padding="valid"):
        super().__init__()
        name = type(self).__name__
        self.pool_size, self.stride, _ = check_geometry(
            name, pool_size, pool_size if stride is None else stride, kernel_name="pool_size")
        pads = resolve_padding(padding, (1, 1), self.pool_size)  # validate the form early
        if not isinstance(padding, str):  # "same" pads are always smaller than the pool
            check_pool_pads(name, padding, pads, self.pool_size)
        self.padding = padding

    @property
    def label(self) -> str:
        return f"{type(self).__name__}{self.pool_size}"

    def forward(self, x):
        return self.pool(x)

    def pool(self, x, **attrs):
        data = check_float(self.label, x)
        if data.ndim != 4:
            raise EveryOError(f"{self.label}: expected NHWC input (4 axes), got shape "
                              f"{data.shape}")
        pads = resolve_padding(self.padding, data.shape[1:3], self.pool_size, self.stride)
        return dispatch(self.op_name, x, pool_size=self.pool_size, stride=self.stride,
                        padding=pads, **attrs)

    def extra_repr(self) -> str:
        return f"pool_size={self.pool_size}, stride={self.stride}, padding={self.padding!r}"


class MaxPool2D(_Pool2D):
    """Maximum over ``pool_size`` windows of NHWC input (stride defaults to the pool size).

    Example:
        >>> import everyo as eo
        >>> eo.MaxPool2D(2)(eo.arange(16.0).reshape(1, 4, 4, 1)).data[0, :, :, 0]
        array([[ 5.,  7.],
               [13., 15.]], dtype=float32)
    """

    op_name = "max_pool2d"


class AvgPool2D(_Pool2D):
    """Mean over ``pool_size`` windows of NHWC input; padded positions are not counted unless
    ``count_include_pad=True`` (then every window divides by the full pool area, as PyTorch's
    default).

    Example:
        >>> import everyo as eo
        >>> eo.AvgPool2D(2)(eo.arange(16.0).reshape(1, 4, 4, 1)).data[0, :, :, 0]
        array([[ 2.5,  4.5],
               [10.5, 12.5]], dtype=float32)
    """

    op_name = "avg_pool2d"

    def __init__(self, pool_size=2, stride=None, padding="valid", count_include_pad=False):
        super().__init__(pool_size, stride, padding)
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x):
        return self.pool(x, count_include_pad=self.count_include_pad)


OPS = {"max_pool2d": MaxPool2DOp, "avg_pool2d": AvgPool2DOp}
LAYERS = {"MaxPool2D": MaxPool2D, "AvgPool2D": AvgPool2D}
