"""``eo.autocast``: run the ops a precision policy names in float16 or bfloat16, through cast
nodes.

Autocast is a dispatch interceptor (see ``everyo.dispatch.push_interceptor``). For an op in the
policy's ``ops``, every float32 operand is routed through the core's differentiable ``cast`` op
before the op runs, so the op computes in float16 and the cast's backward hands each operand
its gradient in its own dtype: float32 parameters get float32 gradients, float16 activations
float16 ones. For an op in the policy's ``upcast`` list, float16 operands are cast up to float32
the same way. Every other op is left alone.

The active policy lives in a ``ContextVar``: it is local to the thread (and asyncio task) that
entered the block and restored on exit even when the block raises. The interceptor is pushed
once, by the outermost enabled block, and reads the policy on each call, so ``autocast(False)``
makes a full-precision island while other interceptors (an exporter's tracer) keep running;
when no block is active dispatch pays one ``ContextVar.get()``.

Weight casts are not cached: every use of a float32 parameter casts its current value. A cache
keyed by the parameter would go stale when an optimizer updates ``param.data`` in place inside
the block (see docs/mixed_precision.md for the measured cost of recasting).

Folded weight casts: when autocast is the only interceptor, a ``matmul`` whose weight is a
float32 parameter (of at least ``FOLD_MIN_ELEMENTS`` elements) gets the parameter itself and
``lower=<dtype>`` instead of a cast node for it (and for its bias): the product rounds the
weight to 16-bit values in float32 without making the 16-bit array (keeping that rounded
weight for backward, see ``everyo.ops.linalg.KEEPS_ROUNDED_WEIGHT``) and returns the weight's
gradient already rounded and in float32. The numbers are bit for bit those of the cast nodes
(``tests/amp/test_bit_identity.py``), except the last bits of the gradient of a weight used by
three or more products, whose contributions are summed in another order (see
docs/mixed_precision.md); what differs otherwise is that the graph holds no 16-bit weight
copy (nothing else could see one: no other interceptor is active, and a tensor no user holds
can carry no hook).
"""

from __future__ import annotations

import functools
import threading
from contextvars import ContextVar

import numpy as np

from everyo import EveryOError, Tensor, dispatch, registry
from everyo.dispatch import active_interceptors, pop_interceptor, push_interceptor
from everyo.kernels import is_floating
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
    if dtype == target or not is_floating(dtype) or dtype.kind == "c":
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


#: Fold the casts of float32 parameters into the products that use them (see the module
#: docstring); False: every operand goes through a cast node (for comparisons).
FOLD_WEIGHT_CASTS = True
#: Weights with fewer elements keep their cast nodes: their conversions are small either way
#: (below this size the core converts with plain astype calls), and on cnn_cifar (a 40,960-
#: weight Linear) folding measured no faster (docs/benchmarks.md).
FOLD_MIN_ELEMENTS = 1 << 17

_F32 = np.dtype(np.float32)


def _is_master_weight(operand) -> bool:
    """A float32 parameter: a leaf that requires a gradient (its cast is folded)."""
    return (isinstance(operand, Tensor) and operand._ctx is None and operand.requires_grad
            and operand.data.dtype == _F32)


