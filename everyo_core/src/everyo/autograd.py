"""Reverse-mode autograd: the ``Op`` base class and the backward walk on arrays.

An op is a small class with ``forward`` and ``backward`` on NumPy arrays. ``Op.apply`` wraps the
operands, runs ``forward`` and, when any operand requires a gradient, keeps the op instance as
the output's graph node. ``backward`` receives the output's gradient and returns one gradient per
operand (``None`` where ``needs_input_grad`` is False).

This module holds the fast walk (:func:`backward_arrays`: gradients are arrays, no hooks) and
the helpers every walk shares (:func:`topological_order`, :func:`root_gradient`,
:func:`accumulate_leaf`...). :mod:`everyo.engine` owns the choice of walk (``Tensor.backward``
calls :func:`everyo.engine.backward`) and the general walk: differentiable gradients
(``create_graph=True``), ``eo.grad`` and hooks. The op author's contract (``backward_graph``,
``composite``, what an op saves) is in docs/autograd.md.

Example op::

    class Square(Op):
        def forward(self, x):
            self.saved = x
            return x * x

        def backward(self, grad):
            return (2 * self.saved * grad,)
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from everyo.dtypes import HALF_DTYPES, is_floating
from everyo.errors import EveryOError
from everyo.grad_mode import _grad_enabled
from everyo.half_precision import narrow, widen
from everyo.tensor import DEFAULT_FLOAT, Tensor, _check_numeric
from everyo.versioning import check_saved, clock

#: Put in ``op.saved`` when a backward without ``retain_graph`` has freed the op.
RELEASED = object()


class Op:
    """Base of every differentiable operation; subclasses implement forward and backward.

    Attributes available in ``forward``/``backward``:
        needs_input_grad: one bool per operand, True where a gradient is wanted.
        saved: whatever ``forward`` stores for ``backward`` (freed after backward).
        parents: the operand Tensors (set when the op is recorded).
        attrs: the keyword attributes of the call (set when the op is recorded), for
            ``composite``.

    A subclass may define ``backward_graph(g, out)`` or ``composite(*inputs)`` for second
    derivatives. ``__slots__`` (the attributes it stores besides ``saved``) is optional: without
    it each instance carries a ``__dict__`` (slower attribute access, ~100 bytes more per graph
    node), which a notebook's custom op can afford; EveryO's own ops declare it (a test checks).
    """

    __slots__ = ("parents", "needs_input_grad", "saved", "epoch", "attrs", "__weakref__")
    parents: tuple
    needs_input_grad: tuple
    saved: Any
    epoch: int
    attrs: dict

    #: Name used in error messages; set from the registered name when registered.
    name = "op"
    #: Operand indices whose values backward reads (None: every operand). Backward raises if
    #: one of them was modified in place after the forward pass.
    saved_inputs: tuple | None = None
    #: True when backward reads the op's own output (exp, tanh, softmax...).
    saves_output: bool = True
    #: Finer than ``saved_inputs``/``saves_output``: for each operand, the operand indices its
    #: gradient reads (-1: the output), or ``"others"`` (each operand's gradient reads every
    #: other operand). Backward then checks only what the gradients it computes read: the
    #: ``a`` of ``a * b`` when ``b`` needs a gradient, as PyTorch saves it only then.
    gradient_reads: tuple | str | None = None
    #: Attributes holding arrays backward reads that are not operands (gather's ``index``): an
    #: array, or a tuple of them and other values (an indexing key). Checked as saved operands
    #: are: backward raises if one was written in place (through EveryO) after the forward.
    saved_attributes: tuple = ()
    #: ``backward_graph(self, g, out) -> tuple``: backward written with EveryO ops on Tensors.
    backward_graph = None
    #: ``composite(self, *inputs) -> Tensor``: forward written with differentiable EveryO ops.
    composite = None
    #: ``backward_parts(self, g)``: a generator yielding ``(operand index, gradient)`` one
    #: operand at a time, parameters' gradients first. With hooks registered the engine
    #: finalises a leaf (accumulates it, runs its post-accumulate hooks) as soon as its part
    #: arrives, before the op computes the rest. A large gradient may come in row blocks,
    #: ``(operand index, gradient, stop)`` after each (see :mod:`everyo.grad_rows`).
    #: ``backward`` must return the same arrays: write it as
    #: ``return gradients_from_parts(self, g)``.
    backward_parts = None
    #: True for an op that writes its operand 0 in place and returns that tensor (``add_``,
    #: ``t[i] = v``: see everyo.ops.inplace); an interceptor must treat its result as a new
    #: value of the same tensor.
    in_place = False
    #: False for an op that is never recorded and has no gradient (a comparison, an in-place
    #: write): the coverage tables of gradients skip it.
    differentiable = True

    def forward(self, *arrays, **attrs) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def backward(self, grad: np.ndarray):  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def apply(cls, *operands, **attrs) -> Tensor:
        """Run the op on ``operands`` (Tensors, arrays or scalars) and record it if needed."""
        tensors = _as_tensors(operands, cls.name)
        op = object.__new__(cls)
        needs = tuple([t.requires_grad for t in tensors])
        record = True in needs and _grad_enabled.get()
        op.needs_input_grad = needs
        op.saved = None
        try:
            out = op.forward(*[t.data for t in tensors], **attrs)
        except np.exceptions.DTypePromotionError:
            raise EveryOError(_no_common_dtype(cls.name, tensors)) from None
        except TypeError as exc:
            _refuse_a_call_forward_cannot_take(cls, len(tensors), attrs, exc)
            raise
        if type(out) is not np.ndarray:  # NumPy's 0-d results are scalars: a Tensor holds an
            out = np.asarray(out)  # array (writable in place, versioned by its storage)
        # NOTE: an integer or boolean result (a cast to int32, a comparison) has no gradient,
        # as in PyTorch: recording it made `x * w.astype("int32")` hand w a straight-through
        # gradient that no derivative of the cast justifies
        if record and out.dtype.kind not in "iub":
            op.parents = tensors
            op.epoch = clock[0]
            op.attrs = attrs
            return Tensor._make(out, True, op)
        return Tensor._make(out, False, None)


def gradients_from_parts(op: Any, g: np.ndarray) -> tuple:
    """``op.backward(g)`` assembled from ``op.backward_parts(g)``, so the two cannot disagree.

    Args:
        op: an op instance whose class defines ``backward_parts``.
        g: the gradient with respect to the op's output.
    Returns:
        A tuple with one gradient (or None) per operand, as ``backward`` returns.

    Example:
        >>> class Add(Op):
        ...     __slots__ = ()
        ...     def forward(self, a, b): return a + b
        ...     def backward_parts(self, g): yield 1, g; yield 0, g
        ...     def backward(self, g): return gradients_from_parts(self, g)
        >>> op = object.__new__(Add); op.needs_input_grad = (True, True)
        >>> [float(x) for x in op.backward(np.float32(2))]
        [2.0, 2.0]
    """
    grads: list = [None] * len(op.needs_input_grad)
    for part in op.backward_parts(g):  # (a gradient in row blocks: the last part's array)
        grads[part[0]] = part[1]
    return tuple(grads)


def _refuse_a_call_forward_cannot_take(cls, count: int, attrs: dict, exc: TypeError) -> None:
    """After ``forward`` raised ``exc``: an ``EveryOError`` naming the op when the call does
    not fit its ``forward`` (too many operands or an unknown attribute, as
    ``eo.dispatch("dropout", x, 0.5)`` passes ``p`` as an operand), or when an operand took
    the place of an attribute (a parameter whose default is not None: operands have none, or
    None). Otherwise the
    ``TypeError`` is forward's own and is left alone."""
    signature = inspect.signature(cls.forward)
    try:
        bound = signature.bind(None, *range(count), **attrs)
    except TypeError:
        misplaced = True
    else:
        positional = list(bound.arguments)[1:1 + count]
        misplaced = any(signature.parameters[p].default not in (None, inspect.Parameter.empty)
                        for p in positional)
    if misplaced:
        shown = str(signature).replace("(self, ", "(", 1)
        raise EveryOError(f"{cls.name}: called with {count} operand(s) and attributes "
                          f"{sorted(attrs)}, but the op takes {shown} (operands positionally, "
                          f"attributes by name): {exc}") from None


