"""What the tracer changes on ``Tensor`` while it runs: the ``shape`` property and the
comparison operators.

Neither goes through dispatch: ``shape`` is a property reading the array, and ``x > 0`` builds
its boolean result directly. During a trace the first must hand out ``SymInt`` sizes and the
second must appear in the graph (a causal mask written ``mask[:t, :t] == 0`` would otherwise be
baked in as a constant). A property cannot be overridden per instance (Tensor has __slots__)
and ops build their outputs as plain Tensors, so the class attributes are swapped for the
trace and restored afterwards; outside a trace (other threads included: the tracer lives in a
ContextVar) they answer exactly as before.
"""

from __future__ import annotations

import contextlib
import threading
from contextvars import ContextVar

from everyo import Tensor

active_tracer: ContextVar = ContextVar("everyo_onnx_tracer", default=None)

#: Tensor dunder -> ONNX comparison (``ne`` is ``Not(Equal)``).
COMPARISONS = {"lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
               "eq": "Equal", "ne": "Equal"}

_plain_shape = Tensor.shape
_plain_comparisons = {name: getattr(Tensor, f"__{name}__") for name in COMPARISONS}


def _traced_shape(tensor: Tensor):
    tracer = active_tracer.get()
    return tracer.symbolic_shape(tensor) if tracer is not None else tensor.data.shape


def _traced_comparison(name: str):
    plain = _plain_comparisons[name]

    def compare(self, other):
        result = plain(self, other)
        tracer = active_tracer.get()
        if tracer is None or not isinstance(result, Tensor):
            return result
        return tracer.on_comparison(name, self, other, result)

    compare.__name__ = f"__{name}__"
    return compare


_lock = threading.Lock()
_users = [0]  # traces running now, in any thread: the last one out restores the originals


@contextlib.contextmanager
def traced_tensor_methods():
    """Swap in the tracing ``shape`` and comparisons for the duration of the block."""
    with _lock:
        if not _users[0]:
            Tensor.shape = property(_traced_shape, doc=_plain_shape.__doc__)
            for name in COMPARISONS:
                setattr(Tensor, f"__{name}__", _traced_comparison(name))
        _users[0] += 1
    try:
        yield
    finally:
        with _lock:
            _users[0] -= 1
            if not _users[0]:
                Tensor.shape = _plain_shape
                for name, method in _plain_comparisons.items():
                    setattr(Tensor, f"__{name}__", method)
