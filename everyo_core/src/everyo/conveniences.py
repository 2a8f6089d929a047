"""Tensor functions ported PyTorch code uses: ``split``, ``chunk``, ``view``, ``masked_fill``,
``tril``, ``triu``, ``diag``, ``unsqueeze``, ``permute``, ``swapaxes``, ``expand``, ``gather``,
``cumsum`` and ``einsum`` (which are ``eo.<name>`` and Tensor methods: :mod:`everyo.op_surface`).

They keep PyTorch's meanings (``split`` by piece size, ``chunk`` by number of pieces) with
EveryO's ``axis=`` where PyTorch says ``dim=``. Most are compositions of existing ops; ``expand``,
``tril``/``triu``, ``diag``, ``gather``, ``cumsum`` and ``einsum`` are ops of their own
(``everyo.ops``). This module does not import :mod:`everyo.tensor` (whose class body takes
these functions as methods): a tensor argument is recognised by what it holds.
"""

from __future__ import annotations

import numbers

import numpy as np

from everyo.axes import check_axis
from everyo.dispatch import dispatch
from everyo.dtypes import resolve_dtype
from everyo.errors import EveryOError
from everyo.shape_args import axes as axes_of
from everyo.shape_args import sizes as sizes_of

#: What a non-tensor argument can be (everything else passed as a value is a Tensor).
_PLAIN = (numbers.Number, np.generic, np.ndarray, list, tuple, str, bytes)


def _axis(axis: int, ndim: int, op: str) -> int:
    """``check_axis``'s rule, without its 0-d allowance: these functions need a real axis."""
    checked = check_axis(axis, ndim, op)
    if ndim == 0:
        raise EveryOError(f"{op}: axis {axis} is out of range for a tensor with 0 axes")
    return checked


