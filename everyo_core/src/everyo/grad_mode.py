"""Whether operations record a graph: ``no_grad`` / ``enable_grad`` (context-local)."""

from __future__ import annotations

import functools
import inspect
from contextvars import ContextVar

from everyo.errors import EveryOError

_grad_enabled: ContextVar[bool] = ContextVar("everyo_grad_enabled", default=True)


def is_grad_enabled() -> bool:
    """True when new operations record the graph needed for ``backward()``."""
    return _grad_enabled.get()


class _GradMode:
    """A context manager that is also a decorator, with or without parentheses (PyTorch's
    ``@torch.no_grad`` and ``@torch.no_grad()`` both work)."""

    _mode = True

    def __new__(cls, fn=None):
        if fn is None:
            return super().__new__(cls)
        if not callable(fn):
            raise EveryOError(f"{cls.__name__}() takes no arguments (it is a context manager, "
                              f"or a decorator: @{cls.__name__} or @{cls.__name__}()); got "
                              f"{type(fn).__name__}")
        return cls()(fn)

    def __init__(self, fn=None) -> None:
        self._tokens: list = []

    def __enter__(self):
        self._tokens.append(_grad_enabled.set(self._mode))
        return self

    def __exit__(self, *exc) -> None:
        _grad_enabled.reset(self._tokens.pop())

    def __call__(self, fn):
        if inspect.isgeneratorfunction(fn):
            return _generator_in_mode(fn, type(self))

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


def _generator_in_mode(fn, mode):
    """``fn`` (a generator function) whose body runs in ``mode`` each time it is resumed; the
    caller keeps its own mode between two items (as PyTorch's decorators do)."""

    @functools.wraps(fn)
    def generator(*args, **kwargs):
        gen = fn(*args, **kwargs)
        try:
            with mode():
                item = next(gen)
            while True:
                try:
                    sent = yield item
                except GeneratorExit:
                    with mode():
                        gen.close()
                    raise
                except BaseException as exc:  # (thrown in by the caller: the body handles it)
                    with mode():
                        item = gen.throw(exc)
                else:
                    with mode():
                        item = gen.send(sent)
        except StopIteration as stop:
            return stop.value

    return generator


class no_grad(_GradMode):
    """Context manager and decorator: operations inside record no graph.

    On a generator function, its body runs without recording at every item.

    Example:
        >>> import everyo as eo
        >>> w = eo.ones(2, requires_grad=True)
        >>> with eo.no_grad():
        ...     y = w * 2
        >>> y.requires_grad
        False
        >>> @eo.no_grad  # (or @eo.no_grad())
        ... def double(x):
        ...     return x * 2
        >>> double(w).requires_grad
        False
    """

    _mode = False


class enable_grad(_GradMode):
    """Context manager and decorator: re-enable graph recording inside ``no_grad``."""

    _mode = True
