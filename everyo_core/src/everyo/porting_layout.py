"""Which PyTorch array each parameter of a converted model was made from, and how, so that
a PyTorch optimizer's per-parameter buffers (``momentum_buffer``, ``exp_avg``, ...) and
L-BFGS's flat vectors convert exactly as the weights did.

``eo.convert_state_dict`` records, for every parameter of the model, the layer converter that
made it (:class:`ParameterSource`). The layout is not written down a second time here: it is
found by running that same converter on arrays of element numbers (each PyTorch element
numbered once), so the converter's output *is* the map from EveryO's elements to PyTorch's
(:meth:`ParameterSource.gather`). A parameter made from parts of a PyTorch array
(``MultiHeadAttention``'s packed ``in_proj_weight``), or computed from it (not a
rearrangement), has no such map: its buffers are refused by name.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Callable

import numpy as np

from everyo.dtypes import BFLOAT16
from everyo.errors import EveryOError


class LayoutUnknown(EveryOError):
    """A parameter's PyTorch layout is not known, so its optimizer buffers cannot convert."""


class ParameterSource:
    """How one parameter is made from its layer's PyTorch arrays.

    Args:
        name: the parameter's name in the model (``"fc.weight"``).
        relative: its name relative to the converting layer (``"weight"``).
        convert: ``convert({relative PyTorch key: array}) -> {relative EveryO name: array}``,
            the layer's converter with its layer and context bound.
        shapes: ``{relative PyTorch key: PyTorch's shape}`` of every array the layer reads.
        prefix: the layer's prefix in the PyTorch state dict (``"fc."``).
    """

    def __init__(self, name: str, relative: str, convert: Callable, shapes: dict,
                 prefix: str):
        self.name, self.relative, self.convert = name, relative, convert
        self.shapes, self.prefix = shapes, prefix

    @functools.cached_property
    def gather(self) -> tuple:
        """``(PyTorch key, PyTorch shape, indices)``: the parameter is
        ``pytorch_array.reshape(-1)[indices]`` (``indices`` of the parameter's shape); None
        for indices when that is the array as it is. Raises :class:`LayoutUnknown` when the
        parameter is not a rearrangement of one whole PyTorch array."""
        offsets, numbered, start = {}, {}, 0
        for key, shape in self.shapes.items():
            size = int(np.prod(shape, dtype=np.int64))
            offsets[key] = start
            numbered[key] = np.arange(start, start + size, dtype=np.int64).reshape(shape)
            start += size
        made = np.asarray(self.convert(numbered)[self.relative])
        if made.dtype.kind not in "iu" or (made.size and (made.min() < 0 or made.max() >= start)):
            raise LayoutUnknown(f"{self.name!r} is computed from PyTorch's arrays, not a "
                                f"rearrangement of one of them")
        sources = [key for key in self.shapes
                   if made.size and ((made >= offsets[key]) &
                                     (made < offsets[key] + numbered[key].size)).any()]
        if len(sources) != 1:
            raise LayoutUnknown(f"{self.name!r} is made from "
                                f"{[self.prefix + k for k in sources]} of PyTorch's arrays")
        key = sources[0]
        indices = made - offsets[key]
        if indices.size != numbered[key].size or \
                not np.array_equal(np.sort(indices, axis=None), np.arange(indices.size)):
            raise LayoutUnknown(f"{self.name!r} is made from a part of PyTorch's "
                                f"{self.prefix + key!r} {self.shapes[key]}")
        identity = indices.shape == tuple(self.shapes[key]) and \
            np.array_equal(indices.reshape(-1), np.arange(indices.size))
        return self.prefix + key, tuple(self.shapes[key]), None if identity else indices


# id(parameter) -> (weak reference to the parameter, its ParameterSource). NOTE: not a
# WeakKeyDictionary: that compares keys with ==, which a Tensor answers element-wise.
_SOURCES: dict[int, tuple] = {}


def _forget(key: int, ref) -> None:
    if _SOURCES.get(key, (None,))[0] is ref:
        del _SOURCES[key]


def record_source(param, source: ParameterSource) -> None:
    """Remember that ``param`` is made from PyTorch's arrays as ``source`` says."""
    key = id(param)
    _SOURCES[key] = (weakref.ref(param, functools.partial(_forget, key)), source)


