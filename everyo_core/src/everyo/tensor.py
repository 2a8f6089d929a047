"""``Tensor``: a NumPy array plus what reverse-mode autograd needs, and the creation functions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from everyo import conveniences, functional, hooks, versioning
from everyo.array_protocol import array_function, array_ufunc
from everyo.axes import UNSET, check_axes, check_axis, pytorch_axis
from everyo.devices import check_device, is_device
from everyo.dispatch import dispatch, shape_hook
from everyo.dtypes import BFLOAT16, is_floating, resolve_dtype
from everyo.errors import EveryOError, allocating
from everyo.grad_mode import is_grad_enabled
from everyo.random import resolve_generator
from everyo.shape_args import Size, sizes

DEFAULT_FLOAT = np.dtype(np.float32)


def _alpha_scaled(other, alpha, method: str):
    """``alpha * other``, PyTorch's ``alpha=`` of ``add_``/``sub_`` (``other`` as given at 1)."""
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, (int, float, np.number)):
        raise EveryOError(f"{method}: alpha must be a number, got {alpha!r}")
    if alpha == 1:
        return other
    return other * alpha if isinstance(other, Tensor) else np.multiply(other, alpha)


def _normalize_dtype(dtype) -> np.dtype | None:
    if dtype is None:
        return None
    return resolve_dtype(dtype)


def _converted(data, dtype: np.dtype | None, what: str, copy: bool) -> np.ndarray:
    """``data`` as a numeric array (copied when ``copy``), or an ``EveryOError`` naming why not."""
    try:
        array = np.array(data, dtype=dtype, copy=True if copy else None)
    except (ValueError, TypeError, OverflowError) as exc:
        if "inhomogeneous" in str(exc):
            problem = "the nested sequences are ragged (their lengths differ)"
        else:
            problem = f"the data cannot be converted to {dtype.name if dtype else 'an array'}"
        raise EveryOError(f"{what}: {problem}: {exc}") from None
    return _check_numeric(array, what)


def _check_numeric(array: np.ndarray, what: str) -> np.ndarray:
    """``array``, or an ``EveryOError`` when its values are not numbers (strings, objects)."""
    if array.dtype.kind not in "biufc" and array.dtype != BFLOAT16:
        hint = (" (object: e.g. None, mixed types, or Python ints beyond 64 bits)"
                if array.dtype.kind == "O" else "")
        raise EveryOError(f"{what}: the values are not numeric: dtype {array.dtype.name}"
                          f"{hint}; a tensor holds booleans, integers or floating-point numbers")
    return array


def _check_grad_dtype(dtype: np.dtype) -> None:
    if not is_floating(dtype):
        raise EveryOError(
            f"only floating-point tensors can require gradients; this one is {dtype.name}"
        )


def _array(x) -> np.ndarray:
    return x.data if isinstance(x, Tensor) else np.asarray(x)


def _index_of(reducer, name: str) -> functional.Reduction:
    def fn(x, axis=None, keepdims: bool = False, *, dim=UNSET, keepdim=UNSET) -> Tensor:
        if dim is not UNSET or keepdim is not UNSET:  # PyTorch's spellings
            axis, keepdims = pytorch_axis(name, axis, keepdims, dim, keepdim)
        data = _array(x)
        if axis is not None:
            axis = check_axis(axis, data.ndim, name, data.shape)
        empty = data.size == 0 if axis is None else data.ndim and data.shape[axis] == 0
        if empty:  # PyTorch's rule: the reduced axis (all of them by default) must not be empty
            raise EveryOError(f"{name}: {'the tensor' if axis is None else f'axis {axis}'} of "
                              f"shape {data.shape} is empty: there is no {name[3:]}imum to "
                              f"point at")
        out = reducer(data, axis=axis if data.ndim else None, keepdims=keepdims)
        return Tensor._make(np.asarray(out), False, None)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Index of the {name[3:]}imum over ``axis`` (of the flattened tensor by "
                  f"default); an integer tensor with no gradient.")
    return fn