def _no_common_dtype(name: str, tensors: tuple) -> str:
    dtypes = sorted({t.data.dtype.name for t in tensors})
    return (f"op {name!r} cannot combine dtypes {dtypes}: NumPy has no common type for them; "
            f"convert one first, e.g. x.to('float32')")


def _as_tensors(operands, name: str = "op") -> tuple:
    """Operands as Tensors; Python scalars take the dtype of the tensor they meet. An operand
    that is not numbers (None, a string, an object array) is an error naming op ``name``."""
    if len(operands) == 2:  # NOTE: the hot case, a floating tensor (op) a Python float
        a, b = operands
        if type(b) is float and type(a) is Tensor and a.data.dtype.kind == "f":
            return a, Tensor._make(np.array(b, a.data.dtype), False, None)
        if type(a) is float and type(b) is Tensor and b.data.dtype.kind == "f":
            return Tensor._make(np.array(a, b.data.dtype), False, None), b
    for o in operands:
        if type(o) is not Tensor and not isinstance(o, Tensor):
            break
    else:
        return operands
    # NOTE: scalars follow the first floating tensor, else the first tensor: in
    # where(x > 0, x, 0.0) the bool mask must not decide the dtype of 0.0.
    like = None
    for o in operands:
        if isinstance(o, Tensor):
            if is_floating(o.data.dtype):
                like = o.data.dtype
                break
            if like is None:
                like = o.data.dtype
    out = []
    for i, o in enumerate(operands):
        if isinstance(o, Tensor):
            out.append(o)
        elif isinstance(o, np.ndarray):
            out.append(Tensor._make(_check_numeric(o, f"{name}: operand {i}"), False, None))
        else:
            out.append(Tensor._make(_constant(o, like, f"{name}: operand {i}"), False, None))
    if like is not None and like.kind in "iub" and any(
            isinstance(o, float) for o in operands):
        # NOTE: int tensor (op) Python float gives the default float (PyTorch), not float64.
        out = [Tensor._make(t.data.astype(DEFAULT_FLOAT), False, None)
               if t.data.dtype.kind in "iub" else t for t in out]
    return tuple(out)


