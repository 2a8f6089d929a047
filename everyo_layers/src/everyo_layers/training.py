"""Training utilities: ``clip_grad_norm_`` and the learning-rate schedulers ``StepLR`` and
``CosineAnnealingLR`` (PyTorch semantics: they set ``optimizer.lr``; call ``step()`` once per
epoch, after the optimizer's steps)."""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Tensor
from everyo_layers.precision import accumulation_dtype


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scale the gradients of ``parameters`` in place so that their joint norm is at most
    ``max_norm``.

    Args:
        parameters: an iterable of tensors (e.g. ``model.parameters()``) or one tensor;
            those without a gradient are skipped.
        max_norm: the largest allowed norm.
        norm_type: the p of the p-norm (``float("inf")`` for the max-norm).
        error_if_nonfinite: raise if the total norm is nan or inf.

    Returns:
        The total norm of the gradients before clipping, as a Python float.

    Example:
        >>> import everyo as eo, numpy as np
        >>> w = eo.Parameter(np.zeros(2, np.float32))
        >>> w.grad = np.array([3.0, 4.0], np.float32)
        >>> eo.clip_grad_norm_([w], max_norm=1.0)
        5.0
        >>> w.grad.round(4)
        array([0.6, 0.8], dtype=float32)
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm_type = float(norm_type)
    # NOTE: float16 gradients are measured in float32: their squares overflow at 256.
    flat = [g.reshape(-1).astype(accumulation_dtype(g.dtype), copy=False)
            for g in grads]
    if math.isinf(norm_type):
        total = max(float(np.max(np.abs(f))) if f.size else 0.0 for f in flat)
    elif norm_type == 2.0:
        total = math.sqrt(sum(float(np.dot(f, f)) for f in flat))
    else:
        total = sum(float(np.sum(np.abs(f) ** norm_type)) for f in flat) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise EveryOError(f"clip_grad_norm_: the total gradient norm is {total}; pass "
                          f"error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # a NaN norm scales by NaN, as PyTorch does: the step shows it
        for g in grads:
            g *= g.dtype.type(coef)
    return total


class LRScheduler:
    """Base of the schedulers: remembers the optimizer's initial ``lr`` and sets a new one on
    every :meth:`step` from a closed form of the epoch count ``last_epoch``."""

    def __init__(self, optimizer, last_epoch: int = -1):
        if not hasattr(optimizer, "lr"):
            raise EveryOError(f"{type(self).__name__}: {type(optimizer).__name__} has no lr")
        self.optimizer = optimizer
        if last_epoch == -1:
            self.base_lr = float(optimizer.lr)
        elif not hasattr(self, "base_lr"):
            self.base_lr = float(getattr(optimizer, "initial_lr", optimizer.lr))
        optimizer.initial_lr = self.base_lr
        self.last_epoch = last_epoch
        self.step()  # epoch 0 (as PyTorch): sets lr for the first epoch

    def lr_at(self, epoch: int) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self) -> None:
        """Advance one epoch and set ``optimizer.lr``."""
        self.last_epoch += 1
        self.optimizer.lr = self.lr_at(self.last_epoch)

    def get_last_lr(self) -> list:
        """The learning rate set by the last :meth:`step`, as a one-element list (PyTorch)."""
        return [self.optimizer.lr]

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


class StepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` epochs.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.StepLR(opt, step_size=2, gamma=0.5)
        >>> lrs = []
        >>> for _ in range(5):
        ...     lrs.append(opt.lr); sched.step()
        >>> lrs
        [1.0, 1.0, 0.5, 0.5, 0.25]
    """

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if step_size <= 0:
            raise EveryOError(f"StepLR: step_size must be positive, got {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """Anneal the learning rate from its initial value to ``eta_min`` along half a cosine
    over ``T_max`` epochs (and back up after, as PyTorch's curve does).

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.CosineAnnealingLR(opt, T_max=2)
        >>> sched.step(); opt.lr
        0.5
    """

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0,  # noqa: N803 (torch's name)
                 last_epoch: int = -1):
        if T_max <= 0:
            raise EveryOError(f"CosineAnnealingLR: T_max must be positive, got {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        cosine = (1 + math.cos(math.pi * epoch / self.T_max)) / 2
        return self.eta_min + (self.base_lr - self.eta_min) * cosine


OPS: dict = {}
LAYERS = {"clip_grad_norm_": clip_grad_norm_, "StepLR": StepLR,
          "CosineAnnealingLR": CosineAnnealingLR}
