"""``gather`` (PyTorch's: pick along one axis by an index tensor) and its adjoint
``scatter_add``; each is the other's gradient, so both have derivatives of every order."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.axes import check_axis
from everyo.dispatch import dispatch
from everyo.errors import EveryOError
from everyo.tensor import Tensor


def gather_index(index: np.ndarray, axis: int, shape: tuple, op: str) -> tuple:
    """The NumPy advanced index that reads ``out[i, j, k] = x[i, index[i, j, k], k]`` (for
    ``axis=1``); ``index`` may be smaller than ``x`` along the other axes, as in PyTorch."""
    index = np.asarray(index)
    if index.dtype.kind not in "iu":
        raise EveryOError(f"{op}: index must hold integers, got {index.dtype}")
    if index.ndim != len(shape):
        raise EveryOError(f"{op}: index has {index.ndim} axes, the tensor {len(shape)} "
                          f"(shape {shape})")
    axis = check_axis(axis, len(shape), op, shape)
    for d, (n, m) in enumerate(zip(index.shape, shape)):
        if d != axis and n > m:
            raise EveryOError(f"{op}: index shape {index.shape} is larger than the tensor's "
                              f"{shape} along axis {d}")
    # NOTE: negative values are refused as PyTorch does (NumPy would wrap them around)
    if index.size and (index.min() < 0 or index.max() >= shape[axis]):
        raise EveryOError(f"{op}: index values must be in [0, {shape[axis]}) along axis "
                          f"{axis}, got [{index.min()}, {index.max()}]")
    grid: list = list(np.indices(index.shape, sparse=True))
    grid[axis] = index
    return tuple(grid)


class Gather(Op):
    """``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``axis``."""

    __slots__ = ("shape", "axis", "index")
    saved_inputs, saves_output, saved_attributes = (), False, ("index",)

    def forward(self, x, axis, index):
        self.shape, self.axis = x.shape, axis
        # NOTE: not hasattr(index, "data"): an ndarray's .data is a memoryview, and the array
        # made from it would hide the index's storage from the version check
        self.index = np.asarray(index.data if isinstance(index, Tensor) else index)
        return x[gather_index(self.index, axis, x.shape, "gather")]

    def backward(self, g):
        grad = np.zeros(self.shape, g.dtype)
        np.add.at(grad, gather_index(self.index, self.axis, self.shape, "gather"), g)
        return (grad,)

    def backward_graph(self, g, out):
        return (dispatch("scatter_add", g, axis=self.axis, index=self.index, shape=self.shape),)


class ScatterAdd(Op):
    """Zeros of ``shape`` into which ``src`` is added at ``index`` along ``axis``."""

    __slots__ = ("axis", "index")
    saved_inputs, saves_output, saved_attributes = (), False, ("index",)

    def forward(self, src, axis, index, shape):
        self.axis, self.index = axis, np.asarray(index.data if isinstance(index, Tensor) else index)
        if self.index.shape != src.shape:
            raise EveryOError(f"scatter_add: index shape {self.index.shape} differs from the "
                              f"source's {src.shape}")
        out = np.zeros(shape, src.dtype)
        np.add.at(out, gather_index(self.index, axis, tuple(shape), "scatter_add"), src)
        return out

    def backward(self, g):
        return (g[gather_index(self.index, self.axis, g.shape, "scatter_add")],)

    def backward_graph(self, g, out):
        return (dispatch("gather", g, axis=self.axis, index=self.index),)


OPS = {"gather": Gather, "scatter_add": ScatterAdd}
