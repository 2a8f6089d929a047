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

from dataclasses import dataclass
from typing import Callable

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
    ``forward`` and ``backward`` on NumPy arrays. It may declare ``precision`` (see
    ``DECLARATIONS``).
    """


@hookspec
def everyo_register_layers(register: Register) -> None:
    """Register modules and their functional forms: ``register(name: str, obj)``.

    ``obj`` is an ``everyo.Module`` subclass (a layer or a loss) or a plain callable (a
    functional form such as ``cross_entropy``, a scheduler, ``clip_grad_norm_``). Every name
    becomes reachable as ``eo.<name>`` after ``import everyo``. A layer class may declare
    ``onnx_export`` (see ``DECLARATIONS``).
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
def everyo_register_state_converters(register: Register) -> None:
    """Register how one layer class's PyTorch parameters convert: ``register(cls, converter)``.

    ``converter(layer, entries, context) -> {name: array}`` takes the layer's PyTorch arrays
    with ``entries.take(name, pytorch_shape)`` and returns its EveryO arrays by name relative
    to the layer; ``eo.convert_state_dict`` calls it for every instance of ``cls`` (or of a
    subclass that registers none). See ``everyo.porting`` and docs/porting.md.
    """


@hookspec
def everyo_register_backends(register: Register) -> None:
    """Register a process-group backend: ``register(name: str, factory)``.

    ``factory(**options) -> ProcessGroup`` creates the group for the calling process; it is what
    ``everyo.distributed.init(backend=name, ...)`` calls.
    """


@hookspec
def everyo_register_modules(register: Register) -> None:
    """Register a public module: ``register(name: str, module_path: str)``.

    ``module_path`` is a dotted import path (``"everyo_dist.api"``); it is imported on first use,
    so registering it costs nothing at ``import everyo``. ``eo.<name>`` is then that module, and
    for the first-party names that have an import path in the core (``everyo.distributed``,
    ``everyo.distributed_tcp``) so is ``import everyo.<name>``.
    """


@hookspec
def everyo_register_kernels(register: Register) -> None:
    """Register a named kernel or a kernel provider: ``register(name: str, thing)``.

    ``thing`` is an ``everyo.kernels.Kernel`` (a new kernel: its NumPy reference and its
    contract) or an ``everyo.kernels.KernelProvider`` (faster implementations of registered
    kernels, selected by ``EVERYO_KERNELS=name`` or ``everyo.kernels.use(name)``; by default the
    provider of highest ``priority``). Ops call kernels as ``everyo.kernels.kernel.<name>(...)``.
    """


@dataclass(frozen=True)
class HookKind:
    """One kind of thing a plugin can register: the single description every tool reads.

    ``kind`` names the registry (``eo.registry(kind)``), ``hook`` the hook function, ``key`` and
    ``thing`` what ``register(key, thing)`` takes, ``gives`` what the user gets, ``noun`` how
    error messages name one entry and ``plural`` how ``everyo plugins`` names several.
    """

    kind: str
    hook: str
    key: str
    thing: str
    gives: str
    noun: str
    plural: str


#: Every hook kind, in the order ``everyo plugins`` lists them. docs/plugins.md shows this table
#: (``markdown_table()``; a test checks the page against it).
HOOKS: tuple[HookKind, ...] = (
    HookKind("layers", "everyo_register_layers", "name", "`eo.Module` subclass or function",
             "`eo.<Name>`", "layer", "layers"),
    HookKind("ops", "everyo_register_ops", "name", "`eo.Op` subclass",
             "`eo.<name>(...)`, `eo.dispatch(name, ...)`", "op", "ops"),
    HookKind("api", "everyo_register_api", "name", "any callable", "`eo.<name>`",
             "name", "api"),
    HookKind("modules", "everyo_register_modules", "name", "dotted module path",
             "`eo.<name>`, imported on first use", "module", "modules"),
    HookKind("onnx_converters", "everyo_register_onnx_converters", "layer or op **class**",
             "converter function", "`eo.export_onnx` emits that layer or op",
             "ONNX converter for", "ONNX converters"),
    HookKind("state_converters", "everyo_register_state_converters", "layer **class**",
             "converter function", "`eo.convert_state_dict` converts that layer's PyTorch arrays",
             "state converter for", "state converters"),
    HookKind("backends", "everyo_register_backends", "name", "group factory",
             "`everyo.distributed.init(backend=name)`", "backend", "backends"),
    HookKind("autocast_policies", "everyo_register_autocast_policies", "name",
             "object with `.ops` and `.dtype`", "`eo.autocast(policy=name)`",
             "autocast policy", "autocast policies"),
    HookKind("kernels", "everyo_register_kernels", "name",
             "`everyo.kernels.Kernel` or `KernelProvider`",
             "`everyo.kernels.kernel.<name>(...)`, `EVERYO_KERNELS=name`", "kernel", "kernels"),
)

#: Registry kind -> hook name, for code that only needs the mapping.
HOOK_KINDS: dict[str, str] = {h.kind: h.hook for h in HOOKS}


def markdown_table() -> str:
    """The hook table as Markdown: hook, what ``register`` takes, what the user gets.

    Example:
        >>> print(markdown_table().splitlines()[0])
        | hook | `register(key, thing)` | you get |
    """
    rows = ["| hook | `register(key, thing)` | you get |", "| --- | --- | --- |"]
    rows += [f"| `{h.hook}` | {h.key}, {h.thing} | {h.gives} |" for h in HOOKS]
    return "\n".join(rows)


#: What a registered class may declare about itself, by kind: a class attribute name and the
#: values it may take. Leaving the attribute out (or ``None``) means "nothing declared". The host
#: checks every declared value when the class is registered (a typo in a value is a
#: ``PluginError`` naming the class), and tools read the declarations back from the registry
#: with ``registry(kind).declared(attribute)`` instead of keeping lists of names themselves.
#:
#: - ``Op.precision``: ``"lower"`` runs the op in autocast's lower precision (BLAS-shaped ops:
#:   ``matmul``, ``conv2d``); ``"float32"`` keeps it in float32 under autocast (sums,
#:   exponentials, logarithms, normalisation statistics, losses). Undeclared ops run in the
#:   precision of their inputs. The default autocast policy is built from these declarations.
#: - ``Module.onnx_export``: ``"refused"`` marks a layer the ONNX exporter refuses by design; the
#:   exporter names such layers in its refusal message. It reads the declaration of the exact
#:   class, as it looks converters up (a subclass may compute something else and is traced).
#:
#: Example::
#:
#:     class HuberLossOp(eo.Op):
#:         precision = "float32"   # a loss: keep it in float32 under eo.autocast
#:         __slots__ = ()
#:
#:     class MyLSTM(eo.Module):
#:         onnx_export = "refused"
DECLARATIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "ops": {"precision": ("lower", "float32")},
    "layers": {"onnx_export": ("refused",)},
}

__all__ = ["hookimpl", "hookspec", "HOOKS", "HOOK_KINDS", "DECLARATIONS", "HookKind",
           "markdown_table"]
