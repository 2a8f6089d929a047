"""Version counters: backward through a value that was modified in place raises, never lies.

Every in-place write EveryO performs (optimizer steps, ``Tensor.add_``/``copy_``/...,
``t[i] = v``, ``Module.load_state_dict``, ``eo.init`` functions) calls :func:`bump_version`.
A counter belongs to the *storage*, i.e. the NumPy base array a tensor's ``data`` is a view
of: views made by ``reshape``/``transpose``/indexing/``detach`` share their base's counter,
as PyTorch's views do.

Cost model: a recording op stores one integer, the global ``clock`` at forward time. The
clock moves only when something is modified in place, so backward compares one integer per
op and looks at the op's saved tensors only when some write happened after its forward.

Writes straight into the ndarray behind ``.data`` (``t.data[0] = 1``) bypass EveryO and are
not counted (the same contract as PyTorch's ``.data``).
"""

from __future__ import annotations

import weakref

import numpy as np

from everyo.errors import EveryOError

#: ``clock[0]`` increases by one at every in-place write; ops record it at forward time.
clock = [0]

# id(base ndarray) -> [clock value of its last write, number of writes]
_storage: dict[int, list] = {}


def _base(array: np.ndarray) -> np.ndarray:
    """The ndarray that owns the memory ``array`` views (``array`` itself if it owns it)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def bump_version(tensor) -> None:
    """Record that ``tensor``'s values were changed in place (also marks its views).

    Call this after writing into ``tensor.data`` in place from code that owns the write
    (an optimizer, an initializer); EveryO's own in-place paths already call it.

    Args:
        tensor: a Tensor (or Parameter) whose storage was just modified.

    Example:
        >>> import everyo as eo
        >>> w = eo.ones(2)
        >>> w.data *= 2
        >>> eo.bump_version(w)
        >>> w._version
        1
    """
    base = _base(tensor.data)
    clock[0] += 1
    entry = _storage.get(id(base))
    if entry is None:
        _storage[id(base)] = [clock[0], 1]
        weakref.finalize(base, _storage.pop, id(base), None)
    else:
        entry[0] = clock[0]
        entry[1] += 1


def version(tensor) -> int:
    """How many times ``tensor``'s storage was written in place through EveryO."""
    entry = _storage.get(id(_base(tensor.data)))
    return 0 if entry is None else entry[1]


def _written_since(tensor, stamp: int) -> bool:
    return _array_written_since(tensor.data, stamp)


def _array_written_since(array: np.ndarray, stamp: int) -> bool:
    entry = _storage.get(id(_base(array)))
    return entry is not None and entry[0] > stamp


def check_saved(op, output=None, every_operand: bool = False) -> None:
    """Raise if a tensor ``op`` saved for backward was written in place after its forward.

    Called by the engine only when the clock moved since ``op``'s forward. ``op``'s class
    declares what it saved: ``saved_inputs`` (operand indices, None for all),
    ``saves_output`` and ``saved_attributes`` (arrays it keeps that are not operands).
    ``every_operand``: check all operands whatever ``saved_inputs`` says (a second derivative
    through ``op.composite`` recomputes the forward from them).
    """
    stamp = op.epoch
    parents = op.parents
    indices, output_read = _read_by_backward(op)
    if every_operand:
        indices = None
    for i in range(len(parents)) if indices is None else indices:
        if i < len(parents) and _written_since(parents[i], stamp):
            _raise(op, parents[i], f"its operand {i}")
    if output is not None and output_read and _written_since(output, stamp):
        _raise(op, output, "its output")
    for name in op.saved_attributes:
        value = getattr(op, name)
        for array in value if type(value) is tuple else (value,):
            if isinstance(array, np.ndarray) and _array_written_since(array, stamp):
                _raise(op, array, f"its {name}")


def _read_by_backward(op) -> tuple:
    """``(operand indices or None for all, whether the output is read)`` that ``op``'s
    backward reads, given which operands need a gradient (``Op.gradient_reads``)."""
    reads = op.gradient_reads
    if reads is None:
        return op.saved_inputs, op.saves_output
    needs = op.needs_input_grad
    if reads == "others":
        wanted = [j for j, need in enumerate(needs) if need]
        return [i for i in range(len(needs)) if wanted and wanted != [i]], False
    read = {i for j, need in enumerate(needs) if need and j < len(reads) for i in reads[j]}
    return sorted(i for i in read if i >= 0), -1 in read


def check_operand_unchanged(op, index: int) -> None:
    """Raise if ``op``'s operand ``index`` was written in place since ``op``'s forward.

    For ``backward_parts``: call it before computing a part that reads that operand. With
    hooks registered the engine finalises a parameter as soon as its part is yielded, and its
    post-accumulate hooks (e.g. an optimizer step: PyTorch's "optimizer in backward") may
    write it before the op computes its other operands' gradients from the saved values.

    Args:
        op: the op whose backward is running.
        index: the operand the next part reads.

    Example:
        >>> import everyo as eo
        >>> w = eo.ones(2, 2, requires_grad=True)
        >>> y = eo.ones(1, 2, requires_grad=True) @ w
        >>> check_operand_unchanged(y._ctx, 1)  # (nothing written: returns)
    """
    if clock[0] != op.epoch and _written_since(op.parents[index], op.epoch):
        tensor = op.parents[index]
        raise EveryOError(
            f"backward through op {op_name(op)!r}: its operand {index} (shape {tensor.shape}, "
            f"{tensor.dtype}) was written in place by a post-accumulate-grad or rows-ready "
            f"hook (e.g. an optimizer step in the hook) while the op still needed it for its "
            f"gradients: with hooks registered, a parameter is finalised as soon as its "
            f"gradient is ready, inside its op's backward (see docs/autograd.md). Update "
            f"that parameter after backward() instead."
        )


def _raise(op, saved, which: str) -> None:
    """``saved``: the Tensor (or the array an op kept) that was written."""
    array = saved if isinstance(saved, np.ndarray) else saved.data
    entry = _storage.get(id(_base(array)))
    writes = 0 if entry is None else entry[1]
    raise EveryOError(
        f"backward through op {op_name(op)!r}: {which} (shape {array.shape}, "
        f"{array.dtype}) was modified in place after the forward pass (its version is now "
        f"{writes}; the op saved it before that write). The gradient would use values "
        f"the forward pass never saw. Compute the forward again after the in-place update "
        f"(e.g. call optimizer.step() after backward()), or use an out-of-place operation."
    )


def op_name(op) -> str:
    """The registered name of ``op`` (its class name if it was never registered)."""
    name = type(op).name
    return type(op).__name__ if name == "op" else name
