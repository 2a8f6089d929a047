"""Precision policies: which ops run in the lower precision, and which are kept in float32.

A policy is data, not code: ``autocast`` turns it into a dispatch interceptor. The default
policy is registered by this distribution's plugin through ``everyo_register_autocast_policies``
exactly as a third-party policy would be. It keeps no list of op names: each op declares its
precision class where it is defined (``precision = "lower"`` or ``"float32"`` on the ``Op``
class, see ``everyo.hookspecs.DECLARATIONS``), and the default policy reads those declarations
from the op registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from everyo import EveryOError, registry
from everyo.kernels import is_floating, resolve_dtype


@dataclass(frozen=True)
class AutocastPolicy:
    """What ``eo.autocast`` changes: op names to run in ``dtype``, and op names kept in float32.

    Args:
        ops: names of ops whose floating operands are cast to ``dtype`` (float64 operands are
            left alone: asking for float64 is asking for precision).
        dtype: the lower precision, e.g. ``"float16"``.
        upcast: names of ops whose lower-precision floating operands are cast up to
            ``upcast_dtype`` before the op runs.
        upcast_dtype: the precision of the ``upcast`` ops, ``"float32"`` by default.

    Example:
        >>> from everyo_amp import AutocastPolicy
        >>> policy = AutocastPolicy(ops={"matmul"}, dtype="float16")
        >>> sorted(policy.ops), policy.dtype
        (['matmul'], 'float16')
    """

    ops: frozenset
    dtype: str = "float16"
    upcast: frozenset = frozenset()
    upcast_dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", frozenset(self.ops))
        object.__setattr__(self, "upcast", frozenset(self.upcast))
        object.__setattr__(self, "dtype", floating_dtype(self.dtype, "AutocastPolicy dtype"))
        object.__setattr__(self, "upcast_dtype",
                           floating_dtype(self.upcast_dtype, "AutocastPolicy upcast_dtype"))
        both = self.ops & self.upcast
        if both:
            raise EveryOError(f"AutocastPolicy: ops {sorted(both)} are both cast down to "
                              f"{self.dtype} and kept in {self.upcast_dtype}; pick one")

    def with_dtype(self, dtype) -> "AutocastPolicy":
        """The same policy with another lower precision."""
        return AutocastPolicy(self.ops, dtype, self.upcast, self.upcast_dtype)


def floating_dtype(dtype, what: str) -> str:
    """The name of ``dtype`` if it is a floating dtype (bfloat16 included), else an ``EveryOError``.

    Args:
        dtype: anything ``np.dtype`` accepts, or ``"bfloat16"``.
        what: what the dtype is for, named in the error.

    Returns:
        The dtype's name, e.g. ``'float16'``.

    Example:
        >>> from everyo_amp.policy import floating_dtype
        >>> floating_dtype("f2", "autocast dtype")
        'float16'
    """
    resolved = resolve_dtype(dtype, what)
    if not is_floating(resolved) or resolved.kind == "c":
        raise EveryOError(f"{what} must be a floating dtype such as 'float16' or 'bfloat16', "
                          f"got {resolved.name}")
    return resolved.name


class DeclaredPolicy:
    """The policy the registered ops declare: ``precision = "lower"`` ops run in ``dtype``
    (float16 by default), ``precision = "float32"`` ops are kept in float32, every other op is
    left alone.

    Read from the op registry each time (cached until the registry changes), so an op any
    plugin registers, in any loading order, is covered by its own declaration.

    Example:
        >>> from everyo_amp import DEFAULT_POLICY
        >>> "matmul" in DEFAULT_POLICY.ops, "sum" in DEFAULT_POLICY.upcast
        (True, True)
    """

    upcast_dtype = "float32"

    def __init__(self, dtype="float16") -> None:
        self.dtype = floating_dtype(dtype, "DeclaredPolicy dtype")
        self._cache: tuple = (None, frozenset(), frozenset())

    def _classes(self) -> tuple:
        ops = registry("ops")
        version = ops.version
        if self._cache[0] != version:
            # NOTE: the version read *before* reading the declarations: a registration meanwhile
            # (another thread) then leaves the cache out of date, never marked up to date.
            declared = ops.declared("precision")
            self._cache = (version,
                           frozenset(n for n, p in declared.items() if p == "lower"),
                           frozenset(n for n, p in declared.items() if p == "float32"))
        return self._cache

    @property
    def ops(self) -> frozenset:
        """Names of the ops declaring ``precision = "lower"``."""
        return self._classes()[1]

    @property
    def upcast(self) -> frozenset:
        """Names of the ops declaring ``precision = "float32"``."""
        return self._classes()[2]

    def __repr__(self) -> str:
        return (f"DeclaredPolicy(dtype={self.dtype!r}, ops={sorted(self.ops)}, "
                f"upcast={sorted(self.upcast)})")


DEFAULT_POLICY = DeclaredPolicy("float16")

#: The same declarations with bfloat16 as the lower precision: float32's range in 16 bits, so
#: small gradients do not flush to zero and no loss scaling is needed (fewer significant bits: 8
#: against float16's 11).
BFLOAT16_POLICY = DeclaredPolicy("bfloat16")
