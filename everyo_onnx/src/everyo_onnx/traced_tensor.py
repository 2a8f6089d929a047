"""What a trace changes while it runs, all of it context-local: the active tracer and the
answer of ``Tensor.shape``.

During a trace ``x.shape`` must hand out ``SymInt`` sizes for the axes that follow the input's
size. The core owns ``Tensor``: it offers ``everyo.dispatch.answering_shape`` (a context-local
hook), and the tracer sets it for the block, so nothing on the class changes and other threads (other
contexts) see plain shapes. Comparisons need nothing here: they are dispatched ops, which the
tracer's interceptor sees like any other.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

from everyo.dispatch import answering_shape

active_tracer: ContextVar = ContextVar("everyo_onnx_tracer", default=None)


@contextlib.contextmanager
def tracing(tracer):
    """Make ``tracer`` the active one and answer ``Tensor.shape`` through it for the block."""
    token = active_tracer.set(tracer)
    try:
        with answering_shape(tracer.symbolic_shape):
            yield
    finally:
        active_tracer.reset(token)