def source_of(param) -> ParameterSource | None:
    """The :class:`ParameterSource` recorded for ``param``, or None."""
    entry = _SOURCES.get(id(param))
    return entry[1] if entry is not None and entry[0]() is param else None


def pytorch_array(what: str, value):
    """A torch tensor's values as a NumPy array (bfloat16, which NumPy lacks, through its
    bits); anything else is returned as it is. ``what`` names the value in errors."""
    if not (hasattr(value, "detach") and hasattr(value, "numpy")):
        return value
    try:
        value = value.detach().cpu()
    except (RuntimeError, NotImplementedError) as exc:  # a meta tensor: no values at all
        raise EveryOError(f"{what} (a torch tensor on {value.device}) has no values to copy: "
                          f"{exc}") from None
    if str(value.dtype) == "torch.bfloat16":
        # the value is torch's, so torch is loaded: no import (and no type stubs) needed
        torch = sys.modules[type(value).__module__.partition(".")[0]]
        return value.view(torch.int16).numpy().view(BFLOAT16)
    try:
        return value.numpy()
    except TypeError:  # float8, complex32, quantized, sparse...: NumPy cannot hold them
        raise EveryOError(f"{what} is a torch tensor of dtype {value.dtype}, which NumPy "
                          f"cannot hold (layout {value.layout}); convert it first (e.g. "
                          f".float(), .to_dense())") from None


def _unknown(what: str, param, why: str) -> EveryOError:
    return LayoutUnknown(f"{what}: {why}; its PyTorch layout is not known, so PyTorch's "
                         f"buffer cannot be converted (a transposed one would load silently "
                         f"wrong). Convert the model's weights with eo.convert_state_dict(model, "
                         f"torch_model.state_dict(), ...) first: the optimizer's buffers then "
                         f"convert as the weights did")


def buffer_from_pytorch(what: str, param, value) -> np.ndarray:
    """PyTorch's per-parameter buffer ``value`` (of the parameter's PyTorch shape) in
    ``param``'s EveryO layout. ``what`` names the buffer in errors (``"Adam.load_state_dict:
    buffer 'exp_avg' of parameter 0"``). A parameter of rank 0 or 1 never recorded keeps the
    buffer as it is (no layer rearranges a vector); a matrix or kernel never recorded, or
    recorded without a gather map, is refused by name."""
    array = np.asarray(value)
    source = source_of(param)
    if source is None:
        if param.ndim >= 2:
            raise _unknown(what, param, f"the parameter of shape {param.shape} was not made "
                                        f"by eo.convert_state_dict")
        return array
    try:
        key, shape, indices = source.gather
    except LayoutUnknown as exc:
        raise _unknown(what, param, str(exc)) from None
    if array.shape != shape:
        raise EveryOError(f"{what} has shape {array.shape}, but the parameter "
                          f"{source.name!r} comes from PyTorch's {key!r} of shape {shape}: "
                          f"the optimizer's parameters are not in the PyTorch optimizer's order")
    return array if indices is None else array.reshape(-1)[indices]


def flat_from_pytorch(what: str, params: list, vector) -> np.ndarray:
    """A vector over all ``params`` (PyTorch's L-BFGS state: each parameter's buffer
    flattened, in order) in EveryO's layouts, each piece converted as
    :func:`buffer_from_pytorch` converts a buffer."""
    flat = np.asarray(vector).reshape(-1)
    sizes = [p.data.size for p in params]
    if flat.size != sum(sizes):
        return flat  # (the caller's size check names it)
    pieces, start = [], 0
    for i, (p, size) in enumerate(zip(params, sizes)):
        source = source_of(p)
        shape = source.gather[1] if source is not None and _known(source) else p.shape
        piece = flat[start:start + size].reshape(shape)
        pieces.append(buffer_from_pytorch(f"{what} (parameter {i}'s part)", p, piece)
                      .reshape(-1))
        start += size
    return np.concatenate(pieces) if pieces else flat


def _known(source: ParameterSource) -> bool:
    try:
        return source.gather is not None
    except LayoutUnknown:
        return False
