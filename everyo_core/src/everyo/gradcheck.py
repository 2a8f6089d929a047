"""``eo.gradcheck``: analytic gradients against central differences, in float64."""

from __future__ import annotations

import numpy as np

from everyo.dispatch import dispatch
from everyo.dtypes import is_floating
from everyo.engine import grad
from everyo.errors import EveryOError
from everyo.grad_mode import enable_grad, no_grad
from everyo.tensor import Tensor


class GradcheckError(EveryOError):
    """The analytic and numerical gradients disagree."""


def gradcheck(fn, *inputs, params=(), eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-4,
              seed: int = 0) -> bool:
    """Check ``fn``'s gradients numerically.

    Floating ``inputs`` are converted to float64 tensors that require grad; ``params`` are
    tensors (e.g. a float64 module's parameters) checked in place. The output is reduced with
    fixed random weights, so every output element's gradient is exercised.

    Returns True, or raises ``GradcheckError`` naming the input and the worst element.

    Example:
        >>> import everyo as eo, numpy as np
        >>> eo.gradcheck(lambda x: (x * x).sum(), np.array([1.0, -2.0]))
        True
    """
    tensors, checked = _checked_tensors(inputs, params)
    out = fn(*tensors)
    weights = np.random.default_rng(seed).standard_normal(out.shape)

    def objective() -> float:
        with no_grad():
            return float(np.sum(fn(*tensors).data * weights))

    for t in checked:
        t.grad = None
    (out * weights).sum().backward()
    inputs_checked = len(checked) - len(params)
    for position, t in enumerate(checked):
        analytic = np.zeros_like(t.data) if t.grad is None else t.grad
        numeric = _central_differences(objective, t, eps)
        error = np.abs(analytic - numeric)
        bound = atol + rtol * np.abs(numeric)
        if np.any(error > bound):
            worst = np.unravel_index(np.argmax(error - bound), t.shape)
            kind = "input" if position < inputs_checked else "parameter"
            raise GradcheckError(
                f"gradcheck: {kind} {position} (shape {t.shape}) at index {worst}: analytic "
                f"{analytic[worst]:.8g} vs numerical {numeric[worst]:.8g} "
                f"(max abs error {error.max():.3g})"
            )
    return True


def _checked_tensors(inputs, params) -> tuple:
    """``(tensors to call fn with, tensors to check)``: floating inputs as float64 tensors that
    require grad, then the (float64) ``params``, each C-contiguous."""
    tensors = []
    for x in inputs:
        data = x.data if isinstance(x, Tensor) else np.asarray(x)
        if is_floating(data.dtype):  # (bfloat16 included: its NumPy kind is "V")
            tensors.append(Tensor(data.astype(np.float64), requires_grad=True))
        else:
            tensors.append(x if isinstance(x, Tensor) else Tensor(data))
    params = list(params)
    for p in params:
        if p.data.dtype != np.float64:
            raise GradcheckError(f"gradcheck needs float64 parameters, got {p.dtype} "
                                 f"(call module.to('float64') first)")
    checked = [t for t in tensors if t.requires_grad] + params
    for t in checked:
        # NOTE: a contiguous array, so the flat view below perturbs the tensor (not
        # np.ascontiguousarray, which turns a 0-d array into shape (1,)).
        if not t.data.flags.c_contiguous:
            t.data = np.array(t.data, order="C")
    return tensors, checked


def _central_differences(objective, t: Tensor, eps: float) -> np.ndarray:
    """d objective / d t by central differences, one element of ``t`` at a time."""
    numeric = np.zeros_like(t.data)
    flat = t.data.reshape(-1)  # a view: perturbations reach the tensor
    for i in range(flat.size):
        original = flat[i]
        flat[i] = original + eps
        up = objective()
        flat[i] = original - eps
        down = objective()
        flat[i] = original
        numeric.reshape(-1)[i] = (up - down) / (2 * eps)
    return numeric


def gradgradcheck(fn, *inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-4,
                  seed: int = 0) -> bool:
    """Check ``fn``'s second derivatives numerically (in float64).

    Three checks: the first derivatives (:func:`gradcheck`); the differentiable first
    derivative ``eo.grad(fn(*inputs), inputs, v, create_graph=True)`` has the same values as
    the fast one (so an op's ``backward_graph`` agrees with its ``backward``); and that
    differentiable first derivative is itself checked with :func:`gradcheck`, against both the
    floating ``inputs`` and the output gradient ``v`` (fixed random values), as PyTorch's
    gradgradcheck does.

    Returns True, or raises ``GradcheckError`` (or the ``EveryOError`` of an op that has no
    second derivative).

    Example:
        >>> import everyo as eo, numpy as np
        >>> eo.gradgradcheck(lambda x: (x * x * x).sum(), np.array([1.0, -2.0]))
        True
    """
    arrays = [x.data if isinstance(x, Tensor) else np.asarray(x) for x in inputs]
    floating = [i for i, a in enumerate(arrays) if is_floating(a.dtype)]
    if not floating:
        raise GradcheckError("gradgradcheck needs at least one floating input")
    probe = [Tensor(a.astype(np.float64) if is_floating(a.dtype) else a) for a in arrays]
    out_shape = fn(*probe).shape
    v = np.random.default_rng(seed + 1).standard_normal(out_shape)

    def first_derivative(*args):
        *xs, v_t = args
        with enable_grad():
            wrt = [xs[i] for i in floating]
            grads = grad(fn(*xs), wrt, grad_outputs=v_t, create_graph=True, allow_unused=True)
            flat = [(g if g is not None else Tensor(np.zeros(t.shape))).reshape(-1)
                    for g, t in zip(grads, wrt)]
            return flat[0] if len(flat) == 1 else _concatenate(flat)

    gradcheck(fn, *arrays, eps=eps, atol=atol, rtol=rtol, seed=seed)
    xs = [Tensor(a.astype(np.float64), requires_grad=True) if is_floating(a.dtype) else Tensor(a)
          for a in arrays]
    fast = grad(fn(*xs), [xs[i] for i in floating], grad_outputs=Tensor(v), allow_unused=True)
    graph = first_derivative(*xs, Tensor(v)).data
    flat = np.concatenate([np.zeros(xs[i].size) if g is None else g.data.reshape(-1)
                           for g, i in zip(fast, floating)])
    error = np.abs(graph - flat)
    if np.any(error > atol + rtol * np.abs(flat)):
        worst = int(np.argmax(error))
        raise GradcheckError(
            f"gradgradcheck: the differentiable first derivative (backward_graph/composite) "
            f"disagrees with backward at flat element {worst}: {graph[worst]:.8g} vs "
            f"{flat[worst]:.8g}")
    return gradcheck(first_derivative, *arrays, v, eps=eps, atol=atol, rtol=rtol, seed=seed)


def _concatenate(tensors):
    return dispatch("concatenate", *tensors, axis=0)
