"""The ``pad_mode`` op behind ``eo.pad(..., mode=...)``: constant, reflect, replicate and
circular padding along any axes, where a negative width crops (as PyTorch's ``F.pad``).

Each axis is one gather with an index array (which input element every output element copies);
the gradient adds each output element back onto the element it copied.
"""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.dispatch import dispatch
from everyo.errors import EveryOError

MODES = ("constant", "reflect", "replicate", "circular")


def pad_widths(pad_width, ndim: int) -> tuple:
    """``pad_width`` in ``np.pad``'s forms (int, one pair, one pair per axis) as one
    ``(before, after)`` int pair per axis, or an error."""
    try:
        raw = np.asarray(pad_width)
        # NOTE: as np.pad, only integers: converting 1.5 to int would pad by 1 silently.
        if raw.dtype.kind not in "iu":
            raise TypeError(raw.dtype)
        widths = np.broadcast_to(raw.astype(np.int64), (ndim, 2))
    except (TypeError, ValueError):
        raise EveryOError(f"pad: pad_width {pad_width!r} must be an int, a (before, after) "
                          f"pair or one pair per axis of the {ndim}-axis input") from None
    return tuple((int(b), int(a)) for b, a in widths)


def source_index(size: int, before: int, after: int, mode: str) -> tuple:
    """``(index, valid)``: which input element each output element along one axis copies, and
    (constant mode) which output elements copy one at all. Negative widths crop first; the
    padding then extends the cropped part (PyTorch's order, visible in circular mode)."""
    start = max(-before, 0)
    size = size - start - max(-after, 0)
    index = np.arange(-max(before, 0), size + max(after, 0))
    valid = None
    if mode == "constant":
        valid = (index >= 0) & (index < size)
        index = np.clip(index, 0, size - 1)
    elif mode == "replicate":
        index = np.clip(index, 0, size - 1)
    elif mode == "circular":
        index = index % size
    else:  # reflect: mirror about the edges without repeating them
        last = size - 1
        index = last - np.abs(last - np.abs(index))
    return index + start, valid


def _check(shape: tuple, widths: tuple, mode: str) -> None:
    for axis, (full, (before, after)) in enumerate(zip(shape, widths)):
        size = full - max(-before, 0) - max(-after, 0)  # what the padding extends
        if size <= 0 and (full or before > 0 or after > 0):
            raise EveryOError(f"pad: widths ({before}, {after}) crop axis {axis} of length "
                              f"{full} to nothing")
        widest = max(before, after)
        if mode == "reflect" and widest >= size and widest > 0:
            raise EveryOError(f"pad: reflect padding of {widest} needs more than {widest} "
                              f"elements on axis {axis}, which has {size}")
        if mode == "circular" and widest > size:
            raise EveryOError(f"pad: circular padding of {widest} exceeds the length {size} "
                              f"of axis {axis}")


class PadModeOp(Op):
    """Pad (or, with negative widths, crop) ``x`` by ``pad_width`` in ``mode``."""

    __slots__ = ("plan", "shape", "value")
    saved_inputs = ()
    saves_output = False

    def forward(self, x, pad_width=0, mode="constant", value=0.0):
        if mode not in MODES:
            raise EveryOError(f"pad: mode must be one of {MODES}, got {mode!r}")
        widths = pad_widths(pad_width, x.ndim)
        _check(x.shape, widths, mode)
        self.shape, self.value = x.shape, value
        self.plan = [(axis,) + source_index(x.shape[axis], b, a, mode)
                     for axis, (b, a) in enumerate(widths) if b or a]
        out = x
        for axis, index, valid in self.plan:
            out = np.take(out, index, axis=axis)
            if valid is not None and not valid.all():
                where = [slice(None)] * out.ndim
                where[axis] = ~valid
                out[tuple(where)] = value
        return out

    def backward(self, g):
        for axis, index, valid in reversed(self.plan):
            if valid is not None:
                g = np.compress(valid, g, axis=axis)
                index = index[valid]
            shape = list(g.shape)
            shape[axis] = self.shape[axis]
            grad = np.zeros(shape, g.dtype)
            where = [slice(None)] * g.ndim
            where[axis] = index
            np.add.at(grad, tuple(where), g)
            g = grad
        return (g,)

    def composite(self, x):
        out = x
        for axis, index, valid in self.plan:
            where = [slice(None)] * len(self.shape)
            where[axis] = index
            out = dispatch("getitem", out, index=tuple(where))
            if valid is not None and not valid.all():
                shape = [1] * len(self.shape)
                shape[axis] = valid.size
                out = dispatch("where", valid.reshape(shape), out, float(self.value))
        return out


OPS = {"pad_mode": PadModeOp}
