"""The core's differentiable ops, registered through ``everyo_register_ops`` like any plugin's."""

from everyo.ops import arithmetic, einsum, gather, layout, linalg, padding, reduction, shape, unary


def core_ops() -> dict:
    """name -> Op class for every op the core provides."""
    ops: dict = {}
    for module in (arithmetic, unary, reduction, shape, linalg, layout, gather, einsum, padding):
        ops.update(module.OPS)
    return ops