class _Casting:
    """A policy prepared for the hot path: its op sets and its two dtypes."""

    __slots__ = ("policy", "lower_ops", "upcast_ops", "lower", "upper", "folds")

    def __init__(self, policy: AutocastPolicy):
        self.policy = policy
        self.lower_ops, self.upcast_ops = policy.ops, policy.upcast
        self.lower, self.upper = np.dtype(policy.dtype), np.dtype(policy.upcast_dtype)
        self.folds = "matmul" in self.lower_ops and self.lower.itemsize == 2

    def fold(self, name: str, operands: tuple, attrs: dict):
        """``(operands, attrs)`` of a ``matmul`` whose weight cast is folded, else None."""
        if not (self.folds and name == "matmul" and FOLD_WEIGHT_CASTS and "lower" not in attrs
                and len(operands) in (2, 3) and _is_master_weight(operands[1])
                and operands[1].ndim == 2 and operands[1].data.size >= FOLD_MIN_ELEMENTS
                and isinstance(operands[0], Tensor) and operands[0].ndim >= 2):
            return None
        # (a float64 input stays float64 under autocast: such a product keeps its cast nodes)
        bias = operands[2] if len(operands) == 3 else None
        lowerable = (_F32, self.lower)
        if operands[0].data.dtype not in lowerable or not (
                bias is None or isinstance(bias, Tensor) and bias.data.dtype in lowerable):
            return None
        folded = [_cast_operand(operands[0], self.lower, True), operands[1]]
        if bias is not None:
            folded.append(bias if _is_master_weight(bias)
                          else _cast_operand(bias, self.lower, True))
        return tuple(folded), {**attrs, "lower": self.lower}

    def cast(self, name: str, operands: tuple) -> tuple:
        if name in self.lower_ops:
            return tuple([_cast_operand(o, self.lower, True) for o in operands])
        if name in self.upcast_ops:
            return tuple([_cast_operand(o, self.upper, False) for o in operands])
        return operands


_casting: ContextVar[_Casting | None] = ContextVar("everyo_autocast_policy", default=None)


def _autocast_interceptor(name, operands, attrs, proceed):
    casting = _casting.get()
    if casting is not None:
        # NOTE: folding only when no other interceptor would see the float32 weight operand
        # (an exporter's tracer records what the op receives).
        folded = casting.fold(name, operands, attrs) if len(active_interceptors()) == 1 \
            else None
        if folded is not None:
            return proceed(*folded)
        operands = casting.cast(name, operands)
    return proceed(operands, attrs)


def make_interceptor(policy: AutocastPolicy):
    """A dispatch interceptor that always applies ``policy`` (for tools that push it themselves).

    Args:
        policy: what to cast.

    Returns:
        ``intercept(name, operands, attrs, proceed)``, for ``everyo.dispatch.push_interceptor``.

    Example:
        >>> import everyo as eo
        >>> from everyo.dispatch import intercepting
        >>> from everyo_amp import AutocastPolicy, make_interceptor
        >>> with intercepting(make_interceptor(AutocastPolicy(ops={"mul"}, dtype="float16"))):
        ...     (eo.ones(2) * eo.ones(2)).dtype, (eo.ones(2) + eo.ones(2)).dtype
        ('float16', 'float32')
    """
    casting = _Casting(policy)

    def intercept(name, operands, attrs, proceed):
        return proceed(casting.cast(name, operands), attrs)

    return intercept


@functools.lru_cache(maxsize=64)
def _prepared(policy: AutocastPolicy) -> _Casting:
    return _Casting(policy)


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
    casting = _casting.get()
    return None if casting is None else casting.policy


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


class autocast:  # lowercase, like PyTorch's context manager
    """Context manager and decorator: ops in the policy's allowlist run in float16 or bfloat16.

    Args:
        enabled: ``False`` makes a full-precision island inside an enabled block.
        dtype: the lower precision, ``"float16"`` or ``"bfloat16"``; defaults to the
            policy's (``"float16"`` for the default policy, ``"bfloat16"`` for the one named
            ``"bfloat16"``).
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
        >>> with eo.autocast(dtype="bfloat16"):
        ...     (x @ w).dtype
        'bfloat16'
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
        tokens = [_casting.set(_prepared(self.policy) if self.enabled else None)]
        if _autocast_interceptor not in active_interceptors():
            tokens.append(push_interceptor(_autocast_interceptor))
        self._tokens.setdefault(threading.get_ident(), []).append(tokens)
        return self

    def __exit__(self, *exc_info) -> bool:
        ident = threading.get_ident()
        stack = self._tokens[ident]
        tokens = stack.pop()
        if len(tokens) == 2:
            pop_interceptor(tokens[1])
        _casting.reset(tokens[0])
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