def _constant(value, like: np.dtype | None, what: str = "op") -> np.ndarray:
    if type(value) is float and like is not None and like.kind == "f":
        return np.array(value, like)  # the common case below, in one NumPy call
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # (ragged nested lists)
        raise EveryOError(f"{what} is not numeric: {exc}") from None
    # NOTE: checked before the cast below: NumPy casts a None object to NaN, silently
    _check_numeric(array, what)
    if like is not None and array.ndim == 0:
        # NOTE: PyTorch's rule: a Python scalar never widens a tensor (float16 * 2.5 stays
        # float16); an int tensor meeting a float scalar becomes the default float.
        if is_floating(like) or (like.kind in "iu" and array.dtype.kind in "iub"):
            return array.astype(like)
        if array.dtype.kind == "f":
            return array.astype(DEFAULT_FLOAT)
    if array.dtype == np.float64 and not isinstance(value, (np.ndarray, np.generic)):
        return array.astype(DEFAULT_FLOAT)
    return array


def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``grad`` over the axes along which an operand of ``shape`` was broadcast."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        i + extra for i, n in enumerate(shape) if n == 1 and grad.shape[i + extra] != 1
    )
    if axes:
        # NOTE: 16-bit gradients are summed in float32 and rounded once, as tensor cores do.
        if grad.dtype in HALF_DTYPES:
            grad = narrow(widen(grad).sum(axis=axes, keepdims=True), grad.dtype)
        else:  # (ndarray.sum is a Python wrapper around this)
            grad = np.add.reduce(grad, axis=axes, keepdims=True)
    return grad.reshape(shape)


