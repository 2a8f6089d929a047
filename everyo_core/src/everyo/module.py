"""``Module``, ``Parameter`` and ``Sequential``: the bases every layer builds on."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from everyo.autograd import zero_gradients
from everyo.devices import check_device, is_device
from everyo.dtypes import is_floating, resolve_dtype
from everyo.errors import EveryOError
from everyo.tensor import DEFAULT_FLOAT, Tensor, _check_numeric, tensor
from everyo.validation import ArgumentError, converted_array
from everyo.versioning import bump_version


class Parameter(Tensor):
    """A tensor that is a module's learnable state: it requires a gradient by default.

    Dtypes follow ``eo.tensor``: Python floats and integers become float32, a NumPy array keeps
    its floating dtype.

    Example:
        >>> import everyo as eo, numpy as np
        >>> eo.Parameter([1, 2]).dtype, eo.Parameter(np.zeros(2)).dtype
        ('float32', 'float64')
    """

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True, dtype=None):
        array = tensor(data, dtype=dtype).data
        if not is_floating(array.dtype) or array.dtype.kind == "c":
            array = array.astype(DEFAULT_FLOAT)
        super().__init__(array, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter(" + super().__repr__() + ")"


class Module:
    """Base class of layers and models: holds parameters, buffers and sub-modules.

    Subclasses set attributes in ``__init__`` (a ``Parameter``, a ``Module``, or a buffer via
    :meth:`register_buffer`) and implement ``forward``. Calling the module calls ``forward``.

    Example:
        >>> import everyo as eo
        >>> class Scale(eo.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.factor = eo.Parameter([2.0])
        ...     def forward(self, x):
        ...         return x * self.factor
        >>> Scale()(eo.ones(2)).data
        array([2., 2.], dtype=float32)
    """

    _parameter_names: list[str]
    _buffer_names: list[str]
    _module_names: list[str]
    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameter_names", [])
        object.__setattr__(self, "_buffer_names", [])
        object.__setattr__(self, "_module_names", [])
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value) -> None:
        if "_parameter_names" not in self.__dict__:
            raise EveryOError(f"{type(self).__name__}.__init__ must call super().__init__() "
                              f"before assigning attributes")
        if (name in self._parameter_names and value is not None
                and not isinstance(value, Parameter)):
            raise ArgumentError(
                f"cannot assign a {type(value).__name__} to {type(self).__name__}.{name}, which "
                f"is a Parameter: the new value would be neither trained nor saved. Copy values "
                f"in place with `{name}.data[...] = array`, or use model.load_state_dict(...); "
                f"assign an eo.Parameter to replace it")
        for names in (self._parameter_names, self._module_names):
            if name in names:
                names.remove(name)
        if isinstance(value, Parameter):
            self._parameter_names.append(name)
        elif isinstance(value, Module):
            self._module_names.append(name)
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, array) -> None:
        """Non-learnable state saved in ``state_dict`` (e.g. running statistics)."""
        if array is not None:
            try:
                array = np.asarray(array)
            except (TypeError, ValueError) as exc:  # (ragged nested lists)
                raise EveryOError(f"register_buffer({name!r}): not an array: {exc}") from None
            _check_numeric(array, f"register_buffer({name!r}): the buffer")
        if name not in self._buffer_names:
            self._buffer_names.append(name)
        object.__setattr__(self, name, array)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not implement forward()")

    def __call__(self, *args, **kwargs):
        try:
            return self.forward(*args, **kwargs)
        except EveryOError as exc:
            name_failing_layer(exc, self)
            raise

    # -- traversal ------------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name in self._module_names:
            yield name, self.__dict__[name]

    def children(self) -> Iterator["Module"]:
        for _, module in self.named_children():
            yield module

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        warn_about_plain_containers(self)
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator["Module"]:
        for _, module in self.named_modules():
            yield module

    def named_parameters(self, prefix: str = "",
                         recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """``(name, parameter)`` pairs, each parameter once; ``recurse=False`` (PyTorch's)
        gives this module's own only."""
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for path, module in modules:
            for name in module._parameter_names:
                param = module.__dict__[name]
                if id(param) not in seen:
                    seen.add(id(param))
                    yield (f"{path}.{name}" if path else name), param

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def add_module(self, name: str, module: "Module | None") -> None:
        """PyTorch's ``add_module``/``register_module``: ``setattr(self, name, module)`` for a
        name that is not an attribute identifier too (``"conv-1"``)."""
        if not isinstance(name, str) or not name or "." in name:
            raise EveryOError(f"{type(self).__name__}.add_module: the name must be a non-empty "
                              f"string without '.', got {name!r}")
        if module is not None and not isinstance(module, Module):
            raise EveryOError(f"{type(self).__name__}.add_module({name!r}): expected an "
                              f"eo.Module, got a {type(module).__name__}")
        setattr(self, name, module)

    register_module = add_module

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set ``requires_grad`` of every parameter (``False`` freezes them); returns self."""
        if not isinstance(requires_grad, (bool, np.bool_)):
            raise EveryOError(f"{type(self).__name__}.requires_grad_: expected True or False, "
                              f"got {requires_grad!r}")
        for param in self.parameters():
            param.requires_grad = bool(requires_grad)
        return self

    def cpu(self) -> "Module":
        """PyTorch's ``module.cpu()``: EveryO computes on the CPU, so ``self`` as it is."""
        return self

    def cuda(self, device=None) -> "Module":
        """Refused by name: EveryO computes on the CPU only."""
        check_device("cuda" if device is None else f"cuda:{device}" if isinstance(device, int)
                     else device, f"{type(self).__name__}.cuda")
        return self

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        for path, module in self.named_modules():
            for name in module._buffer_names:
                buffer = module.__dict__[name]
                if buffer is not None:
                    yield (f"{path}.{name}" if path else name), buffer

    # -- modes and state --------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, (bool, np.bool_)):
            raise EveryOError(f"{type(self).__name__}.train: mode must be True or False, got "
                              f"{mode!r} ({type(mode).__name__})")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget accumulated gradients: every ``.grad`` becomes None (PyTorch 2's default),
        or zeros with ``set_to_none=False``."""
        zero_gradients(self.parameters(), set_to_none, type(self).__name__)

    def apply(self, fn) -> "Module":
        """Call ``fn(module)`` on every sub-module (children first) and then on this one, as
        PyTorch's ``Module.apply``; returns ``self`` (e.g. ``model.apply(init_weights)``).

        Example:
            >>> import everyo as eo
            >>> model = eo.Sequential(eo.Linear(2, 2), eo.ReLU())
            >>> seen = []
            >>> _ = model.apply(lambda m: seen.append(type(m).__name__))
            >>> seen
            ['Linear', 'ReLU', 'Sequential']
        """
        if not callable(fn):
            raise EveryOError(f"{type(self).__name__}.apply(fn) takes a function called on "
                              f"every sub-module, got {type(fn).__name__}")
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, *args, dtype=None, device=None) -> "Module":
        """Convert floating parameters and buffers to a dtype in place, as PyTorch's
        ``module.to(dtype)``, ``to(device)``, ``to(device, dtype)``: ``"cpu"`` (the only device)
        is accepted and changes nothing. Returns ``self``.

        Example:
            >>> import everyo as eo
            >>> eo.Linear(2, 2).to("cpu", "float64").weight.dtype
            'float64'
        """
        for value in args:
            if is_device(value):
                device = value
            elif dtype is None:
                dtype = value
            else:
                raise EveryOError(f"{type(self).__name__}.to: got two dtypes ({dtype!r} and "
                                  f"{value!r}); pass a device and/or one dtype")
        if device is not None:
            check_device(device, f"{type(self).__name__}.to")
        if dtype is not None:
            self._cast_floating(resolve_dtype(dtype, "Module.to"))
        return self

    def double(self) -> "Module":
        """``to("float64")``."""
        return self.to("float64")

    def float(self) -> "Module":
        """``to("float32")``."""
        return self.to("float32")

    def half(self) -> "Module":
        """``to("float16")``."""
        return self.to("float16")

    def _cast_floating(self, dtype) -> None:
        for param in self.parameters():
            if is_floating(param.data.dtype) and param.data.dtype != dtype:
                param.data = param.data.astype(dtype)
                param.grad = None
        for module in self.modules():
            for name in module._buffer_names:
                buffer = module.__dict__[name]
                if buffer is not None and is_floating(buffer.dtype):
                    object.__setattr__(module, name, buffer.astype(dtype))

    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Copies of every parameter and buffer, by dotted name."""
        state: OrderedDict = OrderedDict()
        for name, param in self.named_parameters():
            state[name] = param.data.copy()
        for name, buffer in self.named_buffers():
            state[name] = np.array(buffer, copy=True)
        return state

    def load_state_dict(self, state, strict: bool = True) -> "IncompatibleKeys":
        """Copy ``state`` into this module's parameters and buffers, in place.

        Every value is converted to its target's dtype and checked (shape, a real number
        for a real target, an integral value for an integer buffer) before anything changes;
        a refusal is an ``EveryOError`` naming every key at fault.

        Args:
            state: a mapping of dotted names to arrays (or tensors), as :meth:`state_dict`
                returns.
            strict: when True, a missing or unexpected key is refused; when False, the keys
                both have are loaded and the others reported.

        Returns:
            ``IncompatibleKeys(missing_keys, unexpected_keys)``, as PyTorch's.
        """
        name = type(self).__name__
        if not isinstance(state, Mapping):
            raise EveryOError(f"{name}.load_state_dict: expected a mapping of names to arrays "
                              f"(what state_dict() returns), got a {type(state).__name__}")
        current = self.state_dict()
        missing = [key for key in current if key not in state]
        unexpected = [key for key in state if key not in current]  # in the state's order
        problems = []
        if strict and missing:
            problems.append(f"missing keys {missing}")
        if strict and unexpected:
            problems.append(f"unexpected keys {sorted(unexpected, key=str)}")
        converted = {}
        for key in current:
            if key in state:
                value, problem = converted_array(repr(key), state[key], current[key], "model")
                if problem:
                    problems.append(problem)
                converted[key] = value
        if problems:
            raise EveryOError(f"{name}.load_state_dict: " + "; ".join(problems))
        self._assign_state(converted)
        return IncompatibleKeys(missing, unexpected)

    def _assign_state(self, converted: dict) -> None:
        """Write already-converted values into the parameters and buffers they name."""
        parameters = dict(self.named_parameters())
        modules = dict(self.named_modules())
        for key, value in converted.items():
            if key in parameters:
                parameters[key].data[...] = value
                bump_version(parameters[key])
            else:
                owner_path, _, buffer_name = key.rpartition(".")
                object.__setattr__(modules[owner_path], buffer_name, value)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = list(self.named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"  ({name}): " + repr(child).replace("\n", "\n  ") for name, child in children]
        return f"{type(self).__name__}(\n" + "\n".join(lines) + "\n)"


class IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` did not load (PyTorch's named tuple)."""

    missing_keys: list
    unexpected_keys: list


def name_failing_layer(exc: EveryOError, module: Module) -> None:
    """Prefix ``exc``'s message with the path of the layer that raised it, seen from
    ``module`` (e.g. ``features.3 (MaxPool2D): ...``).

    Called by every ``Module.__call__`` the error passes through, innermost first: each call
    finds the previous module among its children, adds that name to the path kept on the
    exception and rewrites the message, so the outermost call leaves the full path. Only
    plain values are kept on the exception, so it still pickles (e.g. from a worker process).
    """
    state = getattr(exc, "_everyo_layer_path", None)
    if state is None:
        message = str(exc.args[0]) if exc.args else str(exc)
        state = {"names": [], "layer": type(module).__name__, "message": message}
    else:
        child = state["module_id"]
        state["names"].insert(0, next((n for n, c in module.named_children() if id(c) == child),
                                      "?"))
    state["module_id"] = id(module)
    try:
        exc._everyo_layer_path = state
    except AttributeError:  # an exception class with __slots__: leave it as it is
        return
    label = f"{'.'.join(state['names'])} ({state['layer']})" if state["names"] else state["layer"]
    exc.args = (f"{label}: {state['message']}",) + tuple(exc.args[1:])


_warned_containers: set = set()


def warn_about_plain_containers(module: Module) -> None:
    """Warn once per class and attribute when modules sit in a plain list, tuple or dict
    attribute: they are not registered, so their parameters are neither trained nor saved."""
    for name, value in vars(module).items():
        items: Iterable
        if isinstance(value, dict):
            items = value.values()
        elif isinstance(value, (list, tuple)):
            items = value
        else:
            continue
        key = (type(module), name)
        if key in _warned_containers or not any(isinstance(v, Module) for v in items):
            continue
        _warned_containers.add(key)
        fix = "eo.ModuleDict" if isinstance(value, dict) else "eo.ModuleList"
        warnings.warn(
            f"{type(module).__name__}.{name} is a plain {type(value).__name__} holding "
            f"Modules: their parameters are not registered (neither trained by an optimizer "
            f"given model.parameters() nor saved in state_dict). Wrap it in {fix}(...)",
            UserWarning, stacklevel=3)


class Sequential(Module):
    """Modules applied one after another; indexable like a list.

    Example:
        >>> import everyo as eo
        >>> class AddOne(eo.Module):
        ...     def forward(self, x):
        ...         return x + 1
        >>> model = eo.Sequential(AddOne(), AddOne())
        >>> model(eo.zeros(2)).data, len(model), type(model[0]).__name__
        (array([2., 2.], dtype=float32), 2, 'AddOne')
    """

    def __init__(self, *layers: Module):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], Mapping):  # PyTorch's OrderedDict form
            for name, layer in layers[0].items():
                if not isinstance(layer, Module):
                    raise EveryOError(f"Sequential takes Modules, got {type(layer).__name__} "
                                      f"under {name!r}")
                self.add_module(name, layer)
            return
        for layer in layers:
            self.append(layer)

    def append(self, layer: Module) -> "Sequential":
        if not isinstance(layer, Module):
            raise EveryOError(f"Sequential takes Modules, got {type(layer).__name__} at "
                              f"position {len(self)}")
        setattr(self, str(len(self._module_names)), layer)
        return self

    def __getitem__(self, index):
        layers = [self.__dict__[name] for name in self._module_names]
        if isinstance(index, slice):
            return Sequential(*layers[index])
        return layers[index]

    def __len__(self) -> int:
        return len(self._module_names)

    def __iter__(self):
        return iter([self.__dict__[name] for name in self._module_names])

    def forward(self, x):
        for name in self._module_names:
            x = self.__dict__[name](x)
        return x
