"""everyo-amp: mixed precision for EveryO, as a plugin.

It registers the default precision policy (matmul and conv2d in float16, reductions,
exponentials, normalisation and losses in float32), the same lists in bfloat16 (policy
``"bfloat16"``, or ``eo.autocast(dtype="bfloat16")``) and the public names ``eo.autocast`` and
``eo.GradScaler``. See docs/mixed_precision.md.
"""

# NOTE: import the core first. Importing it loads every plugin, this one included, whose hooks
# import the modules below; doing that while one of them is half-imported would be circular.
import everyo  # noqa: I001

from everyo_amp.autocast_mode import active_policy, autocast, is_autocast_enabled, make_interceptor
from everyo_amp.grad_scaler import GradScaler
from everyo_amp.policy import BFLOAT16_POLICY, DEFAULT_POLICY, AutocastPolicy, DeclaredPolicy
from everyo_amp.underflow import ZeroCount, flushed_to_zero

__all__ = [
    "AutocastPolicy",
    "BFLOAT16_POLICY",
    "DEFAULT_POLICY",
    "DeclaredPolicy",
    "GradScaler",
    "ZeroCount",
    "active_policy",
    "autocast",
    "flushed_to_zero",
    "is_autocast_enabled",
    "make_interceptor",
]
