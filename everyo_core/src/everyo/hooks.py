"""Gradient hooks: ``Tensor.register_hook``, ``Parameter.register_post_accumulate_grad_hook``
and ``Parameter.register_grad_rows_ready_hook``.

Hooks live in three tables keyed by object id (Tensor and Op have ``__slots__``, so there is no
room on them that would not cost every tensor a store): a tensor hook of a leaf is keyed by
the tensor, of a non-leaf by the op that produced it (so it runs even after the Python tensor
object is gone, as in PyTorch). An entry disappears with its key object.
"""

from __future__ import annotations

import weakref

from everyo.errors import EveryOError
from everyo.validation import ArgumentError

# id(leaf tensor or producing op) -> list of fn(grad) -> grad | None
tensor_hooks: dict[int, list] = {}
# id(parameter) -> list of fn(param) -> None
post_accumulate_hooks: dict[int, list] = {}
# id(parameter) -> list of fn(param, start, stop) -> None
rows_ready_hooks: dict[int, list] = {}


class RemovableHandle:
    """Returned by the ``register_*hook`` methods; ``handle.remove()`` unregisters the hook.

    Example:
        >>> import everyo as eo
        >>> x = eo.ones(2, requires_grad=True)
        >>> handle = x.register_hook(lambda g: g * 2)
        >>> handle.remove()
    """

    __slots__ = ("_table", "_key", "_fn")

    def __init__(self, table: dict, key: int, fn) -> None:
        self._table, self._key, self._fn = table, key, fn

    def remove(self) -> None:
        """Unregister the hook (a second call does nothing)."""
        fns = self._table.get(self._key)
        if fns is not None and self._fn in fns:
            fns.remove(self._fn)
            if not fns:
                del self._table[self._key]


def add_hook(table: dict, owner, fn) -> RemovableHandle:
    """Register ``fn`` in ``table`` under ``owner`` (dropped when ``owner`` is collected)."""
    if not callable(fn):
        raise ArgumentError(f"a hook must be callable, got {type(fn).__name__}")
    key = id(owner)
    fns = table.get(key)
    if fns is None:
        table[key] = fns = []
        weakref.finalize(owner, table.pop, key, None)
    fns.append(fn)
    return RemovableHandle(table, key, fn)


def register_hook(tensor, fn) -> RemovableHandle:
    """Run ``fn(grad)`` when the gradient with respect to ``tensor`` has been computed.

    ``grad`` is the NumPy array of the total gradient for this backward pass; ``fn`` may
    return a replacement (same shape) that is used instead, or None to keep it.
    """
    if not tensor.requires_grad:
        raise EveryOError(f"register_hook on a tensor (shape {tensor.shape}) that does not "
                          f"require grad: no gradient will ever reach it")
    owner = tensor if tensor._ctx is None else tensor._ctx
    return add_hook(tensor_hooks, owner, fn)


class EarlyHook:
    """A post-accumulate hook registered with ``early=True``: it promises to write no tensor
    in place (it reads ``param.grad``, e.g. to send it), so the engine may run it inside the
    backward of the op that produced the gradient, before that op computes its other
    operands' gradients."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, param) -> None:
        self.fn(param)


def register_post_accumulate_grad_hook(param, fn, early: bool = False) -> RemovableHandle:
    """Run ``fn(param)`` once per backward pass, right after ``param.grad`` is final.

    Args:
        param: a leaf tensor that requires grad (a Parameter).
        fn: called with ``param``.
        early: ``fn`` writes no tensor in place, so it may run as soon as the gradient exists,
            inside the producing op's backward (see docs/autograd.md). Default: after that
            op's whole backward, as in PyTorch.
    Returns:
        A :class:`RemovableHandle`.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0, 2.0])
        >>> handle = w.register_post_accumulate_grad_hook(lambda p: None, early=True)
        >>> handle.remove()
    """
    if param._ctx is not None or not param.requires_grad:
        raise EveryOError("register_post_accumulate_grad_hook needs a leaf tensor that "
                          "requires grad (a Parameter)")
    if not callable(fn):
        raise ArgumentError(f"a hook must be callable, got {type(fn).__name__}")
    return add_hook(post_accumulate_hooks, param, EarlyHook(fn) if early else fn)


def register_grad_rows_ready_hook(param, fn) -> RemovableHandle:
    """Run ``fn(param, start, stop)`` when rows ``start:stop`` of ``param.grad`` are final.

    Rows are slices along the first axis. An op that computes a large gradient in row blocks
    (``matmul``'s weight, see docs/autograd.md) hands them over one at a time; when the
    parameter is finalised inside that op (all its post-accumulate hooks are early, it has no
    tensor hooks and no other use in the graph) the engine adds each block into ``param.grad``
    and calls ``fn`` with the rows just made final: in order, contiguous, from row 0 to the
    last. Then the post-accumulate hooks run once, as always. A parameter whose gradient comes
    whole gets no call: a post-accumulate hook is the one signal every backward gives. Like an
    early post-accumulate hook, ``fn`` must write no tensor in place; rows past ``stop`` may
    not be computed yet.

    Args:
        param: a leaf tensor that requires grad (a Parameter).
        fn: called with ``param`` and the final rows' bounds.
    Returns:
        A :class:`RemovableHandle`.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([[1.0], [2.0]])
        >>> handle = w.register_grad_rows_ready_hook(lambda p, start, stop: None)
        >>> handle.remove()
    """
    if param._ctx is not None or not param.requires_grad:
        raise EveryOError("register_grad_rows_ready_hook needs a leaf tensor that requires "
                          "grad (a Parameter)")
    return add_hook(rows_ready_hooks, param, fn)


def run_post_accumulate_hooks(param) -> None:
    """Call ``param``'s post-accumulate hooks (its ``.grad`` is final for this pass)."""
    for fn in list(post_accumulate_hooks.get(id(param), ())):
        fn(param)


def only_early_hooks(key: int) -> bool:
    """True when every post-accumulate hook of the leaf with id ``key`` was registered with
    ``early=True`` (or it has none)."""
    return all(type(fn) is EarlyHook for fn in post_accumulate_hooks.get(key, ()))


def active() -> bool:
    """True when some hook is registered (backward then takes the general engine)."""
    return bool(tensor_hooks) or bool(post_accumulate_hooks) or bool(rows_ready_hooks)
