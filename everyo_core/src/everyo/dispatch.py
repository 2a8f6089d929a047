"""The one place every op call goes through.

``dispatch(name, *operands, **attrs)`` looks the op up in the registry and applies it. Around
that, a stack of *interceptors* may act: a precision policy (autocast) routes the operands of
``matmul`` through a cast node, and the ONNX exporter records each op while tracing a forward
pass, without the core knowing anything about float16 or ONNX. When no interceptor is active the
cost is one ``ContextVar.get()``.

An interceptor is ``fn(name, operands, attrs, proceed) -> Tensor``. It may rewrite the operands
or attributes and must return ``proceed(operands, attrs)`` (the rest of the stack, then the op)
or a result of its own. The most recently pushed interceptor runs first.

``Tensor.shape`` is the one Tensor attribute an interceptor may need to answer differently (the
ONNX tracer hands out symbolic sizes): :func:`answering_shape` sets, for one context, the
function that answers it. Nothing ever patches the ``Tensor`` class.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, Callable, Iterator

from everyo.errors import EveryOError

#: name -> Op subclass. Filled by the plugin host from ``everyo_register_ops`` hooks.
OPS: dict[str, Any] = {}

Proceed = Callable[[tuple, dict], Any]
Interceptor = Callable[[str, tuple, dict, Proceed], Any]
_interceptors: ContextVar[tuple] = ContextVar("everyo_dispatch_interceptors", default=())

#: ``fn(tensor) -> tuple`` answering ``Tensor.shape`` in this context; None: the array's shape.
shape_hook: ContextVar[Callable[[Any], tuple] | None] = ContextVar("everyo_shape_hook",
                                                                   default=None)


def dispatch(name: str, *operands: Any, **attrs: Any):
    """Apply the registered op ``name`` to ``operands``.

    Args:
        name: the op's registered name (``"matmul"``, ``"add"``, ...).
        *operands: tensors, arrays or Python scalars; the op's differentiable inputs.
        **attrs: non-differentiable attributes (``axis=``, ``shape=``...).

    Returns:
        The output ``Tensor``.

    Example:
        >>> import everyo as eo
        >>> eo.dispatch("add", eo.tensor([1.0]), 2.0).data
        array([3.], dtype=float32)
    """
    stack = _interceptors.get()
    if stack:
        return _through(stack, len(stack) - 1, name, operands, attrs)
    return _apply(name, operands, attrs)


def _apply(name: str, operands: tuple, attrs: dict):
    try:
        op = OPS[name]
    except KeyError:
        raise EveryOError(
            f"unknown op {name!r}: no installed plugin registered it (see `everyo plugins`)"
        ) from None
    return op.apply(*operands, **attrs)


def _through(stack: tuple, level: int, name: str, operands: tuple, attrs: dict):
    if level < 0:
        return _apply(name, operands, attrs)

    def proceed(operands: tuple, attrs: dict = attrs):
        return _through(stack, level - 1, name, tuple(operands), attrs)

    return stack[level](name, operands, attrs, proceed)


def push_interceptor(interceptor: Interceptor) -> Token:
    """Put ``interceptor`` on top of this context's stack; it runs before those already there.

    Returns the token to pass to :func:`pop_interceptor`.

    Example:
        >>> import everyo as eo
        >>> from everyo.dispatch import pop_interceptor, push_interceptor
        >>> seen = []
        >>> def record(name, operands, attrs, proceed):
        ...     seen.append(name)
        ...     return proceed(operands, attrs)
        >>> token = push_interceptor(record)
        >>> _ = eo.ones(2) * 2.0
        >>> pop_interceptor(token)
        >>> seen
        ['mul']
    """
    if not callable(interceptor):
        raise EveryOError(f"an interceptor must be callable, got {type(interceptor).__name__}")
    return _interceptors.set(_interceptors.get() + (interceptor,))


def pop_interceptor(token: Token) -> None:
    """Restore the stack as it was before the :func:`push_interceptor` that returned ``token``."""
    _interceptors.reset(token)


@contextmanager
def intercepting(interceptor: Interceptor) -> Iterator[None]:
    """``with intercepting(fn):`` pushes ``fn`` for the block and pops it afterwards."""
    token = push_interceptor(interceptor)
    try:
        yield
    finally:
        pop_interceptor(token)


def active_interceptors() -> tuple:
    """The interceptors active in this context, outermost first."""
    return _interceptors.get()


@contextmanager
def answering_shape(fn: Callable[[Any], tuple]) -> Iterator[None]:
    """``with answering_shape(fn):`` makes ``tensor.shape`` return ``fn(tensor)`` in this
    context for the block (``fn`` reads ``tensor.data.shape`` for the plain answer).

    Example:
        >>> import everyo as eo
        >>> with answering_shape(lambda t: ("rows",) + t.data.shape[1:]):
        ...     eo.ones(2, 3).shape
        ('rows', 3)
    """
    if not callable(fn):
        raise EveryOError(f"a shape hook must be callable, got {type(fn).__name__}")
    token = shape_hook.set(fn)
    try:
        yield
    finally:
        shape_hook.reset(token)
