"""Checked values: one rule for constructor arguments and for the states loaders restore.

A constructor checks each argument with :func:`checked_argument`; its ``load_state_dict``
checks each saved value with the same call (so a loaded state meets the constructor's rules,
with the constructor's messages), after :func:`expect_state` has checked the state is a dict
of the loader's own class. Loaders convert and check every value first and change the object
only when everything passed (all or nothing). docs/checkpoints.md states the rules.

A public module: plugins (GradScaler, the schedulers, third-party stateful objects) use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.lib.array_utils import byte_bounds

from everyo.devices import check_device
from everyo.dtypes import is_floating, resolve_dtype
from everyo.errors import EveryOError


class ArgumentError(EveryOError, TypeError):
    """An argument (or a loaded state's value) has the wrong type or is out of range.

    Also a ``TypeError``, the exception PyTorch raises for such arguments, so code written for
    either catches it.
    """


def is_int(value) -> bool:
    """An integer that is not a bool (``True`` as a count is a mistake, not a 1)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
    """A finite int or float (not a bool, not a string, not NaN or inf)."""
    if not (is_int(value) or isinstance(value, (float, np.floating))):
        return False
    try:  # NOTE: np.isfinite has no loop for Python ints beyond int64 (raw TypeError)
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float is no finite float either
        return False


#: kind -> (type test, range test, what the error says is expected)
ARGUMENT_KINDS = {
    "int": (is_int, lambda v: True, "an int"),
    "positive int": (is_int, lambda v: v > 0, "a positive int"),
    "non-negative int": (is_int, lambda v: v >= 0, "a non-negative int"),
    "float": (is_real, lambda v: True, "a finite number"),
    "positive float": (is_real, lambda v: v > 0, "a positive number"),
    "non-negative float": (is_real, lambda v: v >= 0, "a non-negative number"),
    "probability": (is_real, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "positive fraction": (is_real, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "fraction below one": (is_real, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "bool": (lambda v: isinstance(v, (bool, np.bool_)), lambda v: True, "True or False"),
}


def checked_argument(owner: str, name: str, value, kind: str, error=ArgumentError):
    """``value`` of argument ``name`` of ``owner``, checked against ``kind``.

    Args:
        owner: what the error names first (a class, ``"DataLoader.load_state_dict"``, ...).
        name: the argument's (or the state key's) name.
        value: what the caller passed; a 0-d array (a scalar read back from a checkpoint)
            counts as its value.
        kind: a key of :data:`ARGUMENT_KINDS`.
        error: the exception class raised (a subclass of :class:`ArgumentError`).

    Returns:
        ``value`` as a Python ``int`` (the int kinds), ``bool`` or ``float`` (the others).
        Floats are never truncated to ints, bools are never numbers, NaN and inf are never
        finite numbers.

    Example:
        >>> checked_argument("DataLoader", "batch_size", 4, "positive int")
        4
        >>> checked_argument("Adam", "lr", float("nan"), "non-negative float")
        Traceback (most recent call last):
        ...
        everyo.validation.ArgumentError: Adam: lr must be a non-negative number, got nan (float)
    """
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    is_type, in_range, expected = ARGUMENT_KINDS[kind]
    if not (is_type(value) and in_range(value)):
        raise error(f"{owner}: {name} must be {expected}, got {value!r} "
                    f"({type(value).__name__})")
    if kind == "bool":
        return bool(value)
    return int(value) if kind.endswith("int") else float(value)


def expect_state(owner: str, state, type_name: str, required=(), optional=()) -> dict:
    """``state`` as a plain dict, after checking it is one ``type_name`` wrote.

    A state names its class under ``"type"``; a state naming another class is refused. A
    state without ``"type"`` (written before states named their class, or by PyTorch) is
    accepted when its keys are exactly the expected ones.

    Args:
        owner: the loader, for errors (``"StepLR.load_state_dict"``).
        state: what the caller passed.
        type_name: the class whose state is expected.
        required: keys the state must have.
        optional: keys it may have besides ``required`` and ``"type"``.
    """
    if not isinstance(state, Mapping):
        raise EveryOError(f"{owner}: expected the dict {type_name}.state_dict() returns, got "
                          f"a {type(state).__name__}")
    state = dict(state)
    saved_type = state.pop("type", None)
    if saved_type is not None and not (isinstance(saved_type, str) and saved_type == type_name):
        raise EveryOError(f"{owner}: the state belongs to {str(saved_type)[:60]!r}, not "
                          f"{type_name!r}")
    keys = set(state)
    missing = sorted(map(str, set(required) - keys))
    unexpected = sorted(map(str, keys - set(required) - set(optional)))
    if missing or unexpected:
        found = "; ".join(part for part in (missing and f"missing keys {missing}",
                                            unexpected and f"unexpected keys {unexpected}")
                          if part)
        raise EveryOError(f"{owner}: this is not a {type_name} state ({found}); pass what "
                          f"{type_name}.state_dict() returned")
    return state


def checked_list(owner: str, name: str, value, length: int | None = None) -> list:
    """``value`` (a list, tuple or 1-D array read back from a checkpoint) as a list, of
    ``length`` items when given (one per parameter group, ...)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise EveryOError(f"{owner}: {name} must be a list, got a {type(value).__name__}")
    if length is not None and len(value) != length:
        raise EveryOError(f"{owner}: {name} has {len(value)} entries, expected {length} (one "
                          f"per parameter group)")
    return list(value)


def converted_array(name: str, value, target: np.ndarray, holder: str):
    """``(value as an array of target's dtype, None)``, or ``(None, why it cannot be)``.

    ``value`` (an array, a Tensor or a nested list) must be numeric, real unless ``target``
    is complex (a complex value is never cast with its imaginary part dropped), of
    ``target``'s shape, and, for an integer or bool ``target``, exactly representable; for a
    floating one, no finite value may overflow to inf.
    ``holder`` names what ``target`` belongs to in the message (``"model"``, ...).
    """
    try:
        # NOTE: a Tensor converts through its __array__ (its data); this module cannot import
        # tensor.py, which imports everyo.random, which validates with this module.
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        return None, f"{name} is not an array ({exc})"
    numeric = array.dtype.kind in "biu" or is_floating(array.dtype)
    if not numeric or (array.dtype.kind == "c" and target.dtype.kind != "c"):
        return None, (f"{name} has dtype {array.dtype} in the state; the {holder}'s is "
                      f"{target.dtype} (a real number cannot hold a complex or non-numeric "
                      f"value)")
    if array.shape != target.shape:
        return None, (f"{name} has shape {array.shape} in the state but {target.shape} in "
                      f"the {holder}")
    with np.errstate(invalid="ignore", over="ignore"):
        cast = array.astype(target.dtype, copy=True)
    if target.dtype.kind in "iub" and not np.array_equal(cast, array):
        return None, (f"{name} holds values that the {holder}'s {target.dtype} cannot "
                      f"represent exactly")
    if is_floating(target.dtype) and array.dtype != target.dtype and array.size and \
            np.any(np.isinf(cast) & np.isfinite(array)):
        # NOTE: rounding is the conversion asked for; a finite value turned inf is not
        return None, (f"{name} holds finite values that overflow the {holder}'s "
                      f"{target.dtype} (largest {float(np.max(np.abs(array)))!r}): they would "
                      f"load as inf")
    return cast, None


def checked_device(owner: str, device) -> None:
    """PyTorch's ``device=`` argument: ``None``, ``"cpu"`` or a ``torch.device("cpu")`` (the
    CPU is EveryO's only device) is accepted; any other is an ``EveryOError`` naming ``owner``
    (e.g. ``"Linear(device=...)"``) and the device."""
    if device is not None:
        check_device(device, owner)


def parameter_dtype(owner: str, dtype) -> np.dtype:
    """PyTorch's ``dtype=`` argument of something that creates parameters, as the NumPy
    dtype: NumPy's, a name (``"bfloat16"``) or a ``torch.dtype`` (by its name). Parameters
    carry gradients, so only a real floating dtype is accepted; anything else is an
    ``EveryOError`` naming ``owner``.

    Example:
        >>> parameter_dtype("Linear(dtype=...)", "float64")
        dtype('float64')
    """
    resolved = resolve_dtype(dtype, owner)
    if not is_floating(resolved) or resolved.kind == "c":
        raise EveryOError(f"{owner}: a layer's parameters are floating-point (float16, "
                          f"bfloat16, float32, float64), got {resolved.name}")
    return resolved


def checked_gradients(owner: str, params, writable: bool = False, numbered_in=None) -> list:
    """The ``.grad`` of each of ``params`` (all not None), each checked to be what a step can
    follow: a NumPy array of a floating dtype and of its parameter's shape, and writable when
    ``writable`` (the caller changes it in place: ``clip_grad_norm_``, ``GradScaler``; nor
    may two of them share memory); complex only for a complex parameter. No gradient may share
    memory with any of ``params``' data (a step writing the data would change the gradient it
    reads; written in place, the gradient would change the data). An error numbers the
    parameter by its position in ``numbered_in`` (default: ``params``).

    ``.grad`` is a plain attribute that code ported from PyTorch assigns by hand; a scalar or
    one row assigned as a matrix's gradient would otherwise broadcast into every element of
    the step, silently. Any floating dtype and any strides are accepted (a step converts).

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter(np.zeros((2, 3), np.float32))
        >>> w.grad = np.float32(1.0)
        >>> checked_gradients("SGD.step", [w])
        Traceback (most recent call last):
        ...
        everyo.errors.EveryOError: SGD.step: the .grad of parameter 0 (shape (2, 3), float32) \
is a scalar of dtype float32; a gradient must be a floating NumPy array of shape (2, 3)
    """
    grads = [p.grad for p in params]
    for index, (p, g) in enumerate(zip(params, grads)):
        # NOTE: the common case in three attribute reads; the message is built only on failure
        if not (type(g) is np.ndarray and g.shape == p.data.shape
                and (g.dtype.kind == "f" or _fits_dtype(g.dtype, p.data.dtype))
                and (not writable or g.flags.writeable)):
            if numbered_in is not None:
                index = next(i for i, q in enumerate(numbered_in) if q is p)
            _refuse_gradient(owner, index, p, g)
    aliased = _gradient_aliasing_data(grads, params)
    if aliased is not None:
        g, d = (next(i for i, q in enumerate(numbered_in or params) if q is params[k])
                for k in aliased)
        raise EveryOError(f"{owner}: the .grad of parameter {g} shares memory with the data of "
                          f"parameter {d} (p.grad = p.data?); a step writing the parameter "
                          f"would change its own gradient: give it a gradient array of its own")
    if writable and len(grads) > 1:
        pair = _overlapping_pair(grads)
        if pair is not None:
            a, b = (params[k] for k in pair)
            a, b = sorted(next(i for i, q in enumerate(numbered_in or params) if q is r)
                          for r in (a, b))
            raise EveryOError(f"{owner}: the .grad of parameters {a} and {b} share memory (one "
                              f"array assigned to both?); changed in place it would be changed "
                              f"twice: give each parameter its own gradient array")
    return grads


def _gradient_aliasing_data(grads: list, params) -> tuple | None:
    """``(i, j)``: the .grad of ``params[i]`` shares memory with ``params[j].data``, or None.

    NOTE: as :func:`_overlapping_pair`, by owners first: a gradient whose owner (its base, or
    itself) owns no parameter's data cannot overlap one: the common case costs two attribute
    reads and a set operation per parameter (measured 0.15-0.2 µs per parameter, 100 of
    them). A shared owner (an arena, or ``p.grad = p.data``) sends every array to a sweep
    by byte bounds; a gradient and a data whose bounds overlap are confirmed exactly.
    """
    datas = [p.data for p in params]
    owners = {id(d if d.base is None else d.base) for d in datas}
    if owners.isdisjoint([id(g if g.base is None else g.base) for g in grads]):
        return None
    # a shared owner (one arena, or p.grad = p.data): sweep the byte bounds of all of them
    arrays = (grads, datas)
    bounds = [byte_bounds(a) + (which, k) for which in (0, 1)
              for k, a in enumerate(arrays[which]) if a.size]
    active: list = []
    for low, high, kind, k in sorted(bounds):
        active = [(end, other, m) for end, other, m in active if end > low]
        for _, other, m in active:
            if other != kind and np.shares_memory(arrays[other][m], arrays[kind][k]):
                return (m, k) if kind else (k, m)
        active.append((high, kind, k))
    return None


def _overlapping_pair(grads: list):
    """Two positions of ``grads`` whose arrays share memory, or None.

    NOTE: arrays with different owners never do (what backward hands out); only those viewing
    one owner (data-parallel buckets' slices of one buffer, or one array assigned twice) are
    swept by their byte bounds, and a pair whose bounds overlap is confirmed exactly.
    """
    owners = [id(g if g.base is None else g.base) for g in grads]
    if len(set(owners)) == len(owners):
        return None
    active: list = []
    for low, high, i in sorted(byte_bounds(g) + (i,) for i, g in enumerate(grads) if g.size):
        active = [(end, j) for end, j in active if end > low]
        for _, j in active:
            if np.shares_memory(grads[j], grads[i]):
                return j, i
        active.append((high, i))
    return None


def _fits_dtype(grad: np.dtype, param: np.dtype) -> bool:
    """A floating gradient dtype; complex only for a complex parameter (a real step would drop
    the imaginary part)."""
    return is_floating(grad) and (grad.kind != "c" or param.kind == "c")


def _refuse_gradient(owner: str, index: int, p, g):
    shape = p.data.shape
    if isinstance(g, np.ndarray):
        what = ("a read-only array (it is scaled in place; assign a writable copy)"
                if g.shape == shape and _fits_dtype(g.dtype, p.data.dtype) else
                f"an array of dtype {g.dtype} and shape {g.shape}")
    elif isinstance(g, np.generic):
        what = f"a scalar of dtype {g.dtype}"
    else:
        what = f"a {type(g).__name__}" + (" (assign its .data)" if hasattr(g, "_ctx") else "")
    raise EveryOError(f"{owner}: the .grad of parameter {index} (shape {shape}, "
                      f"{p.data.dtype}) is {what}; a gradient must be a floating NumPy array "
                      f"of shape {shape}")
