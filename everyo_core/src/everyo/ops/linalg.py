"""Batched matrix multiplication, optionally fused with a bias (addmm-style)."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op, unbroadcast
from everyo.dispatch import dispatch
from everyo.dtypes import FLOAT32, HALF_DTYPES, result_dtype
from everyo.errors import EveryOError
from everyo.grad_rows import row_block_stops
from everyo.half_precision import narrow, rounded_float32, widen
from everyo.ops.graph_math import swap_last, unbroadcast_tensor
from everyo.versioning import check_operand_unchanged


def blas_matmul(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None,
                out_dtype: np.dtype | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b (+ bias)``; 16-bit operands multiply through float32 BLAS and round once.

    ``out_dtype`` forces that path and the result's dtype: for float32 operands that stand for
    16-bit values (see ``MatMul``'s ``lower``); ``FLOAT32`` returns the unrounded product.
    ``out``: write the product into this array (NumPy's ``out=``, e.g. a block of rows of a
    larger result); for operands and ``out`` of one float32 or float64 dtype, without a bias.

    NOTE: NumPy has no float16 or bfloat16 BLAS path (its float16 matmul is a slow scalar
    loop). Rounding the inputs to 16 bits, accumulating in float32 (bias included) and rounding
    the result once is what GPU tensor cores do, and is at least as accurate as accumulating in
    16 bits.
    """
    if out is not None:
        if bias is not None or out_dtype is not None or not a.dtype == b.dtype == out.dtype \
                or a.dtype not in BLAS_DTYPES:
            raise EveryOError(f"blas_matmul(out=): a, b and out must share one dtype of "
                              f"{sorted(d.name for d in BLAS_DTYPES)}, with no bias or "
                              f"out_dtype; got {a.dtype}, {b.dtype} and {out.dtype}")
        return np.matmul(a, b, out=out)
    if out_dtype is not None or a.dtype in HALF_DTYPES or b.dtype in HALF_DTYPES:
        if out_dtype is None:
            out_dtype = result_dtype(a, b) if bias is None else result_dtype(a, b, bias)
        out = np.matmul(widen(a), widen(b))
        if bias is not None:
            bias = widen(bias)
            wider = bias.dtype.itemsize > out.dtype.itemsize  # a float64 bias widens the result
            out = out + bias if wider else np.add(out, bias, out=out)
        return narrow(out, out_dtype)
    out = np.matmul(a, b)
    if bias is None:
        return out
    if out.dtype == bias.dtype and 0 < bias.ndim <= out.ndim \
            and bias.shape == out.shape[out.ndim - bias.ndim:]:
        # NOTE: the product is ours: adding the bias into it (a bias of its dtype and of its
        # trailing shape, a Linear's) is the same sum, bit for bit, without a second
        # product-sized array: 78 instead of 138 us for (256, 2048) float32.
        return np.add(out, bias, out=out)
    return out + bias


#: The dtypes NumPy multiplies through BLAS itself (no conversion: ``out=`` writes in place).
BLAS_DTYPES: frozenset[np.dtype] = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def _check_shapes(a: np.ndarray, b: np.ndarray) -> None:
    if a.ndim == 0 or b.ndim == 0:
        raise EveryOError(f"matmul: {a.shape} @ {b.shape}: operands must have at least 1 dimension")
    inner_a, inner_b = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
    if inner_a != inner_b:
        raise EveryOError(f"matmul: {a.shape} @ {b.shape}: inner dimensions "
                          f"{inner_a} and {inner_b} differ")


def _refuse_unbroadcastable(a: np.ndarray, b: np.ndarray, bias) -> None:
    """Raise an EveryOError naming the shapes when the batch dimensions of ``a @ b`` (or the
    bias against the product) do not broadcast; return when they do (NumPy's error stands)."""
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    try:
        batch = np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        raise EveryOError(f"matmul: {a.shape} @ {b.shape}: the batch dimensions {batch_a} and "
                          f"{batch_b} do not broadcast") from None
    if bias is None:
        return
    product = batch + a.shape[-2:-1] + b.shape[-1:] if b.ndim > 1 else batch + a.shape[-2:-1]
    try:
        np.broadcast_shapes(product, bias.shape)
    except ValueError:
        raise EveryOError(f"matmul: bias of shape {bias.shape} does not broadcast against the "
                          f"product's shape {product} ({a.shape} @ {b.shape})") from None


#: 16-bit formats whose ``lower`` products keep the rounded float32 weight for backward (the
#: input gradient's product) instead of rounding the weight again there: 4 bytes per weight
#: element held between forward and backward, for ~0.1x (float16) and ~0.07x (bfloat16) of an
#: mlp_large step (docs/benchmarks.md). ``frozenset()`` keeps nothing (same numbers).
KEEPS_ROUNDED_WEIGHT = HALF_DTYPES


