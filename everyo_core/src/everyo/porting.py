"""``eo.convert_state_dict``: a PyTorch state dict (or ``.safetensors`` file) as EveryO's, in
one call, every layer's layout converted by the converter its class registered.

A converter is ``converter(layer, entries, context) -> {name: array}``: it takes the layer's
PyTorch arrays from ``entries`` (:class:`CheckpointEntries`, names relative to the layer, with
the shape PyTorch stores) and returns the layer's EveryO arrays by relative name (its own
parameters and buffers, and those of its sub-modules if it converts them too). Plugins register
converters through the ``everyo_register_state_converters`` hook, keyed by layer class (a
subclass uses its nearest registered base's). A layer without one keeps PyTorch's arrays as
they are (its sub-modules are converted by theirs). docs/porting.md describes the rules.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Callable

import numpy as np

from everyo.dtypes import is_floating
from everyo.errors import EveryOError
from everyo.grad_mode import enable_grad
from everyo.module import Module
from everyo.plugins import registry
from everyo.porting_layout import LayoutUnknown, ParameterSource, pytorch_array, record_source
from everyo.tensor import Tensor

SOURCES = ("torch",)


class CheckpointMismatch(EveryOError):
    """A checkpoint entry is missing or has the wrong shape (raised by ``entries.take``)."""


class CheckpointEntries:
    """The PyTorch arrays under one layer's prefix, as its converter reads them.

    Example:
        >>> entries = CheckpointEntries("fc.", {"bias": np.zeros(3)}, "Linear(2→3)")
        >>> entries.take("bias", (3,)).shape
        (3,)
    """

    def __init__(self, prefix: str, arrays: dict, label: str):
        self.prefix, self.arrays, self.label = prefix, arrays, label
        self.taken: set = set()

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def take(self, name: str, shape: tuple) -> np.ndarray:
        """The array ``name``, which must have PyTorch's ``shape`` (else an error naming the
        checkpoint key, its shape and the one ``self.label`` expects)."""
        key = self.prefix + name
        if name not in self.arrays:
            raise CheckpointMismatch(f"missing key {key!r} ({self.label} expects shape "
                                     f"{tuple(shape)})")
        self.taken.add(name)
        array = self.arrays[name]
        if array.shape != tuple(shape):
            raise CheckpointMismatch(f"{key!r} has shape {array.shape} in the checkpoint but "
                                     f"{self.label} expects {tuple(shape)} (PyTorch's layout)")
        return array


class ConversionContext:
    """What converters may ask beyond their arrays: the shape the model's example input
    had at each layer, found by running ``example_input`` through the model once."""

    def __init__(self, model: Module, example_input=None):
        self.traced = example_input is not None
        self.flattened: dict[int, tuple | None] = {}
        self.untraced_hazard = None if self.traced else _flatten_hazard(model)
        if self.traced:
            trace_flattened_inputs(model, example_input, self.flattened)

    def flattened_input(self, layer: Module) -> tuple | None:
        """``(*spatial, channels)`` when ``layer``'s input is channels-last conv features
        flattened to ``(batch, features)`` (see :func:`flatten_origin`), else None. Without
        an example input, a model that may flatten conv features (see :func:`_flatten_hazard`)
        is refused (the answer is unknown) and any other gives None."""
        if not self.traced:
            if self.untraced_hazard:
                raise EveryOError(f"{self.untraced_hazard}: pass example_input= (one input "
                                  f"batch) so that a layer reading flattened conv features "
                                  f"gets its rows permuted from PyTorch's C·H·W order to "
                                  f"EveryO's H·W·C")
            return None
        origin = self.flattened.get(id(layer))
        if isinstance(origin, FlattenOrderUnknown):
            raise origin
        return origin


def _flatten_hazard(model: Module) -> str | None:
    """Why a layer of ``model`` may read flattened conv features, or None: a ``Flatten``, or
    convolution kernels (a parameter of rank 3 or more) whose features a ``forward`` may
    reshape to ``(batch, -1)``; only a trace with an example input can tell."""
    if any(type(m).__name__ == "Flatten" for m in model.modules()):
        return "the model contains Flatten"
    for name, param in model.named_parameters():
        if param.ndim >= 3:
            return (f"the model has convolution kernels ({name!r}, rank {param.ndim}), whose "
                    f"features its forward may flatten")
    return None


def _producer(x, limit: int = 64):
    """The op that gave ``x`` its shape: the first op back along the graph, through ops that
    keep the shape (ReLU, Dropout, BatchNorm, ...), whose input is shaped otherwise."""
    for _ in range(limit):
        op = x._ctx
        if op is None:
            return None
        parents = [p for p in op.parents if isinstance(p, Tensor)]
        same = [p for p in parents if p.shape == x.shape and p._ctx is not None]
        if op.name == "reshape" or not same:
            return op
        x = same[0]
    return None


def _reshaped_from(op, x) -> Tensor | None:
    """The tensor ``op`` reshaped into ``x`` (same batch size), or None."""
    if op is None or op.name != "reshape" or not op.parents:
        return None
    parent = op.parents[0]
    return parent if isinstance(parent, Tensor) and parent.shape[0] == x.shape[0] else None


def flatten_origin(x) -> tuple | None:
    """``(*spatial, channels)`` of the channels-last features that ``x`` (rank 2) flattens,
    following the graph back through ops that keep the shape; None when it flattens none.

    Rank >= 4 features (NHWC images) count; so do rank-3 ``(N, L, C)`` features that are a
    squeeze of ``(N, 1, L, C)`` (what ``Conv1D``'s 2-D convolution gives); other rank-3
    tensors (sequence features) flatten alike in both frameworks and do not count. Features a
    forward permuted to PyTorch's channels-first before flattening count neither (their order
    is PyTorch's); another permutation raises :class:`FlattenOrderUnknown`.
    """
    if not isinstance(x, Tensor) or x.ndim != 2:
        return None
    flattened = _reshaped_from(_producer(x), x)
    if flattened is None or flattened.ndim < 3:
        return None
    order, features = _untransposed(flattened)
    origin = None
    if features.ndim >= 4:
        origin = tuple(features.shape[1:])
    else:
        image = _reshaped_from(_producer(features), features)
        if image is not None and image.ndim == 4 and image.shape[1] == 1 and \
                image.shape[2:] == features.shape[1:]:
            origin = tuple(features.shape[1:])
    rank = len(order)
    if origin is None or order == tuple(range(rank)):
        return origin
    if order == (0, rank - 1, *range(1, rank - 1)):  # permuted to PyTorch's channels-first
        return None  # so flattened in PyTorch's order already
    raise FlattenOrderUnknown(f"the conv features flattened into it were permuted by {order} "
                              f"from channels-last; convert_state_dict permutes the rows of "
                              f"channels-last (H·W·C) or channels-first (C·H·W) features only: "
                              f"convert this layer's weight by hand")


class FlattenOrderUnknown(EveryOError):
    """Conv features flattened in an order that is neither channels-last nor PyTorch's."""


def _untransposed(x, limit: int = 64) -> tuple:
    """``(order, source)``: going back from ``x`` through ops that keep the shape and through
    transposes to ``source``, the tensor before them; ``x``'s axis ``i`` is ``source``'s axis
    ``order[i]``."""
    order = tuple(range(x.ndim))
    for _ in range(limit):
        op = x._ctx
        if op is None:
            break
        parents = [p for p in op.parents if isinstance(p, Tensor)]
        if op.name == "transpose" and parents:
            axes = getattr(op, "axes", None) or tuple(reversed(range(x.ndim)))
            order, x = tuple(axes[i] for i in order), parents[0]
            continue
        same = [p for p in parents if p.shape == x.shape and p._ctx is not None]
        if op.name == "reshape" or not same:
            break
        x = same[0]
    return order, x


def trace_flattened_inputs(model: Module, example_input, found: dict) -> None:
    """Run ``example_input`` through ``model`` (evaluation mode, restored after) recording
    :func:`flatten_origin` of every module's first input into ``found`` by module id."""
    modules = list(model.modules())
    modes = [m.training for m in modules]

    def recording(module):
        forward = module.forward

        def forward_recording(*args, **kwargs):
            if args:
                try:
                    found[id(module)] = flatten_origin(args[0])
                except FlattenOrderUnknown as exc:  # refused when the layer converts
                    found[id(module)] = exc
            return forward(*args, **kwargs)
        return forward_recording

    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    inputs = tuple(_traceable(x) for x in inputs)
    own = [m.__dict__.get("forward") for m in modules]  # an instance's own forward, if any
    try:
        for module in modules:
            object.__setattr__(module, "forward", recording(module))
        model.eval()
        with enable_grad():
            model(*inputs)
    except EveryOError as exc:
        raise EveryOError(f"convert_state_dict: running example_input through "
                          f"{type(model).__name__} (in EveryO's layout, e.g. NHWC images) "
                          f"failed: {exc}") from None
    finally:
        for module, mode, forward in zip(modules, modes, own):
            del module.__dict__["forward"]
            if forward is not None:
                object.__setattr__(module, "forward", forward)
            object.__setattr__(module, "training", mode)


def _traceable(x):
    """A floating input as a tensor requiring a gradient, so its reshapes are recorded."""
    data = x.data if isinstance(x, Tensor) else x
    if isinstance(data, np.ndarray) and data.dtype.kind == "f":
        return Tensor(data, requires_grad=True)
    return x


def find_converter(layer_class: type) -> Callable | None:
    """The converter registered for ``layer_class`` or its nearest registered base."""
    converters = registry("state_converters")
    for cls in layer_class.__mro__:
        if cls in converters:
            return converters[cls]
    return None


def keep_as_is(layer: Module, entries: CheckpointEntries, context) -> dict:
    """The converter of layers that register none: their own parameters and buffers keep
    PyTorch's arrays (sub-modules are converted by their own converters)."""
    own = [(n, layer.__dict__[n]) for n in layer._parameter_names + layer._buffer_names]
    return {name: entries.take(name, np.shape(value.data if isinstance(value, Tensor) else value))
            for name, value in own if value is not None}


def convert_state_dict(model: Module, torch_state, source: str = "torch",
                       example_input=None) -> "OrderedDict[str, np.ndarray]":
    """``model``'s state dict made from a PyTorch checkpoint, every layout converted.

    Args:
        model: the EveryO model, built with the PyTorch model's structure and names.
        torch_state: ``torch_model.state_dict()`` (tensors or NumPy arrays), or the path of a
            ``.safetensors`` file (``safetensors.torch.save_file``; needs ``safetensors``).
        source: ``"torch"``, the one source so far.
        example_input: one input batch in EveryO's layout (NHWC images), or a tuple of
            inputs; needed when conv features are flattened into a Linear (it finds their
            shape by running the model once in evaluation mode).

    Returns:
        An ordered dict for ``model.load_state_dict``. Raises ``EveryOError`` listing every
        missing, unexpected or mis-shaped key (the checkpoint's and the model's shapes) before
        anything is returned; ``model`` is not changed.

    Example:
        >>> import everyo as eo, numpy as np
        >>> model = eo.Sequential(eo.Linear(3, 2))
        >>> state = eo.convert_state_dict(model, {"0.weight": np.ones((2, 3)),
        ...                                       "0.bias": np.zeros(2)})
        >>> state["0.weight"].shape
        (3, 2)
    """
    if source not in SOURCES:
        raise EveryOError(f"convert_state_dict: source must be one of {SOURCES}, got {source!r}")
    arrays = checkpoint_arrays(torch_state)
    for alias, first in parameter_aliases(model).items():
        # NOTE: PyTorch ties by sharing one tensor, so both names hold the same array;
        # safetensors.torch.save_model keeps only one of them
        if (alias in arrays) != (first in arrays):
            arrays.setdefault(alias, arrays.get(first))
            arrays.setdefault(first, arrays.get(alias))
    context = ConversionContext(model, example_input)
    converted: dict = {}
    taken: set = set()
    problems: list = []
    failed: list = []  # prefixes of the layers whose conversion failed
    sources: dict = {}  # EveryO name -> ParameterSource of what made it
    _convert_tree(model, "", arrays, context, (converted, taken, problems, failed, sources))
    problems += [f"unexpected key {key!r} (shape {arrays[key].shape}): no layer of "
                 f"{type(model).__name__} has it" for key in arrays if key not in taken]
    assembled = _assemble(model, converted, problems, failed)
    for name, param in model.named_parameters():
        if name in sources:  # so that a PyTorch optimizer's buffers convert as it did
            record_source(param, sources[name])
    return assembled


def _convert_tree(module: Module, prefix: str, arrays: dict, context, out: tuple) -> None:
    """Convert ``module`` (its converter, or :func:`keep_as_is` and then its children)."""
    converted, taken, problems, failed, sources = out
    converter = find_converter(type(module))
    scope = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    if converter is None:
        scope = {k: v for k, v in scope.items() if "." not in k}
    kind = getattr(module, "label", type(module).__name__)
    label = f"layer {prefix.rstrip('.')!r} {kind}" if prefix else f"the model {kind}"
    entries = CheckpointEntries(prefix, scope, label)
    try:
        result = (converter or keep_as_is)(module, entries, context)
    except CheckpointMismatch as exc:
        problems.append(str(exc))
        taken.update(prefix + name for name in scope)  # its other keys are not "unexpected"
        failed.append(prefix)
        return
    except EveryOError as exc:
        raise EveryOError(f"convert_state_dict: {label}: {exc}") from None
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # a converter's own bug
        raise EveryOError(f"convert_state_dict: the converter {_name(converter)} of {label} "
                          f"failed: {type(exc).__name__}: {exc}") from exc
    taken.update(prefix + name for name in entries.taken)
    converted.update((prefix + name, np.asarray(value, order="C"))
                     for name, value in result.items())
    convert = _bound(converter or keep_as_is, module, prefix, label, context)
    shapes = {name: scope[name].shape for name in entries.taken}
    sources.update((prefix + name, ParameterSource(prefix + name, name, convert, shapes, prefix))
                   for name in result)
    if converter is None:
        for name, child in module.named_children():
            _convert_tree(child, f"{prefix}{name}.", arrays, context, out)


def _bound(converter: Callable, module: Module, prefix: str, label: str, context) -> Callable:
    """``converter`` of ``module`` as a function of the layer's PyTorch arrays alone (what
    :class:`ParameterSource` runs on numbered arrays to find a parameter's layout). The
    module is held weakly: the record of its parameters must not keep them alive."""
    layer = weakref.ref(module)

    def convert(arrays: dict) -> dict:
        alive = layer()
        if alive is None:
            raise LayoutUnknown(f"{label} no longer exists")
        return converter(alive, CheckpointEntries(prefix, arrays, label), context)
    return convert


def _name(function) -> str:
    return getattr(function, "__qualname__", repr(function))


def _assemble(model: Module, converted: dict, problems: list, failed: list) -> OrderedDict:
    """The converted arrays in ``model.state_dict()``'s order, after checking them all: a
    tied parameter, saved by PyTorch under each of its names, is kept once (its first)."""
    expected = model.state_dict()
    aliases = parameter_aliases(model)
    for key in list(converted):
        if key in expected or key not in aliases:
            continue
        first = aliases[key]
        if first in converted and not np.array_equal(converted[first], converted.pop(key)):
            problems.append(f"{key!r} is tied to {first!r} in the model but the checkpoint "
                            f"holds different values for them")
    for key, value in converted.items():
        if key not in expected:
            problems.append(f"the converter produced {key!r}, which the model does not have")
        elif value.shape != expected[key].shape:
            problems.append(f"{key!r} converts to shape {value.shape} but the model's is "
                            f"{expected[key].shape}")
    problems += [f"missing key {key!r} (the model's shape {expected[key].shape})"
                 for key in expected if key not in converted
                 and not any(key.startswith(prefix) for prefix in failed)]
    if problems:
        raise EveryOError(f"convert_state_dict({type(model).__name__}): " + "; ".join(problems))
    return OrderedDict((key, converted[key]) for key in expected)


def parameter_aliases(model: Module) -> dict:
    """``{name: first name}`` for every parameter name that shares its Parameter with an
    earlier name (a tied weight), in ``named_parameters`` order."""
    first: dict = {}
    aliases = {}
    for path, module in model.named_modules():
        for name in module._parameter_names:
            full = f"{path}.{name}" if path else name
            param = module.__dict__[name]
            if param is None:
                continue
            if id(param) in first:
                aliases[full] = first[id(param)]
            else:
                first[id(param)] = full
    return aliases


def checkpoint_arrays(torch_state) -> dict:
    """``{key: np.ndarray}`` from a state dict of tensors/arrays or a ``.safetensors`` path."""
    if isinstance(torch_state, (str, os.PathLike)):
        path = os.fspath(torch_state)
        if not path.endswith(".safetensors"):
            raise EveryOError(f"convert_state_dict: {path!r} is not a .safetensors file; load "
                              f"a PyTorch .pt/.pth yourself (torch.load(path, "
                              f"weights_only=True)) and pass the dict: EveryO never unpickles")
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise EveryOError("convert_state_dict: reading a .safetensors file needs the "
                              "safetensors package (pip install safetensors)") from None
        try:
            return dict(load_file(path))
        except Exception as exc:  # safetensors' own errors, OSError, unknown dtypes...
            raise EveryOError(f"convert_state_dict: cannot read {path!r} with safetensors: "
                              f"{type(exc).__name__}: {exc}") from None
    if not hasattr(torch_state, "items"):
        raise EveryOError(f"convert_state_dict: expected a state dict or a .safetensors path, "
                          f"got {type(torch_state).__name__}")
    return {str(key): _as_array(key, value) for key, value in torch_state.items()}


def _as_array(key, value) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch.Tensor
        value = pytorch_array(f"convert_state_dict: {key!r}", value)
    elif isinstance(value, Tensor):
        value = value.data
    if not isinstance(value, (np.ndarray, np.generic, int, float)):
        raise EveryOError(f"convert_state_dict: {key!r} is a {type(value).__name__}, not an "
                          f"array")
    array = np.asarray(value)
    if not (array.dtype.kind in "biu" or is_floating(array.dtype) or array.dtype.kind == "c"):
        raise EveryOError(f"convert_state_dict: {key!r} has dtype {array.dtype}, not numbers")
    return array
