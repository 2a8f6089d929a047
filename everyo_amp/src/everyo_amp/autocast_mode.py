"""``eo.autocast``: run the ops a precision policy names in float16, through cast nodes.

Autocast is a dispatch interceptor (see ``everyo.dispatch.set_interceptor``). For an op in the
policy's ``ops``, every float32 operand is routed through the core's differentiable ``cast`` op
before the op runs, so the op computes in float16 and the cast's backward hands each operand
its gradient in its own dtype: float32 parameters get float32 gradients, float16 activations
float16 ones. For an op in the policy's ``upcast`` list, float16 operands are cast up to float32
the same way. Every other op is left alone.

The interceptor lives in a ``ContextVar``: it is local to the thread (and asyncio task) that
entered the block, it is restored on exit even when the block raises, and when no block is
active dispatch pays one ``ContextVar.get()``.

Weight casts are not cached: every use of a float32 parameter casts its current value. A cache
keyed by the parameter would go stale when an optimizer updates ``param.data`` in place inside
the block, and the core keeps no version counter to detect that (see docs/mixed_precision.md
for the measured cost of recasting).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from everyo import EveryOError, Tensor, dispatch, registry
from everyo.dispatch import current_interceptor, reset_interceptor, set_interceptor
from everyo_amp.policy import AutocastPolicy

_F64 = np.dtype(np.float64)


def _cast_operand(operand, target: np.dtype, lowering: bool):
    """``operand`` in ``target`` if it is an eligible floating tensor or array, else as is."""
    if isinstance(operand, Tensor):
        dtype = operand.data.dtype
    elif isinstance(operand, np.ndarray):
        dtype = operand.dtype
    else:
        return operand  # Python scalars take the dtype of the tensor they meet
    if dtype == target or dtype.kind != "f":
        return operand
    # NOTE: lowering never touches float64 (as in PyTorch: float64 is an explicit request for
    # precision, and it keeps eo.gradcheck meaningful inside a block); upcasting only widens.
    if lowering and dtype == _F64:
        return operand
    if not lowering and dtype.itemsize >= target.itemsize:
        return operand
    if isinstance(operand, Tensor):
        return dispatch("cast", operand, dtype=target)
    return operand.astype(target)


def make_interceptor(policy: AutocastPolicy, base=None):
    """The dispatch interceptor applying ``policy``, then ``base`` (another interceptor) if any.

    Args:
        policy: what to cast.
        base: a non-autocast interceptor that was active when the block was entered; it keeps
            running inside the block.

    Returns:
        ``intercept(name, operands) -> operands``, carrying ``.policy`` and ``.base``.

    Example:
        >>> import everyo as eo
        >>> from everyo_amp import AutocastPolicy, make_interceptor
        >>> intercept = make_interceptor(AutocastPolicy(ops={"mul"}, dtype="float16"))
        >>> [t.dtype for t in intercept("mul", (eo.ones(2), eo.ones(2)))]
        ['float16', 'float16']
        >>> intercept("add", (eo.ones(2),))[0].dtype
        'float32'
    """
    lower_ops, upcast_ops = policy.ops, policy.upcast
    lower, upper = np.dtype(policy.dtype), np.dtype(policy.upcast_dtype)

    def intercept(name, operands):
        if name in lower_ops:
            operands = tuple([_cast_operand(o, lower, True) for o in operands])
        elif name in upcast_ops:
            operands = tuple([_cast_operand(o, upper, False) for o in operands])
        return operands if base is None else base(name, operands)

    intercept.policy = policy
    intercept.base = base
    return intercept


@functools.lru_cache(maxsize=64)
def _cached_interceptor(policy: AutocastPolicy):
    return make_interceptor(policy)


def _resolve_policy(policy, dtype) -> AutocastPolicy:
    if isinstance(policy, str):
        policies = registry("autocast_policies")
        found = policies.get(policy)
        if found is None:
            raise EveryOError(f"autocast: no autocast policy named {policy!r} is registered; "
                              f"registered policies: {sorted(policies.items)}")
        policy = found
    if not isinstance(policy, AutocastPolicy):
        # NOTE: a third-party policy only has to provide .ops and .dtype (the hook's contract).
        policy = AutocastPolicy(ops=policy.ops, dtype=policy.dtype,
                                upcast=getattr(policy, "upcast", frozenset()),
                                upcast_dtype=getattr(policy, "upcast_dtype", "float32"))
    if dtype is not None:
        policy = policy.with_dtype(dtype)
    return policy


def active_policy() -> AutocastPolicy | None:
    """The policy of the innermost enabled autocast block in this context, or None.

    Example:
        >>> import everyo as eo, everyo_amp
        >>> with eo.autocast():
        ...     everyo_amp.active_policy().dtype
        'float16'
        >>> everyo_amp.active_policy() is None
        True
    """
    return getattr(current_interceptor(), "policy", None)


def is_autocast_enabled() -> bool:
    """True inside an enabled ``autocast`` block (in this thread or task).

    Example:
        >>> import everyo as eo, everyo_amp
        >>> with eo.autocast():
        ...     inside = everyo_amp.is_autocast_enabled()
        >>> inside, everyo_amp.is_autocast_enabled()
        (True, False)
    """
    return active_policy() is not None


class autocast:  # noqa: N801 - a context manager named like PyTorch's
    """Context manager and decorator: ops in the policy's allowlist run in float16.

    Args:
        enabled: ``False`` makes a full-precision island inside an enabled block.
        dtype: the lower precision; defaults to the policy's (``"float16"`` for the default).
        policy: a registered policy's name, or an ``AutocastPolicy``.

    Example:
        >>> import everyo as eo
        >>> x, w = eo.ones(2, 3), eo.ones(3, 4, requires_grad=True)
        >>> with eo.autocast():
        ...     y = x @ w
        ...     with eo.autocast(False):
        ...         z = x @ w
        >>> y.dtype, z.dtype, (x @ w).dtype
        ('float16', 'float32', 'float32')
    """

    def __init__(self, enabled: bool = True, dtype=None, policy="default"):
        if not isinstance(enabled, (bool, int, np.bool_)):
            # NOTE: PyTorch's first argument is device_type; eo.autocast("cpu") must not pass.
            raise EveryOError(f"autocast(enabled=...) takes a bool, got {enabled!r}; there is no "
                              f"device argument (pass dtype='float16' to choose the precision)")
        self.enabled = bool(enabled)
        self.dtype = dtype
        self.policy = _resolve_policy(policy, dtype)
        # NOTE: one token stack per thread, so one instance shared by threads stays correct.
        self._tokens: dict[int, list] = {}

    def __enter__(self) -> "autocast":
        previous = current_interceptor()
        base = getattr(previous, "base", previous) if previous is not None else None
        if not self.enabled:
            interceptor = base
        elif base is None:
            interceptor = _cached_interceptor(self.policy)
        else:
            interceptor = make_interceptor(self.policy, base)
        token = set_interceptor(interceptor)
        self._tokens.setdefault(threading.get_ident(), []).append(token)
        return self

    def __exit__(self, *exc_info) -> bool:
        ident = threading.get_ident()
        stack = self._tokens[ident]
        reset_interceptor(stack.pop())
        if not stack:
            del self._tokens[ident]
        return False

    def __call__(self, fn):
        if not callable(fn):
            raise EveryOError(f"autocast(...) decorates a function, got {type(fn).__name__}")

        @functools.wraps(fn)
        def with_autocast(*args, **kwargs):
            with autocast(self.enabled, policy=self.policy):
                return fn(*args, **kwargs)

        return with_autocast

    def __repr__(self) -> str:
        return f"autocast(enabled={self.enabled}, dtype={self.policy.dtype!r})"