def _lowered(x: np.ndarray, lower: np.dtype) -> np.ndarray:
    """An operand of a ``lower`` product: a float32 one rounded to ``lower``'s values (still
    float32), a ``lower`` one as it is (widened by ``blas_matmul``)."""
    if x.dtype == FLOAT32:
        return rounded_float32(x, lower)
    if x.dtype != lower:
        raise EveryOError(f"matmul(lower={lower.name}): operands must be float32 or "
                          f"{lower.name}, got {x.dtype.name}")
    return x


def _lowered_gradient(product: np.ndarray, operand_dtype: np.dtype, lower: np.dtype):
    """The float32 ``product`` as the gradient of an operand of a ``lower`` product: rounded
    to ``lower`` (the gradient of its 16-bit value), in float32 for a float32 operand."""
    if operand_dtype == FLOAT32:
        return rounded_float32(product, lower, out=product)  # (the product is ours)
    return narrow(product, operand_dtype)


class MatMul(Op):
    """``a @ b (+ bias)``. With a bias the whole affine map is one op, so a precision policy
    casting matmul's operands sees the bias too.

    ``lower`` (float16 or bfloat16): the product of the operands cast to ``lower``, as if each
    float32 operand went through a cast node first, with no 16-bit copy of it made: the
    result is ``lower``, and a float32 operand's gradient is its 16-bit gradient in float32.
    Autocast passes it for master weights (see everyo_amp.autocast_mode); ``a`` must have
    at least two dimensions and ``b`` two.
    """

    precision = "lower"  # BLAS-shaped: float16 is safe, products accumulate in float32
    __slots__ = ("bias_shape",)
    saved_inputs = (0, 1)
    saves_output = False
    gradient_reads = ((1,), (0,), ())  # a's gradient reads b, b's a, the bias's neither

    def forward(self, a, b, bias=None, lower=None):
        _check_shapes(a, b)
        try:
            if lower is not None:
                return self._forward_lowered(a, b, bias, np.dtype(lower))
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
        except ValueError:
            _refuse_unbroadcastable(a, b, bias)
            raise

    def _forward_lowered(self, a, b, bias, lower):
        if lower not in HALF_DTYPES or a.ndim < 2 or b.ndim != 2:
            raise EveryOError(f"matmul(lower={lower}): lower must be float16 or bfloat16 and "
                              f"the operands at least 2-D @ 2-D, got {a.shape} @ {b.shape}")
        if bias is not None:
            self.bias_shape = bias.shape
            bias = _lowered(bias, lower)
        lowered_b = _lowered(b, lower)
        # NOTE: the operands themselves are saved (no copies), and backward rounds the weight
        # again for the input gradient, unless the format is one whose rounded weight is kept.
        keep = lower in KEEPS_ROUNDED_WEIGHT and self.needs_input_grad[0] and b.dtype == FLOAT32
        self.saved = (a, b, lowered_b if keep else None)
        return blas_matmul(_lowered(a, lower), lowered_b, bias, out_dtype=lower)

    def _backward_lowered(self, g, lower):
        a, b, held = self.saved
        na, nb = self.needs_input_grad[:2]
        ga = gb = gbias = None
        g = widen(g)  # (once: both products and the bias gradient read it)
        if na:
            lowered_b = _lowered(b, lower) if held is None else held
            product = blas_matmul(g, lowered_b.T, out_dtype=FLOAT32)
            ga = _lowered_gradient(product, a.dtype, lower)
        if nb:  # (one GEMM over the flattened batch, as in backward)
            rows = a.size // a.shape[-1] if a.shape[-1] else int(np.prod(a.shape[:-1]))
            product = blas_matmul(_lowered(a.reshape(rows, a.shape[-1]), lower).T,
                                  g.reshape(rows, g.shape[-1]), out_dtype=FLOAT32)
            gb = _lowered_gradient(product, b.dtype, lower)
        if len(self.needs_input_grad) > 2 and self.needs_input_grad[2]:
            # (summed in float32 and rounded once, as unbroadcast does with a 16-bit gradient)
            summed = unbroadcast(g, self.bias_shape)
            summed = summed.copy() if summed is g or summed.base is g else summed
            gbias = _lowered_gradient(summed, self.parents[2].data.dtype, lower)
        return ga, gb, gbias

    def backward(self, g):
        lower = self.attrs.get("lower")
        if lower is not None:
            return self._backward_lowered(g, np.dtype(lower))
        needs = self.needs_input_grad
        a2, b2, g2 = self._matrices(g)
        return (self._a_grad(a2, b2, g2) if needs[0] else None,
                self._b_grad(a2, b2, g2) if needs[1] else None,
                unbroadcast(g, self.bias_shape) if len(needs) > 2 and needs[2] else None)

    def backward_parts(self, g):
        # NOTE: the bias, then b (a Linear layer's weight), then a: a weight's gradient is
        # final, and can be sent by data-parallel training, before the input's is computed.
        lower = self.attrs.get("lower")
        if lower is not None:  # (computed together: the order only, no earlier weight)
            grads = self._backward_lowered(g, np.dtype(lower))
            for index in (2, 1, 0):
                if index < len(grads) and grads[index] is not None:
                    yield index, grads[index]
            return
        needs = self.needs_input_grad
        if len(needs) > 2 and needs[2]:
            yield 2, unbroadcast(g, self.bias_shape)
        a2, b2, g2 = self._matrices(g)
        if needs[1]:
            check_operand_unchanged(self, 0)  # (hooks run on the bias's part may write)
            plan = self._b_grad_rows(a2, b2, g2)
            if plan is None:
                yield 1, self._b_grad(a2, b2, g2)
            else:  # (a large weight: its rows leave block by block, see everyo.grad_rows)
                for gb, stop in _row_blocks(*plan):
                    yield 1, gb, stop
                    if stop < len(gb):  # (the next block reads the input again)
                        check_operand_unchanged(self, 0)
        if needs[0]:
            check_operand_unchanged(self, 1)  # (e.g. an optimizer step in the weight's hook)
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
        ga = unbroadcast(blas_matmul(g2, b2.swapaxes(-1, -2)), a2.shape)  # (the method: C)
        return ga.reshape(a.shape) if ga.shape != a.shape else ga

    def _b_grad_rows(self, a2, b2, g2) -> tuple | None:
        """``(input rows, output gradient rows, block stops)`` when the weight's gradient is
        computed in row blocks: a 2-D weight whose gradient has more than one block in
        ``row_block_stops``, all three arrays of one BLAS dtype; else None.

        NOTE: decided from shapes and dtypes only, and used by ``backward`` too: with hooks
        or without, the weight's gradient is the same blocked product, so the same bits.
        """
        b = self.saved[1]
        if b.ndim != 2 or b.dtype not in BLAS_DTYPES or not a2.dtype == b.dtype == g2.dtype:
            return None
        stops = row_block_stops(b.shape, b.dtype.itemsize)
        if len(stops) == 1:
            return None
        rows = a2.size // a2.shape[-1] if a2.shape[-1] else int(np.prod(a2.shape[:-1]))
        return a2.reshape(rows, a2.shape[-1]), g2.reshape(rows, g2.shape[-1]), stops

    def _b_grad(self, a2, b2, g2) -> np.ndarray:
        b = self.saved[1]
        plan = self._b_grad_rows(a2, b2, g2)
        if plan is not None:  # (every block, as backward_parts hands them over)
            return list(_row_blocks(*plan))[-1][0]
        if b2.ndim == 2 and a2.ndim > 2:
            # NOTE: one big GEMM over the flattened batch instead of a batched product.
            # (explicit row counts: reshape(-1, 0) is ambiguous when the inner size is 0)
            rows = a2.size // a2.shape[-1] if a2.shape[-1] else int(np.prod(a2.shape[:-1]))
            gb = blas_matmul(a2.reshape(rows, a2.shape[-1]).T, g2.reshape(rows, g2.shape[-1]))
        else:
            gb = unbroadcast(blas_matmul(a2.swapaxes(-1, -2), g2), b2.shape)
        # NOTE: a same-shape reshape is a view, which the engine would copy again before
        # storing it in a leaf's .grad
        return gb.reshape(b.shape) if gb.shape != b.shape else gb

    def backward_graph(self, g, out):
        a, b = self.parents[:2]
        lower = self.attrs.get("lower")
        if lower is not None:  # (the same graph as through cast nodes)
            a, b = (_cast_graph(t, lower) for t in (a, b))
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
        if lower is not None:
            grads = [None if gi is None else _uncast_graph(gi, t)
                     for gi, t in zip((ga, gb, gbias), self.parents)]
            return tuple(grads) + (None,) * (3 - len(grads))
        return ga, gb, gbias


def _row_blocks(a_rows: np.ndarray, g_rows: np.ndarray, stops: tuple):
    """``a_rows.T @ g_rows`` (a weight's gradient) computed in row blocks into one array;
    yields ``(gradient, stop)`` after each block, when rows ``[:stop]`` are final.

    NOTE: each block is ``a_rows[:, block].T @ g_rows``, written in place with ``out=``: no
    copy. Every path (hooks or not, every rank) computes the same blocks, so they agree bit for
    bit; for mlp_large's shapes the blocks also equal one unblocked GEMM's bits
    (tests/core/test_grad_rows.py), not promised for every shape (one-row blocks are GEMVs).
    """
    gradient = np.empty((a_rows.shape[1], g_rows.shape[1]), a_rows.dtype)
    start = 0
    for stop in stops:
        blas_matmul(a_rows[:, start:stop].T, g_rows, out=gradient[start:stop])
        start = stop
        yield gradient, stop


def _cast_graph(t, lower):
    return dispatch("cast", t, dtype=np.dtype(lower)) if t.data.dtype == FLOAT32 else t


def _uncast_graph(gi, t):
    return dispatch("cast", gi, dtype=FLOAT32) if t.data.dtype == FLOAT32 else gi


OPS = {"matmul": MatMul}