# NOTE: outside dispatch (an integer result has no gradient); the ONNX exporter names an
# output computed this way (everyo_onnx/refusals.py).
argmax = _index_of(np.argmax, "argmax")
argmin = _index_of(np.argmin, "argmin")


def multinomial(probs, num_samples: int, replacement: bool = False, generator=None) -> Tensor:
    """Draw ``num_samples`` category indices per row of ``probs`` (non-negative weights,
    normalised per row; one row or a matrix of rows), PyTorch's ``multinomial``. Without
    ``replacement`` a category is drawn at most once. The default generator is the one
    :func:`everyo.manual_seed` seeds.

    Example:
        >>> import everyo as eo
        >>> _ = eo.manual_seed(0)
        >>> eo.multinomial(eo.tensor([0.0, 1.0, 0.0]), 2, replacement=True).data
        array([1, 1])
    """
    weights = _array(probs).astype(np.float64)
    rows = _sampling_rows(weights, num_samples, replacement)
    rng = resolve_generator(generator)
    out = np.stack([rng.choice(len(row), size=num_samples, replace=bool(replacement),
                               p=row / row.sum()) for row in rows]).astype(np.int64)
    return Tensor(out if weights.ndim == 2 else out[0])


def _sampling_rows(weights: np.ndarray, num_samples, replacement) -> np.ndarray:
    """``weights`` as rows to sample from, checked as PyTorch checks them."""
    if weights.ndim not in (1, 2) or weights.shape[-1] == 0:
        raise EveryOError(f"multinomial: probs must be a non-empty vector or matrix, got shape "
                          f"{weights.shape}")
    if isinstance(num_samples, (bool, np.bool_)) or not isinstance(
            num_samples, (int, np.integer)) or num_samples <= 0:
        raise EveryOError(f"multinomial: num_samples must be a positive int, got "
                          f"{num_samples!r}")
    if not isinstance(replacement, (bool, np.bool_)):
        raise EveryOError(f"multinomial: replacement must be a bool, got {replacement!r}")
    rows = weights.reshape(-1, weights.shape[-1])
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise EveryOError("multinomial: probs must be finite and non-negative")
    if np.any(rows.sum(axis=1) <= 0):
        raise EveryOError("multinomial: every row of probs needs a positive sum")
    fewest = int(np.count_nonzero(rows, axis=1).min())
    if not replacement and num_samples > fewest:
        raise EveryOError(f"multinomial: cannot draw {num_samples} samples without "
                          f"replacement from a row with {fewest} non-zero categories")
    return rows


