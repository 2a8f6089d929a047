"""``eo.gradcheck``: analytic gradients against central differences, in float64."""

from __future__ import annotations

import numpy as np

from everyo.errors import EveryOError
from everyo.grad_mode import no_grad
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
    tensors = []
    for x in inputs:
        data = x.data if isinstance(x, Tensor) else np.asarray(x)
        if data.dtype.kind == "f":
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
        t.data = np.ascontiguousarray(t.data)  # so the flat view below perturbs the tensor

    out = fn(*tensors)
    weights = np.random.default_rng(seed).standard_normal(out.shape)

    def objective() -> float:
        with no_grad():
            return float(np.sum(fn(*tensors).data * weights))

    for t in checked:
        t.grad = None
    (out * weights).sum().backward()
    for position, t in enumerate(checked):
        analytic = np.zeros_like(t.data) if t.grad is None else t.grad
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
        error = np.abs(analytic - numeric)
        bound = atol + rtol * np.abs(numeric)
        if np.any(error > bound):
            worst = np.unravel_index(np.argmax(error - bound), t.shape)
            kind = "input" if position < len(checked) - len(params) else "parameter"
            raise GradcheckError(
                f"gradcheck: {kind} {position} (shape {t.shape}) at index {worst}: analytic "
                f"{analytic[worst]:.8g} vs numerical {numeric[worst]:.8g} "
                f"(max abs error {error.max():.3g})"
            )
    return True
