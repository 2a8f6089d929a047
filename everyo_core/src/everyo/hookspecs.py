"""Every hook an EveryO plugin can implement.

Each hook receives a ``register`` callable; the plugin calls ``register(name_or_key, thing)``
once per thing it provides. The host validates what it receives and refuses to overwrite a name
another plugin already owns unless the call passes ``override=True``.

A plugin is a module (or any object) with functions decorated by ``everyo.hookimpl``::

    from everyo import hookimpl

    @hookimpl
    def everyo_register_layers(register):
        register("Double", Double)

Plugins are discovered through the ``everyo`` entry-point group; see ``docs/plugins.md``.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

PROJECT_NAME = "everyo"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[..., None]


@hookspec
def everyo_register_ops(register: Register) -> None:
    """Register differentiable ops: ``register(name: str, op_class: type[everyo.Op])``.

    ``name`` is what ``everyo.dispatch(name, ...)`` and ``eo.<name>(...)`` use, and what an
    autocast policy names in its allowlist. ``op_class`` subclasses ``everyo.Op`` and implements
    ``forward`` and ``backward`` on NumPy arrays.
    """


@hookspec
def everyo_register_layers(register: Register) -> None:
    """Register modules and their functional forms: ``register(name: str, obj)``.

    ``obj`` is an ``everyo.Module`` subclass (a layer or a loss) or a plain callable (a
    functional form such as ``cross_entropy``, a scheduler, ``clip_grad_norm_``). Every name
    becomes reachable as ``eo.<name>`` after ``import everyo``.
    """


@hookspec
def everyo_register_api(register: Register) -> None:
    """Register any other public name exposed as ``eo.<name>``: ``register(name, obj)``.

    For things that are neither ops nor layers: ``autocast``, ``GradScaler``, ``export_onnx``.
    """


@hookspec
def everyo_register_autocast_policies(register: Register) -> None:
    """Register a mixed-precision policy: ``register(name: str, policy)``.

    ``policy`` is an object with ``ops`` (the op names whose floating operands are cast) and
    ``dtype`` (the lower precision, e.g. ``"float16"``). ``eo.autocast(policy=name)`` picks one;
    the default policy is named ``"default"``.
    """


@hookspec
def everyo_register_onnx_converters(register: Register) -> None:
    """Register an ONNX converter for one class: ``register(cls, converter)``.

    For a Module subclass, ``converter(layer, ctx, input_name) -> output_name`` emits the whole
    layer; for an ``everyo.Op`` subclass, ``converter(ctx, *input_names, **attrs) -> output_name``
    emits the op wherever a traced forward calls it. Both append nodes through the exporter's
    graph context ``ctx`` (see docs/onnx.md).
    """


@hookspec
def everyo_register_backends(register: Register) -> None:
    """Register a process-group backend: ``register(name: str, factory)``.

    ``factory(**options) -> ProcessGroup`` creates the group for the calling process; it is what
    ``everyo.distributed.init(backend=name, ...)`` calls.
    """


HOOK_KINDS: dict[str, str] = {
    "ops": "everyo_register_ops",
    "layers": "everyo_register_layers",
    "api": "everyo_register_api",
    "autocast_policies": "everyo_register_autocast_policies",
    "onnx_converters": "everyo_register_onnx_converters",
    "backends": "everyo_register_backends",
}

__all__ = ["hookimpl", "hookspec", "HOOK_KINDS", "Any"]
