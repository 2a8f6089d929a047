"""Converters are registered for classes but written keyed by the name each class is
registered under: an op's (``"add"``, ``"conv2d"``) or a layer's (``"Conv2D"``). everyo-onnx
thus depends on the registries, not on the module layout of the core or of everyo-layers.

A table is resolved whole or not at all: when none of its names is registered (everyo-layers
is not installed, or disabled) it converts nothing and is left out; when only some are, a
name is misspelt or its plugin lost it, and the plugin refuses to load, naming them.
"""

from __future__ import annotations

import everyo


def by_op_name(table: dict) -> dict:
    """``{op name: converter}`` as ``{op class: converter}``, through ``eo.registry("ops")``.

    Args:
        table: converters by the name each op is registered under (``"add"``, ``"matmul"``).

    Returns:
        The same converters keyed by the classes registered under those names; empty when
        none of the names is registered.

    Example:
        >>> import everyo as eo
        >>> list(by_op_name({"add": print})) == [eo.registry("ops")["add"]]
        True
    """
    return _by_name("ops", table)


def by_layer_name(table: dict) -> dict:
    """``{layer name: converter}`` as ``{layer class: converter}``, through
    ``eo.registry("layers")`` (see :func:`by_op_name`).

    Example:
        >>> import everyo as eo
        >>> list(by_layer_name({"ReLU": print})) == [eo.ReLU]
        True
    """
    return _by_name("layers", table)


def _by_name(kind: str, table: dict) -> dict:
    registered = everyo.registry(kind)
    missing = [name for name in table if name not in registered]
    if len(missing) == len(table):
        return {}  # the plugin that registers them is not loaded
    if missing:
        raise everyo.PluginError(
            f"ONNX converters are written for {kind} {missing}, which no loaded plugin "
            f"registers, beside {sorted(set(table) - set(missing))}, which are registered")
    return {registered[name]: converter for name, converter in table.items()}
