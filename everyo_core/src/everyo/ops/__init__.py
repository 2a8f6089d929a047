"""The core's ops, registered through ``everyo_register_ops`` like any plugin's."""

from everyo.ops import (
    arithmetic,
    comparison,
    einsum,
    gather,
    inplace,
    layout,
    linalg,
    padding,
    reduction,
    shape,
    unary,
)


def core_ops() -> dict:
    """name -> Op class for every op the core provides."""
    ops: dict = {}
    for module in (arithmetic, unary, reduction, shape, linalg, layout, gather, einsum, padding,
                   comparison, inplace):
        ops.update(module.OPS)
    return ops
