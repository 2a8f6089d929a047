"""Batched matrix multiplication, optionally fused with a bias (addmm-style)."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op, unbroadcast
from everyo.dispatch import dispatch
from everyo.dtypes import HALF_DTYPES, result_dtype
from everyo.errors import EveryOError
from everyo.half_precision import narrow, widen
from everyo.ops.graph_math import swap_last, unbroadcast_tensor


def blas_matmul(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``a @ b (+ bias)``; 16-bit operands multiply through float32 BLAS and round once.

    NOTE: NumPy has no float16 or bfloat16 BLAS path (its float16 matmul is a slow scalar
    loop). Rounding the inputs to 16 bits, accumulating in float32 (bias included) and rounding
    the result once is what GPU tensor cores do, and is at least as accurate as accumulating in
    16 bits.
    """
    if a.dtype in HALF_DTYPES or b.dtype in HALF_DTYPES:
        out_dtype = result_dtype(a, b) if bias is None else result_dtype(a, b, bias)
        out = np.matmul(widen(a), widen(b))
        if bias is not None:
            bias = widen(bias)
            wider = bias.dtype.itemsize > out.dtype.itemsize  # a float64 bias widens the result
            out = out + bias if wider else np.add(out, bias, out=out)
        return narrow(out, out_dtype)
    out = np.matmul(a, b)
    return out if bias is None else out + bias


def _check_shapes(a: np.ndarray, b: np.ndarray) -> None:
    if a.ndim == 0 or b.ndim == 0:
        raise EveryOError(f"matmul: {a.shape} @ {b.shape}: operands must have at least 1 dimension")
    inner_a, inner_b = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
    if inner_a != inner_b:
        raise EveryOError(f"matmul: {a.shape} @ {b.shape}: inner dimensions "
                          f"{inner_a} and {inner_b} differ")


class MatMul(Op):
    """``a @ b (+ bias)``. With a bias the whole affine map is one op, so a precision policy
    casting matmul's operands sees the bias too."""

    precision = "lower"  # BLAS-shaped: float16 is safe, products accumulate in float32
    __slots__ = ("bias_shape",)
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, a, b, bias=None):
        _check_shapes(a, b)
        # NOTE: 1-D operands follow NumPy: promote to a matrix, drop the axis afterwards.
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        self.saved = (a, b)
        if bias is not None:
            self.bias_shape = bias.shape
            if a.ndim > 1 and b.ndim > 1:  # the common (addmm) case: bias fused before rounding
                return blas_matmul(a, b, bias)
        out = blas_matmul(a2, b2)
        if b.ndim == 1:
            out = out[..., 0]
        if a.ndim == 1:
            out = out[..., 0, :] if b.ndim > 1 else out[..., 0]
        return out if bias is None else out + bias

    def backward(self, g):
        needs = self.needs_input_grad
        a2, b2, g2 = self._matrices(g)
        return (self._a_grad(a2, b2, g2) if needs[0] else None,
                self._b_grad(a2, b2, g2) if needs[1] else None,
                unbroadcast(g, self.bias_shape) if len(needs) > 2 and needs[2] else None)

    def backward_parts(self, g):
        # NOTE: the bias, then b (a Linear layer's weight), then a: a weight's gradient is
        # final, and can be sent by data-parallel training, before the input's is computed.
        needs = self.needs_input_grad
        if len(needs) > 2 and needs[2]:
            yield 2, unbroadcast(g, self.bias_shape)
        a2, b2, g2 = self._matrices(g)
        if needs[1]:
            yield 1, self._b_grad(a2, b2, g2)
        if needs[0]:
            yield 0, self._a_grad(a2, b2, g2)

    def _matrices(self, g) -> tuple:
        """The saved operands and ``g`` with 1-D operands promoted to matrices, as forward
        promoted them."""
        a, b = self.saved
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        if b.ndim == 1:
            g = g[..., None]
        if a.ndim == 1:
            g = np.expand_dims(g, -2)
        return a2, b2, g

    def _a_grad(self, a2, b2, g2) -> np.ndarray:
        a = self.saved[0]
        ga = unbroadcast(blas_matmul(g2, np.swapaxes(b2, -1, -2)), a2.shape)
        return ga.reshape(a.shape) if ga.shape != a.shape else ga

    def _b_grad(self, a2, b2, g2) -> np.ndarray:
        b = self.saved[1]
        if b2.ndim == 2 and a2.ndim > 2:
            # NOTE: one big GEMM over the flattened batch instead of a batched product.
            # (explicit row counts: reshape(-1, 0) is ambiguous when the inner size is 0)
            rows = a2.size // a2.shape[-1] if a2.shape[-1] else int(np.prod(a2.shape[:-1]))
            gb = blas_matmul(a2.reshape(rows, a2.shape[-1]).T, g2.reshape(rows, g2.shape[-1]))
        else:
            gb = unbroadcast(blas_matmul(np.swapaxes(a2, -1, -2), g2), b2.shape)
        # NOTE: a same-shape reshape is a view, which the engine would copy again before
        # storing it in a leaf's .grad
        return gb.reshape(b.shape) if gb.shape != b.shape else gb

    def backward_graph(self, g, out):
        a, b = self.parents[:2]
        na, nb = self.needs_input_grad[:2]
        ga = gb = gbias = None
        a2 = a.reshape((1,) + a.shape) if a.ndim == 1 else a
        b2 = b.reshape(b.shape + (1,)) if b.ndim == 1 else b
        g2 = g
        if b.ndim == 1:
            g2 = g2.reshape(g2.shape + (1,))
        if a.ndim == 1:
            g2 = g2.reshape(g2.shape[:-1] + (1,) + g2.shape[-1:])
        if na:
            ga = unbroadcast_tensor(dispatch("matmul", g2, swap_last(b2)), a2.shape)
            ga = ga.reshape(a.shape)
        if nb:
            gb = unbroadcast_tensor(dispatch("matmul", swap_last(a2), g2), b2.shape)
            gb = gb.reshape(b.shape)
        if len(self.needs_input_grad) > 2 and self.needs_input_grad[2]:
            gbias = unbroadcast_tensor(g, self.bias_shape)
        return ga, gb, gbias


OPS = {"matmul": MatMul}
