"""The backward engine: the choice of walk, and the general walk (differentiable gradients,
``eo.grad`` and hooks).

``Tensor.backward()`` calls :func:`backward`, which chooses: on arrays without hooks, the fast
walk :func:`everyo.autograd.backward_arrays`; with hooks or ``create_graph``, the general walk
here. With ``create_graph=True`` gradients are Tensors built from EveryO ops, so they can be
differentiated again. Per op the engine uses, in this order:

1. ``op.backward_graph(g, out)``: the op's backward written with EveryO ops;
2. ``op.composite(*parents)``: the op's forward written with EveryO ops, differentiated here;
3. neither: ``op.backward`` on arrays gives the right first derivative, wrapped in a node that
   raises an ``EveryOError`` naming the op if anything differentiates through it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from everyo import hooks
from everyo.autograd import (
    Op,
    accumulate_leaf,
    backward_arrays,
    raise_shape_mismatch,
    release,
    root_gradient,
    shared,
    topological_order,
)
from everyo.errors import EveryOError
from everyo.grad_mode import enable_grad
from everyo.grad_rows import RowBlocks
from everyo.tensor import Tensor
from everyo.versioning import check_saved, clock, op_name


def backward(root: Tensor, grad=None, retain_graph: bool | None = None,
             create_graph: bool = False) -> None:
    """Propagate ``grad`` (default 1) from ``root`` into every leaf's ``.grad``: what
    ``Tensor.backward`` does (its docstring has the arguments).

    The fast walk on arrays when no hook is registered and no graph is wanted; else the
    general walk, which runs hooks and can build the gradient computation as a graph.
    """
    if retain_graph is None:
        retain_graph = create_graph
    if not (create_graph or hooks.tensor_hooks or hooks.post_accumulate_hooks
            or hooks.rows_ready_hooks):
        backward_arrays(root, grad, retain_graph)
        return
    start: Any = root_gradient(root, grad)
    if create_graph:
        start = grad if isinstance(grad, Tensor) else Tensor._make(start, False, None)
    _execute([root], [start], retain_graph, create_graph, accumulate=True)


def _tensors(value, what: str) -> list:
    """``eo.grad``'s ``outputs``/``inputs``: one Tensor or a sequence of them, as a list."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise EveryOError(f"eo.grad: {what} must be a Tensor or a sequence of Tensors, got a "
                          f"{type(value).__name__}")
    return list(value)


#: What ``eo.grad`` takes as one output's gradient given alone (not a sequence of them): an
#: array, a NumPy or Python number, or a string that root_gradient refuses by name.
_ONE_GRADIENT = (Tensor, np.ndarray, np.generic, int, float, complex, str, bytes)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool = False) -> tuple:
    """Gradients of ``outputs`` with respect to ``inputs``, without touching any ``.grad``.

    Args:
        outputs: a Tensor or a sequence of Tensors to differentiate.
        inputs: a Tensor or a sequence of Tensors (leaves or intermediate results).
        grad_outputs: the gradient with respect to each output (default: 1 for one-element
            outputs); Tensors that require grad are allowed when ``create_graph=True``.
        retain_graph: keep the graph for another backward (default: ``create_graph``).
        create_graph: return gradients that are themselves differentiable.
        allow_unused: return None for an input the outputs do not depend on (else raise).

    Returns:
        A tuple with one Tensor (or None) per input.

    Example:
        >>> import everyo as eo
        >>> x = eo.tensor([3.0], requires_grad=True)
        >>> (dx,) = eo.grad((x ** 3).sum(), x, create_graph=True)
        >>> (d2x,) = eo.grad(dx.sum(), x)
        >>> float(dx.data[0]), float(d2x.data[0])
        (27.0, 18.0)
    """
    outputs, inputs = _tensors(outputs, "outputs"), _tensors(inputs, "inputs")
    if grad_outputs is None or isinstance(grad_outputs, _ONE_GRADIENT):
        grad_outputs = [grad_outputs] * len(outputs) if grad_outputs is None else [grad_outputs]
    grad_outputs = list(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise EveryOError(f"eo.grad: {len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise EveryOError(f"eo.grad: input {i} does not require grad (shape "
                              f"{getattr(t, 'shape', '?')}); only tensors with "
                              f"requires_grad=True can be differentiated against")
    starts = []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs)):
        if not isinstance(out, Tensor):
            raise EveryOError(f"eo.grad: output {i} is a {type(out).__name__}, not a Tensor")
        if not out.requires_grad:
            raise EveryOError(f"eo.grad: output {i} (shape {out.shape}) does not require grad")
        start: Any = root_gradient(out, g)
        if create_graph:
            start = g if isinstance(g, Tensor) else Tensor._make(start, False, None)
        starts.append(start)
    if retain_graph is None:
        retain_graph = create_graph
    found = _execute(outputs, starts, retain_graph, create_graph, inputs=inputs)
    result: list[Tensor | None] = []
    for i, g in enumerate(found):
        if g is None:
            if not allow_unused:
                raise EveryOError(f"eo.grad: input {i} (shape {inputs[i].shape}) was not used "
                                  f"to compute the outputs; pass allow_unused=True to get None")
            result.append(None)
        else:
            result.append(g if isinstance(g, Tensor) else Tensor._make(np.asarray(g), False, None))
    return tuple(result)


