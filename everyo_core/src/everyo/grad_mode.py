"""Whether operations record a graph: ``no_grad`` / ``enable_grad`` (context-local)."""

from __future__ import annotations

import functools
from contextvars import ContextVar

_grad_enabled: ContextVar[bool] = ContextVar("everyo_grad_enabled", default=True)


def is_grad_enabled() -> bool:
    """True when new operations record the graph needed for ``backward()``."""
    return _grad_enabled.get()


class _GradMode:
    _mode = True

    def __init__(self) -> None:
        self._tokens: list = []

    def __enter__(self):
        self._tokens.append(_grad_enabled.set(self._mode))
        return self

    def __exit__(self, *exc) -> None:
        _grad_enabled.reset(self._tokens.pop())

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Context manager and decorator: operations inside record no graph.

    Example:
        >>> import everyo as eo
        >>> w = eo.ones(2, requires_grad=True)
        >>> with eo.no_grad():
        ...     y = w * 2
        >>> y.requires_grad
        False
    """

    _mode = False


class enable_grad(_GradMode):
    """Context manager and decorator: re-enable graph recording inside ``no_grad``."""

    _mode = True