def _whole(value, what: str, op: str) -> int:
    """``value`` as an int, refusing floats and bools rather than truncating them."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise EveryOError(f"{op}: {what} must be an int, got {value!r} "
                          f"({type(value).__name__})")
    return int(value)


def _pieces(x, sizes: list, axis: int) -> tuple:
    out, start = [], 0
    lead = (slice(None),) * axis
    for n in sizes:
        out.append(dispatch("getitem", x, index=lead + (slice(start, start + n),)))
        start += n
    return tuple(out)


def split(x, split_size_or_sections, axis: int = 0) -> tuple:
    """Split into pieces of ``split_size_or_sections`` elements along ``axis`` (the last may
    be shorter), or into pieces of the listed sizes — PyTorch's ``split``.

    Example:
        >>> import everyo as eo
        >>> [p.shape for p in eo.split(eo.zeros(5, 2), 2)]
        [(2, 2), (2, 2), (1, 2)]
    """
    axis = _axis(axis, x.ndim, "split")
    n = x.shape[axis]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [_whole(s, "each size", "split") for s in split_size_or_sections]
        if sum(sizes) != n or min(sizes, default=0) < 0:
            raise EveryOError(f"split: sizes {sizes} do not add up to {n}, the length of axis "
                              f"{axis} (shape {x.shape})")
    else:
        size = _whole(split_size_or_sections, "the piece size", "split")
        if size <= 0:
            raise EveryOError(f"split: the piece size must be positive, got {size}")
        sizes = [min(size, n - start) for start in range(0, n, size)] or [0]
    return _pieces(x, sizes, axis)


def chunk(x, chunks: int, axis: int = 0) -> tuple:
    """Split into ``chunks`` pieces of ``ceil(n / chunks)`` elements along ``axis`` (fewer
    pieces when they run out, as PyTorch's ``chunk``).

    Example:
        >>> import everyo as eo
        >>> [p.shape for p in eo.chunk(eo.zeros(6, 2), 4)]
        [(2, 2), (2, 2), (2, 2)]
    """
    chunks = _whole(chunks, "chunks", "chunk")
    if chunks <= 0:
        raise EveryOError(f"chunk: chunks must be positive, got {chunks}")
    n = x.shape[_axis(axis, x.ndim, "chunk")]
    if n == 0:  # PyTorch: an empty axis gives `chunks` empty pieces
        return split(x, [0] * chunks, axis)
    return split(x, -(-n // chunks), axis)


def view(x, *shape):
    """``reshape`` under PyTorch's name (EveryO tensors have no strides to keep)."""
    return dispatch("reshape", x, shape=sizes_of(shape, "view", minus_one="once"))


def _fill_value(value, dtype: np.dtype):
    """``value`` in the tensor's ``dtype``, as PyTorch's ``masked_fill`` casts it (a float
    into an int tensor truncates toward zero), refusing what does not fit the dtype."""
    # a Tensor: cast in the graph, so it stays differentiable (None is no number: below)
    if value is not None and not isinstance(value, _PLAIN):
        return value if resolve_dtype(value.dtype) == dtype else dispatch("cast", value,
                                                                           dtype=dtype)
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise EveryOError(f"masked_fill: value must be a number or a Tensor, got {value!r}")
    if dtype.kind in "iu":
        if not np.all(np.isfinite(array)):
            raise EveryOError(f"masked_fill: value {value!r} cannot be stored in a "
                              f"{dtype.name} tensor")
        info = np.iinfo(dtype)
        whole = np.trunc(array) if array.dtype.kind == "f" else array
        if np.any(whole < info.min) or np.any(whole > info.max):
            raise EveryOError(f"masked_fill: value {value!r} is outside the range of "
                              f"{dtype.name} ({info.min}..{info.max})")
    with np.errstate(over="ignore"):
        cast = array.astype(dtype)
    if dtype.kind == "f" and np.any(np.isfinite(array) & ~np.isfinite(cast)):
        raise EveryOError(f"masked_fill: value {value!r} overflows {dtype.name}")
    return cast


def masked_fill(x, mask, value):
    """``x`` with ``value`` wherever ``mask`` (broadcast against ``x``) is True.

    The result keeps ``x``'s dtype, as in PyTorch: ``value`` is cast to it (a float into an
    int tensor truncates toward zero); a value the dtype cannot hold raises ``EveryOError``.

    Example:
        >>> import everyo as eo, numpy as np
        >>> eo.masked_fill(eo.zeros(3), np.array([True, False, True]), -1.0).data
        array([-1.,  0., -1.], dtype=float32)
    """
    array = np.asarray(mask)  # (a Tensor hands over its data)
    if array.dtype != bool:
        raise EveryOError(f"masked_fill: the mask must be boolean, got {array.dtype}")
    try:
        fits = np.broadcast_shapes(array.shape, x.data.shape) == x.data.shape
    except ValueError:  # NumPy's "shape mismatch": not broadcastable at all
        fits = False
    if not fits:
        raise EveryOError(f"masked_fill: mask shape {array.shape} does not broadcast to the "
                          f"tensor's {x.data.shape}")
    # NOTE: a Tensor mask goes to the op as itself, so a tracer (ONNX export) sees where it
    # came from (e.g. a comparison of traced tensors).
    return dispatch("where", array if isinstance(mask, _PLAIN) else mask,
                    _fill_value(value, x.data.dtype), x)


def tril(x, k: int = 0):
    """The lower triangle of the last two axes (on and below diagonal ``k``), zeros above."""
    return dispatch("tril", x, k=_whole(k, "k", "tril"))


def triu(x, k: int = 0):
    """The upper triangle of the last two axes (on and above diagonal ``k``), zeros below."""
    return dispatch("triu", x, k=_whole(k, "k", "triu"))


def diag(x, diagonal: int = 0):
    """PyTorch's ``diag``: a vector becomes a square matrix with it on diagonal ``diagonal``
    (above the main one for ``diagonal > 0``), a matrix gives that diagonal as a vector.

    Example:
        >>> import everyo as eo
        >>> eo.diag(eo.tensor([1.0, 2.0]), 1).data
        array([[0., 1., 0.],
               [0., 0., 2.],
               [0., 0., 0.]], dtype=float32)
    """
    return dispatch("diag", x, diagonal=_whole(diagonal, "diagonal", "diag"))


def unsqueeze(x, axis: int):
    """``x`` with a new axis of length 1 at ``axis``."""
    at = _axis(axis, x.ndim + 1, "unsqueeze")
    return dispatch("reshape", x, shape=x.shape[:at] + (1,) + x.shape[at:])


def permute(x, *order):
    """Reorder the axes: ``x.permute(0, 3, 1, 2)`` turns NHWC into NCHW."""
    return dispatch("transpose", x, axes=axes_of(order, x.ndim, "permute"))


def swapaxes(x, axis0: int, axis1: int):
    """Exchange two axes (PyTorch's ``transpose(dim0, dim1)``)."""
    order = list(range(x.ndim))
    a, b = _axis(axis0, x.ndim, "swapaxes"), _axis(axis1, x.ndim, "swapaxes")
    order[a], order[b] = order[b], order[a]
    return dispatch("transpose", x, axes=tuple(order))


def expand(x, *shape):
    """Broadcast ``x`` to ``shape`` (sizes, or one tuple of them); ``-1`` keeps an axis'
    length, as in PyTorch.

    Example:
        >>> import everyo as eo
        >>> eo.expand(eo.ones(3, 1), 3, 4).shape
        (3, 4)
    """
    wanted = sizes_of(shape, "expand", minus_one="any")
    extra = len(wanted) - x.ndim
    if extra < 0:
        raise EveryOError(f"expand: {len(wanted)} sizes for a tensor with {x.ndim} axes")
    shape = tuple(x.shape[i - extra] if s == -1 and i >= extra else s
                  for i, s in enumerate(wanted))
    return dispatch("expand", x, shape=shape)


def gather(x, axis: int, index):
    """``out[i][j][k] = x[i][index[i][j][k]][k]`` for ``axis=1`` (PyTorch's ``gather``).

    Example:
        >>> import everyo as eo, numpy as np
        >>> eo.gather(eo.tensor([[1.0, 2.0], [3.0, 4.0]]), 1, np.array([[1], [0]])).data
        array([[2.],
               [3.]], dtype=float32)
    """
    index = np.asarray(index)  # (a Tensor hands over its data)
    return dispatch("gather", x, axis=axis, index=index)


def cumsum(x, axis: int):
    """Running sum along ``axis``."""
    return dispatch("cumsum", x, axis=axis)


def einsum(equation: str, *operands):
    """Einstein summation, differentiable in every operand (``...`` supported).

    Example:
        >>> import everyo as eo
        >>> eo.einsum("bij,bjk->bik", eo.ones(2, 3, 4), eo.ones(2, 4, 5)).shape
        (2, 3, 5)
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return dispatch("einsum", *operands, equation=equation)