def _execute(roots, starts, retain_graph, create_graph, inputs=(), stop_at_inputs=False,
             accumulate=False, run_hooks=True) -> list:
    """Walk the graph from ``roots``; returns the gradient reaching each of ``inputs``.

    ``accumulate`` adds leaf gradients into ``.grad`` (backward); ``stop_at_inputs`` treats
    the inputs as leaves (the partial derivatives a composite op needs).
    """
    if create_graph:
        with enable_grad():
            return _walk(roots, starts, retain_graph, True, inputs, stop_at_inputs,
                         accumulate, run_hooks)
    return _walk(roots, starts, retain_graph, False, inputs, stop_at_inputs, accumulate,
                 run_hooks)


def _walk(roots, starts, retain_graph, create_graph, inputs, stop_at_inputs, accumulate,
          run_hooks) -> list:
    walk = _Walk(inputs, stop_at_inputs, create_graph, accumulate, run_hooks)
    for t, g in zip(roots, starts):
        walk.arrive(t, g)
    order = topological_order([t._ctx for t in roots if t._ctx is not None
                               and id(t) not in walk.stop], walk.stop)
    by_step = walk.final_steps(order)
    # With post-accumulate or rows-ready hooks (the only observers of when a leaf is final) an
    # op with backward_parts finalises a leaf as soon as its part arrives: step -> leaf ids.
    early: dict = _early_leaves(order, by_step) if (
        accumulate and run_hooks and not create_graph
        and (hooks.post_accumulate_hooks or hooks.rows_ready_hooks)) else {}
    pending = walk.pending
    for i, op in enumerate(order):
        g = pending.pop(id(op), None)
        if g is not None:
            walk.step(op, g, early.get(i))
            if not retain_graph:
                release(op)
        for key in by_step.get(i, ()):
            walk.finish(key)
    captured = walk.captured
    for i, t in enumerate(inputs):  # an input listed twice gets its gradient twice (PyTorch)
        captured[i] = captured[walk.wanted[id(t)]]
    return captured


