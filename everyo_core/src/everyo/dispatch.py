"""The one place every op call goes through.

``dispatch(name, *operands, **attrs)`` looks the op up in the registry and applies it. Before
that, an *interceptor* may rewrite the operands: this is how a precision policy (autocast) routes
the operands of ``matmul`` through a cast node without the core knowing anything about float16.
When no interceptor is active the cost is one ``ContextVar.get()``.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any, Callable

from everyo.errors import EveryOError

#: name -> Op subclass. Filled by the plugin host from ``everyo_register_ops`` hooks.
OPS: dict[str, Any] = {}

Interceptor = Callable[[str, tuple], tuple]
_interceptor: ContextVar[Interceptor | None] = ContextVar("everyo_dispatch_interceptor", default=None)


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
    interceptor = _interceptor.get()
    if interceptor is not None:
        operands = interceptor(name, operands)
    try:
        op = OPS[name]
    except KeyError:
        raise EveryOError(
            f"unknown op {name!r}: no installed plugin registered it (see `everyo plugins`)"
        ) from None
    return op.apply(*operands, **attrs)


def set_interceptor(interceptor: Interceptor | None) -> Token:
    """Install ``interceptor(name, operands) -> operands`` for the current context.

    Returns the token to pass to :func:`reset_interceptor`. Used by precision policies.
    """
    return _interceptor.set(interceptor)


def reset_interceptor(token: Token) -> None:
    """Restore the interceptor that was active before :func:`set_interceptor`."""
    _interceptor.reset(token)


def current_interceptor() -> Interceptor | None:
    """The interceptor active in this context, or None."""
    return _interceptor.get()
