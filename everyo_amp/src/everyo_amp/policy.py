"""Precision policies: which ops run in the lower precision, and which are kept in float32.

A policy is data, not code: ``autocast`` turns it into a dispatch interceptor. The default
policy is registered by this distribution's plugin through ``everyo_register_autocast_policies``
exactly as a third-party policy would be.
"""

from __future__ import annotations

from dataclasses import dataclass

from everyo import EveryOError
from everyo.dtypes import is_floating, resolve_dtype

#: Ops whose float32 operands are cast down: the two BLAS-shaped ops, where 16 bits are safe
#: (products accumulate in float32) and where the memory of saved activations is.
LOWER_PRECISION_OPS = frozenset({"matmul", "conv2d"})

#: Ops that must see float32 even when an operand is a float16 activation: sums over many
#: values, exponentials and logarithms, normalisation statistics and losses, where float16's
#: range (max 65504, smallest subnormal 6e-8) runs out. Names an installed plugin does not
#: register are harmless: they simply never match.
FLOAT32_OPS = frozenset({
    # core reductions and transcendental functions
    "sum", "mean", "var", "exp", "log", "pow", "softmax", "log_softmax",
    # everyo-layers' losses, normalisation statistics and attention's softmax
    "mse_loss", "l1_loss", "cross_entropy", "nll_loss", "bce_with_logits", "layer_norm",
    "batch_norm", "attention_weights",
})


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


DEFAULT_POLICY = AutocastPolicy(ops=LOWER_PRECISION_OPS, dtype="float16", upcast=FLOAT32_OPS)

#: The same lists with bfloat16 as the lower precision: float32's range in 16 bits, so small
#: gradients do not flush to zero and no loss scaling is needed (fewer significant bits: 8
#: against float16's 11).
BFLOAT16_POLICY = DEFAULT_POLICY.with_dtype("bfloat16")
