"""Optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW, with PyTorch's update
rules and defaults. They update ``param.data`` in place."""

from __future__ import annotations

import numpy as np

from everyo.errors import EveryOError
from everyo.versioning import bump_version


class Optimizer:
    """Base class: holds the parameters, hyper-parameters and per-parameter state.

    Hyper-parameters are attributes (``optimizer.lr = 0.01`` is how schedulers change them).
    """

    hyperparameters: tuple[str, ...] = ("lr",)
    state_names: tuple[str, ...] = ()

    def __init__(self, params, **hyper):
        self.params = list(params)
        if not self.params:
            raise EveryOError(f"{type(self).__name__} got an empty parameter list")
        for p in self.params:
            if not getattr(p, "requires_grad", False):
                raise EveryOError(f"{type(self).__name__}: every parameter must require grad; "
                                  f"got a {type(p).__name__} of shape {getattr(p, 'shape', '?')}")
        for name, value in hyper.items():
            if isinstance(value, (int, float)) and value < 0:
                raise EveryOError(f"{type(self).__name__}: {name} must be >= 0, got {value}")
            setattr(self, name, value)
        self.state: list[dict] = [{} for _ in self.params]
        self.step_count = 0

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to None."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Apply one update to every parameter that has a gradient."""
        self.step_count += 1
        for p, state in zip(self.params, self.state):
            if p.grad is not None:
                self._update(p.data, p.grad, state)
                bump_version(p)  # a graph that saved p before this step must not run backward

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict) -> None:  # pragma: no cover
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Hyper-parameters, step count and per-parameter buffers (copies)."""
        return {
            "type": type(self).__name__,
            "hyperparameters": {name: getattr(self, name) for name in self.hyperparameters},
            "step_count": self.step_count,
            "state": [{k: np.array(v, copy=True) for k, v in s.items()} for s in self.state],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; refuses another optimizer's state."""
        if state.get("type") != type(self).__name__:
            raise EveryOError(f"{type(self).__name__}.load_state_dict: the state belongs to "
                              f"{state.get('type')!r}")
        buffers = list(state["state"])
        if len(buffers) != len(self.params):
            raise EveryOError(f"{type(self).__name__}.load_state_dict: the state has "
                              f"{len(buffers)} parameters, the optimizer {len(self.params)}")
        for i, (p, s) in enumerate(zip(self.params, buffers)):
            for name, value in s.items():
                if name in self.state_names and np.shape(value) != p.shape:
                    raise EveryOError(f"{type(self).__name__}.load_state_dict: buffer {name!r} "
                                      f"of parameter {i} has shape {np.shape(value)}, the "
                                      f"parameter {p.shape}")
        for name, value in state["hyperparameters"].items():
            setattr(self, name, value)
        self.step_count = int(state["step_count"])
        self.state = [{k: np.array(v, dtype=p.data.dtype) if k in self.state_names
                       else np.array(v, copy=True) for k, v in s.items()}
                      for p, s in zip(self.params, buffers)]


class SGD(Optimizer):
    """Stochastic gradient descent with PyTorch's momentum/dampening/Nesterov rule.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0])
        >>> opt = eo.SGD([w], lr=0.1)
        >>> (w * w).sum().backward(); opt.step()
        >>> w.data
        array([0.8], dtype=float32)
    """

    hyperparameters = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float = 0.01, momentum: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise EveryOError("SGD: nesterov needs momentum > 0 and dampening == 0")
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         nesterov=nesterov, weight_decay=weight_decay)

    def _update(self, w, g, state):
        if self.weight_decay:
            g = g + self.weight_decay * w
        if self.momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = np.array(g, dtype=w.dtype, copy=True)
            else:
                buf *= self.momentum
                buf += (1 - self.dampening) * g
            g = g + self.momentum * buf if self.nesterov else buf
        w -= (self.lr * g).astype(w.dtype, copy=False)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; ``weight_decay`` adds L2 to the gradient."""

    hyperparameters = ("lr", "betas", "eps", "weight_decay")
    state_names = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)

    def _update(self, w, g, state):
        beta1, beta2 = self.betas
        if self.weight_decay:
            if self.decoupled:
                w *= 1 - self.lr * self.weight_decay
            else:
                g = g + self.weight_decay * w
        if "exp_avg" not in state:
            state["exp_avg"] = np.zeros_like(w)
            state["exp_avg_sq"] = np.zeros_like(w)
        # NOTE: the bias correction counts this parameter's own updates, as PyTorch's: a
        # parameter whose first gradient arrives late starts from t = 1.
        t = state["step"] = int(state.get("step", 0)) + 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * (g * g)
        step_size = self.lr / (1 - beta1 ** t)
        denom = np.sqrt(v / (1 - beta2 ** t)) + self.eps
        w -= (step_size * m / denom).astype(w.dtype, copy=False)


    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for buffers in self.state:
            # NOTE: a checkpoint written before steps were counted per parameter has none;
            # the optimizer's own count is what its bias correction used then.
            if "exp_avg" in buffers and "step" not in buffers:
                buffers["step"] = self.step_count


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); default ``weight_decay=0.01``."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