class _Walk:
    """The state of one pass of the general walk: the gradient pending for each op, each
    leaf's summed gradient, and the gradients captured for ``inputs`` (``eo.grad``)."""

    __slots__ = ("wanted", "stop", "captured", "leaves", "pending", "outputs", "now",
                 "create_graph", "accumulate", "run_hooks")

    def __init__(self, inputs, stop_at_inputs, create_graph, accumulate, run_hooks) -> None:
        self.wanted = {id(t): i for i, t in reversed(list(enumerate(inputs)))}
        self.stop = set(self.wanted) if stop_at_inputs else ()
        self.captured: list = [None] * len(inputs)
        # id(leaf) -> [leaf, summed gradient, whether that array may alias other memory]
        self.leaves: dict = {}
        self.pending: dict = {}  # id(op) -> summed gradient with respect to its output
        self.outputs: dict = {}  # id(op) -> its output Tensor, met while walking consumers
        self.now = clock[0]
        self.create_graph, self.accumulate, self.run_hooks = create_graph, accumulate, run_hooks

    def arrive(self, t, g, aliased: bool = True) -> None:
        """Add ``g`` to the gradient of ``t``: its leaf entry, or its producer's pending sum."""
        ctx = t._ctx
        if ctx is None or id(t) in self.stop:
            entry = self.leaves.get(id(t))
            if entry is None:
                self.leaves[id(t)] = [t, g, aliased]
            else:
                entry[1], entry[2] = entry[1] + g, False
            return
        key = id(ctx)
        if key not in self.outputs:
            self.outputs[key] = t
            if ctx.epoch != self.now:
                check_saved(ctx, t)
        previous = self.pending.get(key)
        self.pending[key] = g if previous is None else previous + g

    def finish(self, key) -> None:
        """Finalise the leaf with id ``key``: its hooks, its capture, its ``.grad``."""
        entry = self.leaves.pop(key, None)
        if entry is not None:
            _finish_leaf(entry, self.wanted, self.captured, self.accumulate, self.run_hooks,
                         self.create_graph)

    def final_steps(self, order: list) -> dict:
        """step -> ids of the leaves whose gradient is final after that step's op (the last
        that uses them); leaves no op uses (roots) are finalised now.

        Hooks and accumulation happen there: for parameters used once per step, as soon as
        their layer is done."""
        final_at: dict = {}
        stop = self.stop
        for i, op in enumerate(order):
            for t, needed in zip(op.parents, op.needs_input_grad):
                if needed and (t._ctx is None or id(t) in stop):
                    final_at[id(t)] = i
        by_step: dict = {}
        for key, i in final_at.items():
            by_step.setdefault(i, []).append(key)
        for key in [k for k in self.leaves if k not in final_at]:
            self.finish(key)
        return by_step

    def step(self, op, g, waiting) -> None:
        """Run ``op``'s backward on its summed output gradient ``g`` and pass each operand's
        part on (a gradient in row blocks once its last block is computed); ``waiting``: ids
        of the leaves to finalise as soon as their part arrives (or None)."""
        out = self.outputs.pop(id(op))
        create_graph = self.create_graph
        if self.run_hooks and hooks.tensor_hooks:
            g = _run_tensor_hooks(hooks.tensor_hooks.get(id(op)), g, create_graph)
        position = self.wanted.get(id(out))
        if position is not None:
            self.captured[position] = g
        if op.epoch != self.now:
            check_saved(op)
        if waiting is None:
            grads = _graph_vjp(op, g, out) if create_graph else op.backward(g)
            parts = enumerate(grads if type(grads) is tuple else (grads,))
        else:
            parts = op.backward_parts(g)
        parents, needs = op.parents, op.needs_input_grad
        blocks = None  # (a RowBlocks once the op hands a gradient over in row blocks)
        try:
            for part in parts:
                index, gi = part[0], part[1]
                if gi is None or not needs[index]:
                    continue
                t = parents[index]
                if len(part) == 3:  # rows up to part[2] of gi are computed
                    if blocks is None:
                        blocks = RowBlocks(op)
                    if not self._take_block(blocks, part, t, g, waiting):
                        continue
                dtype = gi.data.dtype if create_graph else gi.dtype  # (Tensor.dtype: a name)
                if dtype != t.data.dtype:
                    gi = gi.astype(t.data.dtype)
                if gi.shape != t.data.shape:
                    raise_shape_mismatch(op, gi.shape, t.data.shape)
                self.arrive(t, gi, create_graph or shared(gi, g))
                if waiting is not None and id(t) in waiting:
                    self.finish(id(t))
            if blocks is not None:
                blocks.finished()
        except BaseException:
            if blocks is not None:
                blocks.abandon()
            raise

    def _take_block(self, blocks, part, t, g, waiting) -> bool:
        """Hand one row block to ``blocks``; True when the whole gradient is computed."""
        index, gi, stop = part
        if blocks.starts(index):
            announced = waiting is not None and id(t) in waiting and \
                _takes_rows(t, gi, g, self.leaves)
            blocks.begin(index, gi, t if announced else None)
        return blocks.take(gi, stop)


def _early_leaves(order: list, by_step: dict) -> dict:
    """step -> ids of the leaves that step's op finalises, for the ops with ``backward_parts``
    whose operands are distinct tensors.

    NOTE: an op given one tensor twice (``w @ w``) runs its plain ``backward``: its parts could
    reach that tensor in another order than ``backward``'s, and with a third contribution the
    float sum would round differently.
    """
    early: dict = {}
    for i, keys in by_step.items():
        op = order[i]
        if type(op).backward_parts is None:
            continue
        parents = op.parents
        if len({id(t) for t in parents}) != len(parents):
            continue
        # NOTE: a hook not registered with early=True may write tensors (an optimizer step in
        # backward): it runs after the op's whole backward, as in PyTorch
        keys = {key for key in keys if hooks.only_early_hooks(key)}
        if keys:
            early[i] = keys
    return early


def _takes_rows(t, gi, g, leaves) -> bool:
    """True when leaf ``t``, finalised early by the op handing ``gi`` over in row blocks, can
    be finalised block by block: someone listens for rows, no tensor hook must see the whole
    gradient first, nothing else contributed to it, and ``gi`` needs no cast, no copy and no
    reshape to become (or be added to) ``t.grad``. Otherwise it is taken whole (as before)."""
    key = id(t)
    return (key in hooks.rows_ready_hooks and key not in hooks.tensor_hooks
            and key not in leaves and t.requires_grad and gi.dtype == t.data.dtype
            and gi.shape == t.data.shape and not shared(gi, g)
            and (t.grad is None or t.grad.shape == gi.shape))


