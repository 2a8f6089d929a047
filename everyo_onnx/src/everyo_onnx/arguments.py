"""The export's arguments, checked and normalised: inputs with their symbolic axes, names,
opset, and the two sets of sizes the model is traced at."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np

from everyo import EveryOSerializationError

BATCH_DIM = "batch"


@dataclass
class InputSpec:
    """One graph input: its name, the traced shape and ``axis -> dimension name``."""

    name: str
    shape: tuple[int, ...]
    dims: dict = field(default_factory=dict)


def check_opset(opset, default: int, minimum: int, newest: int) -> int:
    if opset is None:
        return default
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)) \
            or not minimum <= opset <= newest:
        raise EveryOSerializationError(f"export_onnx: opset must be an int from {minimum} to "
                                       f"{newest} (the installed onnx's newest), got {opset!r}")
    return int(opset)


def check_shape(input_shape) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in input_shape)
        valid = (not isinstance(input_shape, (str, bytes)) and len(shape) >= 1
                 and all(d > 0 for d in shape)
                 and all(not isinstance(d, bool) and float(d) == int(d) for d in input_shape))
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise EveryOSerializationError(f"export_onnx: input_shape must be a tuple of positive "
                                       f"ints, batch first (or a list of such tuples, one per "
                                       f"input), got {input_shape!r}")
    return shape


def names_for(given, base: str, count: int, what: str, counted: str) -> list[str]:
    """``given`` checked against ``count`` things, or the default ``base`` (one) or
    ``base_0``, ``base_1``... (several)."""
    if given is None:
        given = [base] if count == 1 else [f"{base}_{i}" for i in range(count)]
    names = check_names(list(given), what)
    if len(names) != count:
        raise EveryOSerializationError(f"export_onnx: {len(names)} {what} for {count} {counted}")
    return names


def _is_several(input_shape) -> bool:
    return isinstance(input_shape, list) and bool(input_shape) and all(
        isinstance(s, (tuple, list)) for s in input_shape)


def check_names(names, what: str) -> list[str]:
    if any(not isinstance(n, str) or not n for n in names):
        raise EveryOSerializationError(f"export_onnx: {what} must be non-empty strs, got {names!r}")
    if len(set(names)) != len(names):
        raise EveryOSerializationError(f"export_onnx: {what} repeat a name: {names!r}")
    return list(names)


def input_specs(input_shape, input_name: str, input_names, dynamic_axes) -> list[InputSpec]:
    """One ``InputSpec`` per input; axis 0 is always the symbolic ``batch``."""
    shapes = [check_shape(s) for s in input_shape] if _is_several(input_shape) \
        else [check_shape(input_shape)]
    names = names_for(input_names, input_name, len(shapes), "input_names", "input shapes")
    specs = [InputSpec(n, s, {0: BATCH_DIM}) for n, s in zip(names, shapes)]
    by_name = {spec.name: spec for spec in specs}
    for name, axes in (dynamic_axes or {}).items():
        spec = by_name.get(name)
        if spec is None:
            continue  # an output's axes: checked once the outputs are known
        for axis, dim in _axes(name, axes, len(spec.shape)).items():
            spec.dims[axis] = dim
    return specs


def check_inputs_fit(model, specs: list[InputSpec]) -> None:
    """Refuse input shapes that the model's ``forward`` cannot take positionally, one each."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a forward with no signature to read: the trace tells
        return
    try:
        signature.bind(*specs)
        return
    except TypeError:
        pass
    parameters = list(signature.parameters.values())
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    keyword_only = [p.name for p in parameters if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    takes = (f"{len(required)}" if len(required) == len(positional)
             else f"{len(required)} to {len(positional)}")
    given = f"{len(specs)} input shape{'s' if len(specs) != 1 else ''}"
    why = (f"; its keyword-only arguments {keyword_only} cannot come from input_shape"
           if keyword_only else "")
    raise EveryOSerializationError(
        f"export_onnx: {given} for {takes} input{'s' if takes != '1' else ''}: "
        f"{type(model).__name__}.forward{signature}{why}. Give one shape per input the "
        f"forward takes (input_shape=[shape, ...] for several)")


def _axes(name: str, axes, ndim: int | None) -> dict:
    """``{axis: dim_name}`` from a dict or a list of axes (named ``<name>_dim<axis>``)."""
    if isinstance(axes, (list, tuple)):
        axes = {a: f"{name}_dim{a}" for a in axes}
    if not isinstance(axes, dict):
        raise EveryOSerializationError(f"export_onnx: dynamic_axes[{name!r}] must be a dict "
                                       f"{{axis: name}} or a list of axes, got {axes!r}")
    checked = {}
    for axis, dim in axes.items():
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or (
                ndim is not None and not -ndim <= axis < ndim):
            raise EveryOSerializationError(f"export_onnx: dynamic_axes[{name!r}] names axis "
                                           f"{axis!r}, which {name!r} does not have")
        if not isinstance(dim, str) or not dim:
            raise EveryOSerializationError(f"export_onnx: dynamic_axes[{name!r}][{axis}] must "
                                           f"be a non-empty str, got {dim!r}")
        checked[int(axis) % ndim if ndim else int(axis)] = dim
    return checked


def output_axes(dynamic_axes, input_names: list[str], output_names: list[str]) -> dict:
    """The ``dynamic_axes`` entries naming outputs; a name that is neither is an error."""
    result = {}
    for name, axes in (dynamic_axes or {}).items():
        if name in output_names:
            result[name] = _axes(name, axes, None)
        elif name not in input_names:
            raise EveryOSerializationError(
                f"export_onnx: dynamic_axes names {name!r}, which is neither an input "
                f"({input_names}) nor an output ({output_names})")
    return result


def other_sizes(specs: list[InputSpec]) -> list[tuple[int, ...]]:
    """The shapes of the second trace: every symbolic axis at another size (one size per
    dimension name, shared by every input that has it)."""
    sizes: dict[str, int] = {}
    for spec in specs:
        for axis, dim in spec.dims.items():
            size = spec.shape[axis]
            if sizes.setdefault(dim, size) != size:
                raise EveryOSerializationError(
                    f"export_onnx: dimension {dim!r} has size {sizes[dim]} in one input and "
                    f"{size} in {spec.name!r}; inputs sharing a dimension name must agree")
    # NOTE: a smaller size where it stays above 2, so a sequence axis never outgrows a buffer
    # (a positional table, a causal mask) sized for the traced length; batches grow by one.
    changed = {dim: size + 1 if dim == BATCH_DIM or size < 3 else size - 1
               for dim, size in sizes.items()}
    return [tuple(changed[spec.dims[a]] if a in spec.dims else n
                  for a, n in enumerate(spec.shape)) for spec in specs]