class Tensor:
    """An n-dimensional array that records the operations applied to it.

    ``data`` is the NumPy array itself (writable); ``grad`` is None until ``backward()`` has
    reached the tensor, then a NumPy array of the tensor's dtype and shape.

    Example:
        >>> import everyo as eo
        >>> x = eo.tensor([1.0, 2.0, 3.0], requires_grad=True)
        >>> (x * x).sum().backward()
        >>> x.grad
        array([2., 4., 6.], dtype=float32)
    """

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "__weakref__")
    data: np.ndarray
    grad: np.ndarray | None
    requires_grad: bool
    _ctx: Any
    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected operator

    def __init__(self, data, requires_grad: bool = False, dtype=None):
        array = _converted(data, _normalize_dtype(dtype), "Tensor", copy=False)
        if requires_grad:
            _check_grad_dtype(array.dtype)
        self.data = array
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None

    @classmethod
    def _make(cls, data: np.ndarray, requires_grad: bool, ctx) -> "Tensor":
        """Wrap an op's output without validation (the hot path)."""
        t = object.__new__(Tensor)
        t.data = data
        t.grad = None
        t.requires_grad = requires_grad
        t._ctx = ctx
        return t

    # -- properties -------------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        """The dtype's name, e.g. ``'float32'``."""
        return self.data.dtype.name

    @property
    def shape(self) -> tuple:
        hook = shape_hook.get()
        return self.data.shape if hook is None else hook(self)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> Size:
        """The number of elements (an int, as NumPy's ``size``); called, PyTorch's
        ``t.size()`` (the shape) or ``t.size(axis)`` (one axis' length)."""
        return Size(self.data.size, self.shape)  # (traced: the sizes stay symbolic)

    def numel(self) -> int:
        """The number of elements (PyTorch's name for ``size``)."""
        return self.data.size

    def dim(self) -> int:
        """The number of axes (PyTorch's name for ``ndim``)."""
        return self.data.ndim

    @property
    def is_leaf(self) -> bool:
        """True for tensors created by the user rather than by an op that records a graph."""
        return self._ctx is None

    @property
    def T(self) -> "Tensor":
        return dispatch("transpose", self)

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self):
        if self.data.ndim == 0:
            raise EveryOError("iteration over a 0-d tensor")
        return (self[i] for i in range(len(self.data)))

    def __array__(self, dtype=None, copy=None):
        # NOTE: NumPy 2 passes copy=True for np.array(t) and trusts us to copy: returning
        # self.data there would hand out an alias of the tensor's storage.
        array = self.data if dtype is None else self.data.astype(dtype, copy=False)
        if copy is False and array is not self.data:
            raise ValueError(f"cannot convert a {self.dtype} tensor to {np.dtype(dtype).name} "
                             f"without a copy (copy=False)")
        return array.copy() if copy and array is self.data else array

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """``np.exp(t)``, ``ndarray * t``...: the EveryO op of the same meaning when there is
        one, else NumPy on the arrays (see everyo.array_protocol and docs/autograd.md)."""
        return array_ufunc(Tensor, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        """``np.sum(t)``, ``np.where(...)``...: as ``__array_ufunc__``."""
        return array_function(Tensor, func, args, kwargs)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __format__(self, spec: str) -> str:
        # NOTE: np.sum(t) is a Tensor, where NumPy gave a scalar that f"{...:.3f}" formats
        return format(self.item(), spec) if spec and self.data.size == 1 else \
            format(str(self), spec)

    def __repr__(self) -> str:
        body = np.array2string(self.data, separator=", ", prefix="tensor(")
        extra = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}, dtype={self.dtype}{extra})"

    def __bool__(self) -> bool:
        if self.data.size != 1:
            # NOTE: also reached by `param in list_of_params` and `list.index(param)`, which
            # compare with ==; identity is what those callers mean (`any(p is q for q in ...)`)
            raise EveryOError(f"the truth value of a tensor of shape {self.data.shape} is "
                              f"ambiguous (it has {self.data.size} elements): use .any() or "
                              f".all(), and `is` to look a tensor up in a list")
        return bool(self.data)

    __hash__ = object.__hash__

    # -- operators (each one dispatch; written out so that type checkers see them) -----------
    def __add__(self, other) -> Tensor:
        return dispatch("add", self, other)

    def __radd__(self, other) -> Tensor:
        return dispatch("add", other, self)

    def __sub__(self, other) -> Tensor:
        return dispatch("sub", self, other)

    def __rsub__(self, other) -> Tensor:
        return dispatch("sub", other, self)

    def __mul__(self, other) -> Tensor:
        return dispatch("mul", self, other)

    def __rmul__(self, other) -> Tensor:
        return dispatch("mul", other, self)

    def __truediv__(self, other) -> Tensor:
        return dispatch("div", self, other)

    def __rtruediv__(self, other) -> Tensor:
        return dispatch("div", other, self)

    def __pow__(self, other) -> Tensor:
        return dispatch("pow", self, other)

    def __rpow__(self, other) -> Tensor:
        return dispatch("pow", other, self)

    def __matmul__(self, other) -> Tensor:
        return dispatch("matmul", self, other)

    def __rmatmul__(self, other) -> Tensor:
        return dispatch("matmul", other, self)

    def __neg__(self) -> Tensor:
        return dispatch("neg", self)

    def __abs__(self) -> Tensor:
        return dispatch("abs", self)

    def __getitem__(self, index) -> Tensor:
        return dispatch("getitem", self, index=index)

    # NOTE: comparisons are ops like the others (dispatched, so interceptors such as the ONNX
    # tracer see them); their boolean results are never recorded (no gradient). An operand
    # that is not a number, an array or a tensor is not compared (`t == None` is False).
    def __lt__(self, other) -> Tensor:  # type: ignore[override]
        return dispatch("lt", self, other) if _comparable(other) else NotImplemented

    def __le__(self, other) -> Tensor:  # type: ignore[override]
        return dispatch("le", self, other) if _comparable(other) else NotImplemented

    def __gt__(self, other) -> Tensor:  # type: ignore[override]
        return dispatch("gt", self, other) if _comparable(other) else NotImplemented

    def __ge__(self, other) -> Tensor:  # type: ignore[override]
        return dispatch("ge", self, other) if _comparable(other) else NotImplemented

    def __eq__(self, other) -> Tensor:  # type: ignore[override]
        return dispatch("eq", self, other) if _comparable(other) else NotImplemented

    def __ne__(self, other) -> Tensor:  # type: ignore[override]
        return dispatch("ne", self, other) if _comparable(other) else NotImplemented

    # -- augmented assignment: in place where an in-place write is allowed -------------------
    # NOTE: PyTorch's `t += x` always writes t. Here it writes in place exactly where `t.add_(x)`
    # would be allowed (neither side records gradients: under eo.no_grad(), or neither requires
    # grad), so the manual SGD step `with eo.no_grad(): p -= lr * p.grad` updates the parameter;
    # where the write would be refused (a training forward's `out += identity`), it computes out
    # of place and rebinds the name, as Python does for a class without these methods.
    def __iadd__(self, other) -> Tensor:
        return dispatch(*_augmented("add", self, other))

    def __isub__(self, other) -> Tensor:
        return dispatch(*_augmented("sub", self, other))

    def __imul__(self, other) -> Tensor:
        return dispatch(*_augmented("mul", self, other))

    def __itruediv__(self, other) -> Tensor:
        return dispatch(*_augmented("div", self, other))

    # -- in-place writes: dispatched, versioned, never recorded (see everyo.ops.inplace) -------
    def add_(self, other, alpha=1) -> Tensor:
        """``self += alpha * other`` in place (not recorded for autograd); returns ``self``.

        Example:
            >>> import everyo as eo
            >>> eo.ones(2).add_(1.0).data
            array([2., 2.], dtype=float32)
        """
        return dispatch("add_", self, _alpha_scaled(other, alpha, "add_"))

    def sub_(self, other, alpha=1) -> Tensor:
        """``self -= alpha * other`` in place; returns ``self``."""
        return dispatch("sub_", self, _alpha_scaled(other, alpha, "sub_"))

    def mul_(self, other) -> Tensor:
        """``self *= other`` in place; returns ``self``."""
        return dispatch("mul_", self, other)

    def div_(self, other) -> Tensor:
        """``self /= other`` in place (a floating tensor); returns ``self``."""
        return dispatch("div_", self, other)

    def copy_(self, source) -> Tensor:
        """Copy ``source``'s values (broadcast, cast to this dtype) into ``self``; returns
        ``self``."""
        return dispatch("copy_", self, source)

    def fill_(self, value) -> Tensor:
        """Set every element to ``value``; returns ``self``."""
        return dispatch("copy_", self, value)

    def zero_(self) -> Tensor:
        """Set every element to 0; returns ``self``."""
        return dispatch("copy_", self, 0)

    def clamp_(self, min=None, max=None) -> Tensor:
        """Limit the values to [min, max] in place; returns ``self``."""
        bounds = tuple(name for name, b in (("min", min), ("max", max)) if b is not None)
        values = tuple(b for b in (min, max) if b is not None)
        return dispatch("clamp_", self, *values, bounds=bounds)

    def __setitem__(self, index, value) -> None:
        """``t[index] = value``: writes in place and bumps the version."""
        dispatch("setitem", self, value, index=index)

    # -- the op surface's methods: the eo.<name> functions themselves -------------------------
    # -- methods generated from everyo/op_surface.py (python -m everyo.op_surface) --
    abs = functional.abs
    argmax = argmax
    argmin = argmin
    chunk = conveniences.chunk
    clip = functional.clip
    cumsum = conveniences.cumsum
    diag = conveniences.diag
    exp = functional.exp
    expand = conveniences.expand
    gather = conveniences.gather
    log = functional.log
    log_softmax = functional.log_softmax
    masked_fill = conveniences.masked_fill
    matmul = functional.matmul
    max = functional.max
    maximum = functional.maximum
    mean = functional.mean
    min = functional.min
    minimum = functional.minimum
    multinomial = multinomial
    neg = functional.neg
    pad = functional.pad
    permute = conveniences.permute
    pow = functional.pow
    relu = functional.relu
    reshape = functional.reshape
    sigmoid = functional.sigmoid
    softmax = functional.softmax
    split = conveniences.split
    sqrt = functional.sqrt
    sum = functional.sum
    swapaxes = conveniences.swapaxes
    tanh = functional.tanh
    transpose = functional.transpose
    tril = conveniences.tril
    triu = conveniences.triu
    unsqueeze = conveniences.unsqueeze
    var = functional.var
    view = conveniences.view
    # -- end of the generated methods --

    # -- conversion -------------------------------------------------------------------------
    def item(self):
        """The single value of a one-element tensor as a Python number."""
        if self.data.size != 1:
            raise EveryOError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.data.item()

    def numpy(self) -> np.ndarray:
        """The underlying array (shared, not copied)."""
        return self.data

    def detach(self) -> "Tensor":
        """A tensor sharing this one's data that is cut from the graph."""
        return Tensor._make(self.data, False, None)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad:
            _check_grad_dtype(self.data.dtype)
        self.requires_grad = requires_grad
        return self

    def astype(self, dtype) -> "Tensor":
        """Differentiable cast: the gradient is cast back to this tensor's dtype."""
        return dispatch("cast", self, dtype=resolve_dtype(dtype, "astype"))

    def to(self, *args, dtype=None, device=None, non_blocking: bool = False) -> Tensor:
        """This tensor in ``dtype`` (itself when it already is): a differentiable cast.

        PyTorch's forms: ``t.to("bfloat16")``, ``t.to("cpu")`` (EveryO computes on the CPU,
        so that is a no-op; another device is an error), ``t.to("cpu", "float64")``,
        ``t.to(other)`` (``other``'s dtype) and ``dtype=``/``device=`` by name;
        ``non_blocking`` is accepted and means nothing on the CPU.

        Returns:
            A tensor whose gradient flows back in this tensor's dtype.

        Example:
            >>> import everyo as eo
            >>> eo.tensor([1.0, 3.140625]).to("cpu", "bfloat16")
            tensor([1, 3.14062], dtype=bfloat16)
        """
        for arg in args:
            if isinstance(arg, Tensor):
                dtype = arg.data.dtype
            elif is_device(arg):
                device = arg
            else:
                dtype = arg
        if device is not None:
            check_device(device, "Tensor.to")
        if dtype is None:
            return self
        dtype = resolve_dtype(dtype, "Tensor.to")
        return self if dtype == self.data.dtype else dispatch("cast", self, dtype=dtype)

    # -- autograd ---------------------------------------------------------------------------
    def backward(self, grad=None, retain_graph: bool | None = None,
                 create_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        Args:
            grad: the gradient of some scalar with respect to this tensor; defaults to 1 for a
                one-element tensor.
            retain_graph: keep the graph so that ``backward()`` can run through it again
                (default: ``create_graph``).
            create_graph: build the gradient computation as a graph too (``.grad`` still
                receives arrays; use ``eo.grad(..., create_graph=True)`` for gradients that
                can be differentiated again).
        """
        # NOTE: the one deferred import of the core's own modules: engine.py imports this
        # module (a walk makes Tensors), so this one cannot import the engine at the top.
        from everyo.engine import backward  # noqa: PLC0415  (the documented deferral)

        backward(self, grad, retain_graph, create_graph)

    def register_hook(self, fn):
        """Call ``fn(grad_array)`` when this tensor's gradient is computed; a non-None return
        value replaces the gradient. Returns a handle with ``.remove()``.

        Example:
            >>> import everyo as eo
            >>> x = eo.ones(2, requires_grad=True)
            >>> h = x.register_hook(lambda g: g * 10)
            >>> (x * 3).sum().backward(); x.grad
            array([30., 30.], dtype=float32)
        """
        return hooks.register_hook(self, fn)

    def register_post_accumulate_grad_hook(self, fn, *, early: bool = False):
        """Call ``fn(self)`` once per backward pass right after this leaf's ``.grad`` is final.
        ``early=True`` promises that ``fn`` writes no tensor in place, so it may run before the
        producing op has finished its backward. Returns a handle with ``.remove()`` (see
        docs/autograd.md for the exact order)."""
        return hooks.register_post_accumulate_grad_hook(self, fn, early)

    def register_grad_rows_ready_hook(self, fn):
        """Call ``fn(self, start, stop)`` when rows ``start:stop`` of this leaf's ``.grad`` are
        final, for gradients an op hands over in row blocks (a large ``matmul`` weight); the
        post-accumulate hooks still run once at the end. ``fn`` must write no tensor in place.
        Returns a handle with ``.remove()`` (see docs/autograd.md)."""
        return hooks.register_grad_rows_ready_hook(self, fn)

    @property
    def _version(self) -> int:
        """How many in-place writes through EveryO this tensor's storage has seen."""
        return versioning.version(self)

    # -- shape methods of their own -------------------------------------------------------------
    def flatten(self, start_axis: int = 0) -> "Tensor":
        # NOTE: unchecked, shape[:start_axis] would quietly keep every axis and append one
        start_axis = check_axis(start_axis, self.ndim, "flatten", self.shape)
        lead = self.shape[:start_axis] if self.ndim else ()
        return dispatch("reshape", self, shape=lead + (-1,))

    def squeeze(self, axis=None) -> "Tensor":
        """Drop axes of length 1 (all of them, or ``axis``: an int or ints); as in PyTorch,
        a named axis whose length is not 1 is kept."""
        if axis is not None:
            axes = check_axes(axis if isinstance(axis, (tuple, list)) else (axis,), self.ndim,
                              "squeeze", self.shape)
            axis = tuple(a for a in axes if self.ndim and self.shape[a] == 1)
        return dispatch("reshape", self, shape=np.squeeze(self.data, axis).shape)

    # -- PyTorch's conversions by name (last in the class: ``float``, ``int`` and ``bool``
    # would otherwise shadow the builtins in the annotations that follow them) -------------
    def clone(self) -> "Tensor":
        """A copy that does not share this tensor's data; gradients flow through it (PyTorch's
        ``t.clone()``)."""
        if is_floating(self.data.dtype):
            return dispatch("mul", self, self.data.dtype.type(1))  # x * 1: a differentiable copy
        return Tensor._make(self.data.copy(), False, None)

    def contiguous(self) -> "Tensor":
        """Itself: EveryO tensors have no strides of their own (docs/porting.md)."""
        return self

    def cpu(self) -> "Tensor":
        """Itself: EveryO computes on the CPU."""
        return self

    def cuda(self, device=None, non_blocking: bool = False) -> "Tensor":
        """Refused by name: EveryO computes on the CPU only."""
        check_device("cuda" if device is None else f"cuda:{device}" if isinstance(device, int)
                     else device, "Tensor.cuda")
        return self

    def tolist(self):
        """The values as nested Python lists (a number for a 0-d tensor)."""
        return self.data.tolist()

    def float(self) -> "Tensor":
        """``to("float32")``."""
        return self.to("float32")

    def double(self) -> "Tensor":
        """``to("float64")``."""
        return self.to("float64")

    def half(self) -> "Tensor":
        """``to("float16")``."""
        return self.to("float16")

    def bfloat16(self) -> "Tensor":
        """``to("bfloat16")``."""
        return self.to("bfloat16")

    def long(self) -> "Tensor":
        """``to("int64")``."""
        return self.to("int64")

    def int(self) -> "Tensor":
        """``to("int32")``."""
        return self.to("int32")

    def bool(self) -> "Tensor":
        """``to("bool")``."""
        return self.to("bool")


def _augmented(op: str, target: Tensor, value) -> tuple:
    """``target op= value``'s dispatch: the in-place op (``add_``) unless that write would take
    part in gradient recording (and so be refused), else the out-of-place op (``add``)."""
    records = is_grad_enabled() and (target.requires_grad or (
        isinstance(value, Tensor) and value.requires_grad))
    return (op if records else op + "_"), target, value


def _comparable(other) -> bool:
    return isinstance(other, (Tensor, np.ndarray, np.generic, int, float, complex, list,
                              tuple))


# -- creation ---------------------------------------------------------------------------------

def _default_float(array: np.ndarray, explicit_dtype, from_ndarray: bool) -> np.ndarray:
    # NOTE: Python floats parse as float64; like PyTorch we default them to float32, but an
    # array the user built as float64 on purpose keeps its precision.
    if explicit_dtype is None and not from_ndarray and array.dtype == np.float64:
        return array.astype(DEFAULT_FLOAT)
    return array


def tensor(data, dtype=None, requires_grad: bool = False) -> Tensor:
    """Create a tensor holding a copy of ``data``.

    Args:
        data: a nested list, scalar, NumPy array or Tensor.
        dtype: e.g. ``"float32"``; default float32 for Python floats, the array's own dtype
            for a NumPy array (so float64 arrays stay float64).
        requires_grad: record operations for ``backward()``.

    Example:
        >>> import everyo as eo
        >>> eo.tensor([1.0, 2.0]).dtype
        'float32'
    """
    if isinstance(data, Tensor):
        data = data.data
    dtype = _normalize_dtype(dtype)
    from_ndarray = isinstance(data, (np.ndarray, np.generic))
    array = _converted(data, dtype, "tensor", copy=True)
    return Tensor(_default_float(array, dtype, from_ndarray), requires_grad=requires_grad)


def _fill(value, op: str):
    """A fill value: a number (or a one-element tensor/array), never a string or an object."""
    array = value.data if isinstance(value, Tensor) else np.asarray(value)
    _check_numeric(array, op)
    if array.size != 1:
        raise EveryOError(f"{op}: the fill value must be one number, got shape {array.shape}")
    return array.reshape(())


def _filled(fill, shape: tuple, dtype, requires_grad, op: str) -> Tensor:
    dtype, shape = _normalize_dtype(dtype) or DEFAULT_FLOAT, sizes(shape, op)
    if type(fill) not in (int, float):  # (zeros' and ones' own fills need no check)
        fill = _fill(fill, op)
    with allocating(op, shape, dtype):
        data = np.full(shape, fill, dtype=dtype)
    return Tensor(data, requires_grad=requires_grad)


def zeros(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros: ``eo.zeros(2, 3)`` or ``eo.zeros((2, 3))``."""
    return _filled(0, shape, dtype, requires_grad, "zeros")


def ones(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones: ``eo.ones(2, 3)``."""
    return _filled(1, shape, dtype, requires_grad, "ones")


_NO_FILL: Any = object()


def full(*size, fill_value=_NO_FILL, dtype=None, requires_grad: bool = False) -> Tensor:
    """A tensor filled with ``fill_value``: PyTorch's ``eo.full((2, 3), 0.5)``, or
    ``eo.full(2, 3, fill_value=0.5)`` (the sizes as separate arguments). Without ``dtype``
    the fill's kind decides, as PyTorch's: bool, int64, complex64 or the default float.

    Example:
        >>> import everyo as eo
        >>> eo.full((2,), 0.5).data
        array([0.5, 0.5], dtype=float32)
    """
    if fill_value is _NO_FILL:
        if len(size) != 2:
            raise EveryOError(f"full: expected the size and the fill value, as "
                              f"eo.full((2, 3), 0.5), got {len(size)} positional arguments "
                              f"{size}; or give fill_value= by name")
        fill_value = size[1]
        size = size[:1]
    return _filled(fill_value, size, _full_dtype(fill_value, dtype), requires_grad, "full")


def _full_dtype(fill_value, dtype):
    """``torch.full``'s dtype: ``dtype`` if given, else the fill's kind (a bool fills bools, an
    int int64, a complex complex64; a float the default float), so an integer is exact."""
    if dtype is not None or isinstance(fill_value, Tensor):
        return dtype
    kind = np.asarray(fill_value).dtype.kind
    return {"b": "bool", "i": "int64", "u": "int64", "c": "complex64"}.get(kind)


def _generator(seed) -> np.random.Generator:
    return resolve_generator(None) if seed is None else np.random.default_rng(seed)


def randn(*shape, seed=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Standard-normal samples: from a generator of their own with ``seed``, else from the
    global one :func:`everyo.manual_seed` seeds (as ``torch.randn``)."""
    dtype, shape = _normalize_dtype(dtype) or DEFAULT_FLOAT, sizes(shape, "randn")
    with allocating("randn", shape, dtype):
        data = _generator(seed).standard_normal(shape).astype(dtype)
    return Tensor(data, requires_grad=requires_grad)


def rand(*shape, seed=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1): from a generator of their own with ``seed``, else from the
    global one :func:`everyo.manual_seed` seeds (as ``torch.rand``)."""
    dtype, shape = _normalize_dtype(dtype) or DEFAULT_FLOAT, sizes(shape, "rand")
    with allocating("rand", shape, dtype):
        data = _generator(seed).random(shape).astype(dtype)
    return Tensor(data, requires_grad=requires_grad)


def arange(start=None, stop=None, step=1, dtype=None) -> Tensor:
    """Evenly spaced values, as ``np.arange`` (float results default to float32):
    ``eo.arange(end)``, ``eo.arange(start, end)``, ``eo.arange(start, end, step)``."""
    bounds = {"start": start, "end": stop, "step": step}
    for name, value in bounds.items():
        if value is not None and not (isinstance(value, (int, float, np.integer, np.floating))
                                      and np.isfinite(value)):
            raise EveryOError(f"arange: {name} must be a finite number, got {value!r}")
    if step == 0:
        raise EveryOError("arange: step must be non-zero")
    if start is None:
        raise EveryOError("arange: give the end, as eo.arange(5), or start and end")
    start, stop = (0, start) if stop is None else (start, stop)
    count = max(math.ceil((stop - start) / step), 0)
    with allocating("arange", (count,), np.result_type(start, stop, step)):
        data = np.arange(start, stop, step)
    return Tensor(_default_float(data.astype(_normalize_dtype(dtype) or data.dtype), dtype, False))


def _like(fill):
    def like(other, dtype=None, requires_grad: bool = False) -> Tensor:
        other = other.data if isinstance(other, Tensor) else np.asarray(other)
        return Tensor(np.full(other.shape, fill, dtype=_normalize_dtype(dtype) or other.dtype),
                      requires_grad=requires_grad)

    return like


zeros_like = _like(0)
zeros_like.__doc__ = "Zeros with the shape (and by default the dtype) of ``other``."
ones_like = _like(1)
ones_like.__doc__ = "Ones with the shape (and by default the dtype) of ``other``."


def full_like(other, fill_value, dtype=None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` with the shape (and by default the dtype) of ``other``."""
    return _like(fill_value)(other, dtype=dtype, requires_grad=requires_grad)


def randn_like(other, seed=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Standard-normal samples shaped like ``other``."""
    other = other.data if isinstance(other, Tensor) else np.asarray(other)
    return randn(*other.shape, seed=seed, dtype=dtype or other.dtype, requires_grad=requires_grad)


def rand_like(other, seed=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1) shaped like ``other``."""
    other = other.data if isinstance(other, Tensor) else np.asarray(other)
    return rand(*other.shape, seed=seed, dtype=dtype or other.dtype, requires_grad=requires_grad)