def topological_order(root_ops, stop_at=()) -> list:
    """Ops reachable from ``root_ops``, each after every op that consumes its output.

    ``stop_at``: ids of tensors whose producers are not entered (treated as leaves).
    """
    order: list = []
    visited: set = set()
    stack = [(op, False) for op in root_ops]
    while stack:
        op, expanded = stack.pop()
        if expanded:
            order.append(op)
            continue
        # NOTE: mark an op visited when it is expanded, not when it is pushed: an op pushed
        # early by one consumer must still finish after every op reachable through another
        # consumer, or its gradient is propagated before all contributions arrived.
        if id(op) in visited:
            continue
        visited.add(id(op))
        parents = op.parents
        if parents is None or op.saved is RELEASED:
            raise EveryOError(
                "backward() through a graph that was already freed: a previous backward() "
                "released it; pass retain_graph=True to the first call to go through it again"
            )
        stack.append((op, True))
        for t in parents:
            ctx = t._ctx
            if ctx is not None and id(ctx) not in visited and id(t) not in stop_at:
                stack.append((ctx, False))
    order.reverse()
    return order


def backward_arrays(root: Tensor, grad=None, retain_graph: bool = False) -> None:
    """Propagate ``grad`` (default 1) from ``root`` to every leaf that requires a gradient,
    with array gradients and no hooks: the fast walk :func:`everyo.engine.backward` chooses
    when nothing needs the general one. The general walk (engine.py) does the same with
    Tensors, captures and hooks; keep the two in step."""
    grad = root_gradient(root, grad)
    if root._ctx is None:
        accumulate_leaf(root, grad, copy=True)
        return
    pending = {id(root._ctx): grad}
    # NOTE: a leaf's contributions are summed before they meet its existing .grad, as in
    # engine.py (and PyTorch): g_old + (a + b), not (g_old + a) + b, so that registering a
    # hook anywhere does not change the gradients' rounding.
    leaves: dict[int, tuple] = {}
    now = clock[0]
    if root._ctx.epoch != now:
        check_saved(root._ctx, root)
    for op in topological_order((root._ctx,)):
        g = pending.pop(id(op), None)
        if g is None:
            continue
        if op.epoch != now:
            check_saved(op)
        grads = op.backward(g)
        for t, gi, needed in zip(op.parents, grads if type(grads) is tuple else (grads,),
                                 op.needs_input_grad):
            if not needed or gi is None:
                continue
            if gi.dtype != t.data.dtype:
                # NOTE: a gradient arriving at a tensor takes that tensor's dtype: float16
                # activations get float16 gradients, float32 master weights float32 ones.
                gi = narrow(gi, t.data.dtype)
            if gi.shape != t.data.shape:
                raise_shape_mismatch(op, gi.shape, t.data.shape)
            ctx = t._ctx
            if ctx is None:
                previous = leaves.get(id(t))
                if previous is not None:
                    leaves[id(t)] = (t, previous[1] + gi)
                else:  # copied now: a later backward may be handed the same array
                    leaves[id(t)] = (t, np.array(gi, copy=True) if shared(gi, g) else gi)
            else:
                key = id(ctx)
                if ctx.epoch != now:
                    check_saved(ctx, t)
                previous = pending.get(key)
                pending[key] = gi if previous is None else previous + gi
        if not retain_graph:  # (release(op), inlined: this loop is the per-op hot path)
            op.saved = RELEASED
            op.parents = None
    for t, gi in leaves.values():
        accumulate_leaf(t, gi, copy=False)


