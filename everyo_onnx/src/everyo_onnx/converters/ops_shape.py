"""Op converters for the core's shape ops: reshape, transpose, indexing, concatenate, stack,
pad (and its modes). Sizes read from a traced tensor's ``.shape`` arrive as ``SymInt`` and become computed
values (``ctx.ints``), so the graph follows the input's size."""

from __future__ import annotations

import numpy as np

from everyo import Tensor
from everyo_onnx.converters.by_name import by_op_name
from everyo_onnx.symbolic import SymInt

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max  # open slice ends


def convert_reshape(ctx, x, shape):
    """Reshape; a literal size on an axis that follows the input's size (``x.unsqueeze(1)``
    bakes the batch size in) is read from the input's shape instead."""
    return ctx.node("Reshape", [x, ctx.ints(symbolic_sizes(ctx, x, shape, keep=-1), "shape")])


def symbolic_sizes(ctx, x: str, shape, keep: int) -> list:  # keep: -1 reshape, 1 expand
    """``shape`` (a reshape or expand target) with every literal size on an axis of the result
    that follows the input's size replaced: by the size of an axis of ``x`` that has it, or
    (reshape) by -1 when no other axis uses it."""
    target = list(shape) if isinstance(shape, (tuple, list)) else [shape]
    in_shape, in_dynamic = ctx.shape(x), ctx.dynamic_axes(x)
    for axis, size in enumerate(target):
        if isinstance(size, SymInt) or axis not in ctx.result_dynamic or size == keep:
            continue
        same = [a for a in sorted(in_dynamic) if in_shape[a] == ctx.result.shape[axis]]
        aligned = axis - (len(target) - len(in_shape))  # the input axis broadcasting pairs
        if same:
            source = next(a for a in (axis, aligned, same[0]) if a in same)
            target[axis] = SymInt(size, ("dim", x, source))
        elif keep == -1 and -1 not in target:
            target[axis] = keep
        else:
            ctx.refuse(f"the size {size} of axis {axis} follows the input's size but was not "
                       f"read from a traced tensor's .shape")
    return target


def convert_transpose(ctx, x, axes=None):
    ndim = len(ctx.shape(x))
    perm = list(range(ndim))[::-1] if axes is None else [int(a) % ndim for a in axes]
    return ctx.node("Transpose", [x], perm=perm)


def _index_items(index) -> tuple:
    items = index if isinstance(index, tuple) else (index,)
    return tuple(i.data if isinstance(i, Tensor) else np.asarray(i) if isinstance(i, list)
                 else i for i in items)


def convert_getitem(ctx, x, index):
    """Basic indexing (slices, ints, ``None``, ``...``) and one integer-array index, as one
    Slice, then a Gather per int/array index, then an Unsqueeze for the new axes."""
    items = _index_items(index)
    ndim = len(ctx.shape(x))
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    expanded = []
    for item in items:
        expanded += [slice(None)] * (ndim - consumed) if item is Ellipsis else [item]
    expanded += [slice(None)] * (ndim - sum(1 for i in expanded if i is not None))
    starts, ends, axes, steps, gathers, new_axes = [], [], [], [], [], []
    axis = out_position = 0
    arrays = 0
    for item in expanded:
        if item is None:
            new_axes.append(out_position)
            out_position += 1
            continue
        if isinstance(item, slice):
            if item != slice(None):
                step = 1 if item.step is None else item.step
                default_start, default_end = (0, INT64_MAX) if step > 0 else (-1, INT64_MIN)
                starts.append(default_start if item.start is None else item.start)
                ends.append(default_end if item.stop is None else item.stop)
                axes.append(axis)
                steps.append(step)
            out_position += 1
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            gathers.append((axis, item))
        elif isinstance(item, np.ndarray) and item.dtype.kind in "iu":
            arrays += 1
            gathers.append((axis, item))
            out_position += item.ndim
        else:
            shown = (f"a {item.dtype} array of shape {item.shape}"
                     if isinstance(item, np.ndarray) else repr(item)[:60])
            ctx.refuse(f"index {shown} (boolean masks and other indexes have no converter)")
        axis += 1
    if arrays > 1 or (arrays and new_axes):
        ctx.refuse("more than one integer-array index, or one mixed with None")
    out = x
    if axes:
        out = ctx.node("Slice", [out, ctx.ints(starts, "starts"), ctx.ints(ends, "ends"),
                                 ctx.ints(axes, "axes"), ctx.ints(steps, "steps")])
    for axis, item in sorted(gathers, key=lambda g: g[0], reverse=True):
        if isinstance(item, np.ndarray):
            indices = ctx.constant(item, "indices", np.int64)
        elif isinstance(item, SymInt):
            indices = ctx.node("Squeeze", [ctx.ints([item], "index"), ctx.ints([0], "axes")])
        else:
            indices = ctx.constant(item, "index", np.int64)
        out = ctx.node("Gather", [out, indices], axis=axis)
    if new_axes:
        out = ctx.node("Unsqueeze", [out, ctx.ints(new_axes, "axes")])
    if out == x:
        out = ctx.node("Identity", [x])
    return out


def convert_concatenate(ctx, *xs, axis=0):
    parts = [ctx.cast(x, ctx.result.dtype) for x in xs]
    return ctx.node("Concat", parts, axis=int(axis) % ctx.result.ndim)


def convert_stack(ctx, *xs, axis=0):
    axis = int(axis) % ctx.result.ndim
    parts = [ctx.node("Unsqueeze", [ctx.cast(x, ctx.result.dtype), ctx.ints([axis], "axes")])
             for x in xs]
    return ctx.node("Concat", parts, axis=axis)


def convert_pad(ctx, x, pad_width, value=0.0):
    ndim = len(ctx.shape(x))
    widths = np.broadcast_to(np.asarray(pad_width, np.int64), (ndim, 2))
    pads = [int(w) for w in widths[:, 0]] + [int(w) for w in widths[:, 1]]
    (x,) = [ctx.cast(x, ctx.result.dtype)]
    fill = ctx.constant(value, "pad_value", ctx.dtype(x))
    return ctx.node("Pad", [x, ctx.ints(pads, "pads"), fill], mode="constant")


#: eo.pad's modes as ONNX Pad's (``wrap`` needs opset 19)
PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
             "circular": "wrap"}


def convert_pad_mode(ctx, x, pad_width, mode="constant", value=0.0):
    """``eo.pad(..., mode=...)``; a negative width (a crop before the padding) is refused: ONNX
    pads and crops in one step, so a mirrored pad would read different elements."""
    widths = np.broadcast_to(np.asarray(pad_width, np.int64), (len(ctx.shape(x)), 2))
    if (widths < 0).any():
        ctx.refuse(f"pad_mode: negative pad widths {widths.tolist()} (crops) in mode {mode!r}")
    if mode == "circular" and not ctx.since(19):
        ctx.refuse("pad_mode: mode 'circular' needs ONNX's Pad mode 'wrap', opset 19 or newer")
    if mode == "constant":
        return convert_pad(ctx, x, pad_width, value)
    pads = [int(w) for w in widths[:, 0]] + [int(w) for w in widths[:, 1]]
    return ctx.node("Pad", [x, ctx.ints(pads, "pads")], mode=PAD_MODES[mode])


CONVERTERS = by_op_name({
    "reshape": convert_reshape,
    "transpose": convert_transpose,
    "getitem": convert_getitem,
    "concatenate": convert_concatenate,
    "stack": convert_stack,
    "pad": convert_pad,
    "pad_mode": convert_pad_mode,
})
