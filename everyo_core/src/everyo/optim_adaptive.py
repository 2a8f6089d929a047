"""Adagrad, RMSprop and Adadelta: per-coordinate adaptive learning rates with PyTorch's update
rules, defaults, operation order (float64 trajectories agree to rounding) and state names."""

from __future__ import annotations

import numpy as np

from everyo.errors import EveryOError
from everyo.optim import Optimizer


def _with_weight_decay(w: np.ndarray, g: np.ndarray, weight_decay: float) -> np.ndarray:
    return g + weight_decay * w if weight_decay else g


def _zeros(state: dict, name: str, w: np.ndarray, value: float = 0.0) -> np.ndarray:
    if name not in state:
        state[name] = np.full_like(w, value)
    return state[name]


class Adagrad(Optimizer):
    """Adagrad (Duchi et al.): ``w -= lr_t * g / (sqrt(sum g^2) + eps)`` with
    ``lr_t = lr / (1 + (t - 1) * lr_decay)``.

    Args:
        params: parameters, or a list of dicts (parameter groups) each with ``params``.
        lr, lr_decay, weight_decay, initial_accumulator_value, eps: PyTorch's options and
            defaults.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0])
        >>> opt = eo.Adagrad([w], lr=0.1)
        >>> (w * w).sum().backward(); opt.step()
        >>> w.data
        array([0.9], dtype=float32)
    """

    state_names = ("sum",)

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach=None, *, maximize: bool = False,
                 differentiable: bool = False, fused=None):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps, foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, fused=fused))

    def _update(self, w, g, state, group):
        total = _zeros(state, "sum", w, group["initial_accumulator_value"])
        state["step"] = int(state.get("step", 0)) + 1
        g = _with_weight_decay(w, g, group["weight_decay"])
        rate = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        total += g * g
        w -= rate * (g / (np.sqrt(total) + group["eps"]))


class RMSprop(Optimizer):
    """RMSprop (Hinton): divide by a running root mean square of the gradients; optional
    ``momentum`` and ``centered`` (subtract the running mean's square), as PyTorch's.

    Args:
        params: parameters, or a list of dicts (parameter groups) each with ``params``.
        lr, alpha, eps, weight_decay, momentum, centered: PyTorch's options and defaults.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0])
        >>> opt = eo.RMSprop([w], lr=0.01, momentum=0.9, centered=True)
        >>> (w * w).sum().backward(); opt.step()
        >>> sorted(opt.state[w])
        ['grad_avg', 'momentum_buffer', 'square_avg', 'step']
    """

    state_names = ("square_avg", "momentum_buffer", "grad_avg")

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 capturable: bool = False, foreach=None, maximize: bool = False,
                 differentiable: bool = False):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered,
                                      capturable=capturable, foreach=foreach, maximize=maximize,
                                      differentiable=differentiable))

    def _update(self, w, g, state, group):
        alpha = group["alpha"]
        square_avg = _zeros(state, "square_avg", w)
        state["step"] = int(state.get("step", 0)) + 1
        g = _with_weight_decay(w, g, group["weight_decay"])
        square_avg *= alpha
        square_avg += (1 - alpha) * (g * g)
        if group["centered"]:
            grad_avg = _zeros(state, "grad_avg", w)
            grad_avg += (1 - alpha) * (g - grad_avg)  # PyTorch's lerp for a weight < 0.5
            avg = np.sqrt(square_avg - grad_avg * grad_avg) + group["eps"]
        else:
            avg = np.sqrt(square_avg) + group["eps"]
        if group["momentum"] > 0:
            buffer = _zeros(state, "momentum_buffer", w)
            buffer *= group["momentum"]
            buffer += g / avg
            w -= group["lr"] * buffer
        else:
            w -= group["lr"] * (g / avg)

    def _check_options(self, group):
        super()._check_options(group)
        if not 0.0 <= group["alpha"] <= 1.0:
            raise EveryOError(f"RMSprop: alpha must be in [0, 1], got {group['alpha']}")


class Adadelta(Optimizer):
    """Adadelta (Zeiler): steps scaled by the ratio of running RMS of past steps and of
    gradients, ``w -= lr * delta``.

    Args:
        params: parameters, or a list of dicts (parameter groups) each with ``params``.
        lr, rho, eps, weight_decay: PyTorch's options and defaults (``lr=1.0``).

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0])
        >>> opt = eo.Adadelta([w])
        >>> (w * w).sum().backward(); opt.step()
        >>> sorted(opt.state[w])
        ['acc_delta', 'square_avg', 'step']
    """

    state_names = ("square_avg", "acc_delta")

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, foreach=None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False):
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      foreach=foreach, capturable=capturable,
                                      maximize=maximize, differentiable=differentiable))

    def _update(self, w, g, state, group):
        rho, eps = group["rho"], group["eps"]
        square_avg, acc_delta = _zeros(state, "square_avg", w), _zeros(state, "acc_delta", w)
        state["step"] = int(state.get("step", 0)) + 1
        g = _with_weight_decay(w, g, group["weight_decay"])
        square_avg *= rho
        square_avg += (1 - rho) * (g * g)
        delta = np.sqrt(acc_delta + eps) / np.sqrt(square_avg + eps) * g
        acc_delta *= rho
        acc_delta += (1 - rho) * (delta * delta)
        w -= group["lr"] * delta

    def _check_options(self, group):
        super()._check_options(group)
        if not 0.0 <= group["rho"] <= 1.0:
            raise EveryOError(f"Adadelta: rho must be in [0, 1], got {group['rho']}")