def release(op) -> None:
    """Free what ``op`` kept for backward (``retain_graph=False``): a second backward through
    it raises instead of reading freed values."""
    op.saved = RELEASED
    op.parents = None


def shared(gi: np.ndarray, g: np.ndarray) -> bool:
    """True when an op's gradient ``gi`` may alias other memory: ``g`` passed through, or a
    view. A leaf's ``.grad`` must then be a copy, so that an in-place update of one ``.grad``
    never changes another array."""
    return gi is g or not gi.flags.owndata


def root_gradient(root: Tensor, grad) -> np.ndarray:
    """The starting gradient of a backward pass from ``root`` as an array (checked)."""
    if not root.requires_grad:
        raise EveryOError(
            "backward() on a tensor that does not require grad: no operand of the ops that "
            "produced it had requires_grad=True (or it was computed under no_grad())"
        )
    if grad is None:
        if root.data.size != 1:
            raise EveryOError(
                f"backward() without a gradient needs a one-element tensor, got shape "
                f"{root.shape}; pass grad= with that shape"
            )
        return np.ones_like(root.data)
    try:
        grad = np.asarray(grad.data if isinstance(grad, Tensor) else grad)
    except (TypeError, ValueError) as exc:  # (ragged nested lists)
        raise EveryOError(f"backward(grad): grad is not an array of numbers: {exc}") from None
    # NOTE: checked before the cast: NumPy casts None objects to NaN, strings raise, and a
    # complex gradient would lose its imaginary part with only a ComplexWarning
    grad = _check_numeric(grad, "backward(grad)")
    if grad.dtype.kind == "c" and root.data.dtype.kind != "c":
        raise EveryOError(f"backward(grad): grad is {grad.dtype} (complex) for a "
                          f"{root.data.dtype} tensor; its imaginary part has nowhere to go")
    grad = grad.astype(root.data.dtype, copy=False)
    if grad.shape != root.shape:
        raise EveryOError(f"backward(grad): grad shape {grad.shape} != tensor shape {root.shape}")
    return grad


def raise_shape_mismatch(op, got: tuple, expected: tuple) -> None:
    """Raise the error for a ``backward`` that returned a gradient of the wrong shape."""
    raise EveryOError(f"op {type(op).__name__}: backward returned a gradient of shape {got} "
                      f"for an operand of shape {expected}")


def accumulate_leaf(t: Tensor, g: Any, copy: bool) -> None:
    """Add the gradient ``g`` into leaf ``t``'s ``.grad`` (``copy``: ``g`` may be shared)."""
    if not t.requires_grad:
        return
    if t.grad is None:
        # NOTE: copy when the array may be shared (a pass-through or a view), so that an
        # in-place edit of one leaf's .grad never changes another's; NumPy's 0-d arithmetic
        # gives scalars, made arrays here (a scalar .grad cannot be changed in place).
        t.grad = np.array(g, copy=True) if copy or type(g) is not np.ndarray else g
    else:
        t.grad += g


def zero_gradients(params, set_to_none, owner: str) -> None:
    """``zero_grad(set_to_none)`` of ``owner`` (a Module or an optimizer), PyTorch's meaning:
    every ``.grad`` becomes None, or with ``set_to_none=False`` zeros of its shape and dtype
    (a new array, so what recorded the old one, as a step inside backward does, sees a new
    gradient; a ``.grad`` that is None stays None)."""
    if not isinstance(set_to_none, (bool, np.bool_)):
        raise EveryOError(f"{owner}.zero_grad: set_to_none must be True or False, got "
                          f"{set_to_none!r} ({type(set_to_none).__name__})")
    for p in params:
        p.grad = None if set_to_none or p.grad is None else np.zeros_like(p.grad)
