"""Op converters are keyed by op class; the core's op classes are found by their registered
name, so that everyo-onnx depends on the op registry and not on the core's module layout."""

from __future__ import annotations

import everyo


def by_op_name(table: dict) -> dict:
    """``{op name: converter}`` as ``{op class: converter}``, through ``eo.registry("ops")``.

    Args:
        table: converters by the name each op is registered under (``"add"``, ``"matmul"``).

    Returns:
        The same converters keyed by the classes registered under those names.

    Example:
        >>> import everyo as eo
        >>> list(by_op_name({"add": print})) == [eo.registry("ops")["add"]]
        True
    """
    ops = everyo.registry("ops")
    return {ops[name]: converter for name, converter in table.items()}