def _finish_leaf(entry, wanted, captured, accumulate, run_hooks, create_graph) -> None:
    t, g, aliased = entry
    fns = hooks.tensor_hooks.get(id(t)) if run_hooks and hooks.tensor_hooks else None
    if fns:
        g = _run_tensor_hooks(fns, g, create_graph)
        aliased = True  # (the hooks were handed the array, or returned one: either may be kept)
    position = wanted.get(id(t))
    if position is not None:
        captured[position] = g
    if accumulate and t._ctx is None:
        array = g.data if isinstance(g, Tensor) else g
        # NOTE: copied only when the array may be shared: copying every gradient cost
        # mlp_large's hooked backward ~25 MB of memory traffic per step
        accumulate_leaf(t, array, copy=aliased or create_graph or position is not None)
        if run_hooks and t.requires_grad:
            hooks.run_post_accumulate_hooks(t)


def _run_tensor_hooks(fns, g, create_graph):
    if not fns:
        return g
    for fn in list(fns):
        array = g.data if isinstance(g, Tensor) else g
        replaced = fn(array)
        if replaced is None:
            continue
        replaced = np.asarray(replaced.data if isinstance(replaced, Tensor) else replaced,
                              dtype=array.dtype)
        if replaced.shape != array.shape:
            raise EveryOError(f"a gradient hook returned shape {replaced.shape} for a gradient "
                              f"of shape {array.shape}")
        if create_graph:
            # NOTE: a hook works on arrays, so the replacement carries no graph: mark it so that
            # differentiating through it raises instead of silently giving zero.
            g = _opaque(replaced, (g,), "gradient hook " + getattr(fn, "__name__", "?"))
        else:
            g = replaced
    return g


# -- differentiable vector-Jacobian products -------------------------------------------------

def _graph_vjp(op, g: Tensor, out: Tensor) -> tuple:
    cls = type(op)
    if cls.backward_graph is not None:
        grads = op.backward_graph(g, out)
    elif cls.composite is not None:
        grads = _composite_vjp(op, g)
    else:
        return _opaque_vjp(op, g)
    if type(grads) is not tuple:
        grads = tuple(grads) if isinstance(grads, list) else (grads,)
    return tuple(gi if gi is None or isinstance(gi, Tensor) else Tensor._make(
        np.asarray(gi), False, None) for gi in grads)


def _composite_vjp(op, g: Tensor) -> tuple:
    parents = op.parents
    if op.epoch != clock[0]:  # composite reads every operand, saved for backward or not
        check_saved(op, every_operand=True)
    with enable_grad():
        recomputed = op.composite(*parents)
    targets, positions, seen = [], [], set()
    for i, (t, needed) in enumerate(zip(parents, op.needs_input_grad)):
        # NOTE: one tensor passed twice (mul(x, x)) gets its total gradient once.
        if needed and id(t) not in seen:
            seen.add(id(t))
            targets.append(t)
            positions.append(i)
    found = _execute([recomputed], [g], True, True, inputs=targets, stop_at_inputs=True,
                     run_hooks=False)
    grads: list = [None] * len(parents)
    for i, gi in zip(positions, found):
        grads[i] = gi
    return tuple(grads)


def _opaque_vjp(op, g: Tensor) -> tuple:
    arrays = op.backward(g.data)
    if type(arrays) is not tuple:
        arrays = (arrays,)
    sources = (g,) + tuple(op.parents)
    return tuple(None if a is None else _opaque(a, sources, f"op {op_name(op)!r}")
                 for a in arrays)


class NoSecondDerivative(Op):
    """Stands for a gradient whose own derivative EveryO cannot compute; backward raises."""

    __slots__ = ("what",)
    what: str
    name = "no_second_derivative"
    saved_inputs = ()
    saves_output = False

    def backward(self, g):
        raise EveryOError(
            f"second derivative through {self.what}: it has neither backward_graph nor "
            f"composite, so its gradient cannot be differentiated. Use create_graph=False, or "
            f"give the op a backward_graph/composite (see docs/autograd.md)"
        )


def _opaque(array: np.ndarray, sources, what: str) -> Tensor:
    parents = tuple(t for t in sources if t.requires_grad)
    if not parents:
        return Tensor._make(array, False, None)
    node = object.__new__(NoSecondDerivative)
    node.what = what
    node.parents = parents
    node.needs_input_grad = (True,) * len(parents)
    node.saved = None
    node.epoch = clock[0]
    return Tensor._make(array, True, node)
