"""Learning-rate schedulers with PyTorch's semantics, one learning rate per parameter group.

A scheduler changes ``group["lr"]`` of every parameter group of its optimizer. Call
``scheduler.step()`` after ``optimizer.step()``, once per epoch (or per batch, for schedules
counted in batches). Most schedules are *chainable*, as PyTorch's: ``step()`` multiplies the
learning rate the group has *now* by the change the schedule makes at this step, so a manual
``group["lr"] = ...`` or a second scheduler on the same optimizer composes instead of being
overwritten. ``LambdaLR``, ``CosineAnnealingWarmRestarts`` and ``OneCycleLR`` compute the rate
from the step count alone, as PyTorch's do.

The arithmetic follows PyTorch's operation for operation, so the sequences agree exactly.
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from everyo.errors import EveryOError
from everyo.validation import ArgumentError, checked_argument, checked_list, expect_state, is_int


def per_group(name: str, optimizer, value, kind: str | None = None,
              scheduler: str = "") -> list:
    """``value`` for every parameter group: a list of one per group, or one for all.

    Args:
        name: the argument's name, for errors.
        optimizer: the scheduler's optimizer.
        value: one value, or a list/tuple of one per parameter group.
        kind: when given, every value is checked as :func:`~everyo.validation.checked_argument`
            checks it (``"function"`` asks for a callable).
        scheduler: the scheduler's class name, for errors.
    Returns:
        A list with one value per parameter group.

    Example:
        >>> import everyo as eo
        >>> per_group("max_lr", eo.SGD([eo.Parameter([1.0])], lr=1.0), 0.5)
        [0.5]
    """
    if not hasattr(optimizer, "param_groups"):
        raise EveryOError(f"{scheduler or name}: {type(optimizer).__name__} is not an "
                          f"optimizer (it has no param_groups)")
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise EveryOError(f"{name} has {len(value)} values, the optimizer "
                              f"{len(optimizer.param_groups)} parameter groups")
        values = list(value)
    else:
        values = [value] * len(optimizer.param_groups)
    if kind == "function":
        for fn in values:
            if not callable(fn):
                raise ArgumentError(f"{scheduler}: {name} must be a function of the "
                                    f"epoch, got {fn!r} ({type(fn).__name__})")
    elif kind is not None:
        values = [checked_argument(scheduler, name, v, kind) for v in values]
    return values


def epoch_list(scheduler: str, milestones) -> list:
    """``milestones`` as a list of positive epoch ints, each checked.

    Args:
        scheduler: the scheduler's class name, for errors.
        milestones: any iterable of epochs, as PyTorch takes (a list, tuple, set, ``range``
            or 1-D integer array).
    Returns:
        The epochs as a list, in the given order.

    Example:
        >>> epoch_list("MultiStepLR", range(10, 40, 10))
        [10, 20, 30]
    """
    if isinstance(milestones, (str, bytes, dict)) or not hasattr(milestones, "__iter__") \
            or getattr(milestones, "ndim", 1) != 1:
        raise ArgumentError(f"{scheduler}: milestones must be a list of epochs, got "
                            f"{milestones!r}")
    return [checked_argument(scheduler, "milestones", m, "positive int") for m in milestones]


def current_lrs(optimizer) -> list:
    return [group["lr"] for group in optimizer.param_groups]


def set_lrs(owner: str, optimizer, values) -> None:
    """Set each group's ``lr`` to ``values`` (one per group), after checking every one is a
    finite number: a schedule computing NaN, inf or a string changes no group and names the
    group. (Not refused: a negative rate, which PyTorch's three-phase linear OneCycleLR
    computes at its end.)"""
    values = list(values)
    checked = [checked_argument(owner, f"the lr computed for group {i}", value, "float",
                                EveryOError)
               for i, value in enumerate(values)]
    for group, lr in zip(optimizer.param_groups, checked):
        group["lr"] = lr


def lambda_factor(owner: str, lmbda, epoch) -> float:
    """``lmbda(epoch)``, a scheduler's factor, checked to be a finite number."""
    return checked_argument(owner, f"lr_lambda({epoch})", lmbda(epoch), "float", EveryOError)


class LRScheduler:
    """Base of the schedulers: records each group's ``initial_lr`` and, on every
    :meth:`step`, sets each group's ``lr`` to what :meth:`get_lr` computes.

    Subclasses implement ``get_lr()`` (reading ``self.last_epoch``, ``self.base_lrs`` and the
    groups' current ``lr``) and, where a closed form exists, ``closed_form_lr()``.
    """

    _is_initial = False
    #: attribute -> the kind its constructor checks it as (:func:`checked_argument`);
    #: :meth:`load_state_dict` checks a saved value with the same call. Subclasses add theirs.
    state_kinds: dict = {"last_epoch": "int", "_step_count": "non-negative int"}
    #: attributes holding one learning rate per parameter group
    per_group_state: tuple = ("base_lrs", "_last_lr")
    #: string attributes -> the values the constructor accepts
    state_choices: dict = {}

    def __init__(self, optimizer, last_epoch: int = -1):
        if not hasattr(optimizer, "param_groups"):
            raise EveryOError(f"{type(self).__name__}: {type(optimizer).__name__} is not an "
                              f"optimizer (it has no param_groups)")
        self.optimizer = optimizer
        last_epoch = checked_argument(type(self).__name__, "last_epoch", last_epoch, "int")
        if last_epoch < -1:
            raise ArgumentError(f"{type(self).__name__}: last_epoch must be -1 (a new "
                                f"schedule) or the index of the last epoch run, got "
                                f"{last_epoch}")
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise EveryOError(f"{type(self).__name__}(last_epoch={last_epoch}): "
                                      f"param_groups[{i}] has no 'initial_lr'; load the "
                                      f"optimizer's state_dict before resuming a schedule")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        """Set the learning rate of epoch 0 (creating a scheduler does this, as in PyTorch)."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self) -> list:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self) -> None:
        """Advance one epoch and set every group's ``lr``."""
        self._step_count += 1
        self._update_lr()

    def _update_lr(self, epoch: int | None = None) -> None:
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed_form = getattr(self, "closed_form_lr", None)
            values = closed_form() if closed_form is not None else self.get_lr()
        set_lrs(type(self).__name__, self.optimizer, values)
        self._last_lr = current_lrs(self.optimizer)

    def get_last_lr(self) -> list:
        """The learning rate of every group, as the last :meth:`step` left it."""
        return list(self._last_lr)

    def _argument(self, name: str, value):
        """Constructor argument ``name``, checked as :attr:`state_kinds` says."""
        return checked_argument(type(self).__name__, name, value, self.state_kinds[name])

    def state_dict(self) -> dict:
        """Everything but the optimizer (and functions, which are not data), with the
        scheduler's class under ``"type"``."""
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("optimizer", "lr_lambdas", "_is_initial")}
        return {"type": type(self).__name__, **state}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (restore the optimizer's state too: the
        groups' current learning rates live there).

        The state must be this class's, with this scheduler's keys and one learning rate per
        parameter group; every value is checked by the constructor's rules before anything
        changes.
        """
        self._apply_state(self._checked_state(state))

    def _checked_state(self, state) -> dict:
        name = type(self).__name__
        owner = f"{name}.load_state_dict"
        own = self.state_dict()
        del own["type"]
        state = expect_state(owner, state, name, tuple(own))
        return {key: self._checked_entry(owner, key, value, own[key])
                for key, value in state.items()}

    def _checked_entry(self, owner: str, key: str, value, current):
        if key in self.state_kinds:
            return checked_argument(type(self).__name__, key, value, self.state_kinds[key])
        if key in self.per_group_state:
            values = checked_list(owner, key, value, len(self.optimizer.param_groups))
            return [checked_argument(owner, f"{key}[{i}]", v, "non-negative float")
                    for i, v in enumerate(values)]
        if key in self.state_choices:
            if not isinstance(value, str) or value not in self.state_choices[key]:
                raise ArgumentError(f"{type(self).__name__}: {key} must be one of "
                                    f"{list(self.state_choices[key])}, got {value!r}")
            return value
        return checked_like(owner, key, value, current)

    def _apply_state(self, checked: dict) -> None:
        self.__dict__.update(checked)


def checked_like(owner: str, key: str, value, current):
    """A saved value with no declared kind, checked to be of ``current``'s kind: a bool, a
    number (not NaN; ``inf`` is a valid "best so far"), a string, or a list/tuple whose
    entries are checked alike."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(current, (bool, np.bool_)):
        return checked_argument(owner, key, value, "bool")
    if is_int(current) or isinstance(current, (float, np.floating)):
        if not (is_int(value) or isinstance(value, (float, np.floating))) or value != value:
            raise ArgumentError(f"{owner}: {key} must be a number, got {value!r}")
        return value.item() if isinstance(value, np.generic) else value
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ArgumentError(f"{owner}: {key} must be a string, got {value!r}")
        return value
    if isinstance(current, (list, tuple)):
        items = checked_list(owner, key, value, len(current) if isinstance(current, tuple)
                             else None)
        like = list(current) if isinstance(current, tuple) else [current[0]] * len(items) \
            if current else items
        checked = [checked_like(owner, f"{key}[{i}]", v, c)
                   for i, (v, c) in enumerate(zip(items, like))]
        return tuple(checked) if isinstance(current, tuple) else checked
    if current is None:
        return value if value is None else checked_like(owner, key, value, 0.0)
    raise ArgumentError(f"{owner}: {key} cannot be restored from a {type(value).__name__}")


class LambdaLR(LRScheduler):
    """``lr = initial_lr * lr_lambda(epoch)``; one function for all groups or one per group.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.LambdaLR(opt, lambda epoch: 1 / (epoch + 1))
        >>> sched.step(); sched.get_last_lr()
        [0.5]
    """

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        self.lr_lambdas = per_group("lr_lambda", optimizer, lr_lambda, "function", "LambdaLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base_lr * lambda_factor("LambdaLR", lmbda, self.last_epoch)
                for lmbda, base_lr in zip(self.lr_lambdas, self.base_lrs)]


class MultiplicativeLR(LRScheduler):
    """Multiply each group's current ``lr`` by ``lr_lambda(epoch)`` on every step.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.MultiplicativeLR(opt, lambda epoch: 0.5)
        >>> sched.step(); sched.step(); sched.get_last_lr()
        [0.25]
    """

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        self.lr_lambdas = per_group("lr_lambda", optimizer, lr_lambda, "function",
                                    "MultiplicativeLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return current_lrs(self.optimizer)
        return [group["lr"] * lambda_factor("MultiplicativeLR", lmbda, self.last_epoch)
                for lmbda, group in zip(self.lr_lambdas, self.optimizer.param_groups)]


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

    state_kinds = {**LRScheduler.state_kinds, "step_size": "positive int", "gamma": "non-negative float"}

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size = self._argument("step_size", step_size)
        self.gamma = self._argument("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return current_lrs(self.optimizer)
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def closed_form_lr(self):
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size)
                for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` at each epoch listed in ``milestones`` (an epoch
    listed twice multiplies twice, as in PyTorch).

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.MultiStepLR(opt, milestones=[2, 3], gamma=0.5)
        >>> lrs = []
        >>> for _ in range(4):
        ...     lrs.append(opt.lr); sched.step()
        >>> lrs
        [1.0, 1.0, 0.5, 0.25]
    """

    state_kinds = {**LRScheduler.state_kinds, "gamma": "non-negative float"}

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        self.milestones = sorted(epoch_list("MultiStepLR", milestones))
        self.gamma = self._argument("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        hits = self.milestones.count(self.last_epoch)
        if hits == 0:
            return current_lrs(self.optimizer)
        return [group["lr"] * self.gamma ** hits for group in self.optimizer.param_groups]

    def closed_form_lr(self):
        return [base_lr * self.gamma ** bisect_right(self.milestones, self.last_epoch)
                for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """Warm-up: scale the learning rate linearly from ``start_factor`` to ``end_factor``
    times its initial value over ``total_iters`` steps, then leave it.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.LinearLR(opt, start_factor=0.5, total_iters=2)
        >>> lrs = [opt.lr]
        >>> for _ in range(3):
        ...     sched.step(); lrs.append(opt.lr)
        >>> lrs
        [0.5, 0.75, 1.0, 1.0]
    """

    state_kinds = {**LRScheduler.state_kinds, "start_factor": "positive fraction",
                   "end_factor": "probability", "total_iters": "positive int"}

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        self.start_factor = self._argument("start_factor", start_factor)
        self.end_factor = self._argument("end_factor", end_factor)
        self.total_iters = self._argument("total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [group["lr"] * self.start_factor for group in self.optimizer.param_groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return current_lrs(self.optimizer)
        change = self.end_factor - self.start_factor
        factor = 1.0 + change / (self.total_iters * self.start_factor
                                 + (self.last_epoch - 1) * change)
        return [group["lr"] * factor for group in self.optimizer.param_groups]

    def closed_form_lr(self):
        progress = min(self.total_iters, self.last_epoch) / self.total_iters
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress)
                for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every epoch.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.ExponentialLR(opt, gamma=0.5)
        >>> sched.step(); sched.get_last_lr()
        [0.5]
    """

    state_kinds = {**LRScheduler.state_kinds, "gamma": "non-negative float"}

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = self._argument("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return current_lrs(self.optimizer)
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def closed_form_lr(self):
        return [base_lr * self.gamma ** self.last_epoch for base_lr in self.base_lrs]


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

    state_kinds = {**LRScheduler.state_kinds, "T_max": "positive float",
                   "eta_min": "non-negative float"}

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0,  # T_max: PyTorch's name
                 last_epoch: int = -1):
        self._argument("T_max", T_max)  # PyTorch takes floats
        self.T_max = T_max
        self.eta_min = self._argument("eta_min", eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        epoch, t_max, eta_min = self.last_epoch, self.T_max, self.eta_min
        groups = self.optimizer.param_groups
        if self._is_initial:
            return current_lrs(self.optimizer)
        if self._step_count == 1 and epoch > 0:  # resumed with last_epoch=...
            return [eta_min + (base_lr - eta_min) * (1 + math.cos(epoch * math.pi / t_max)) / 2
                    for base_lr in self.base_lrs]
        if (epoch - 1 - t_max) % (2 * t_max) == 0:
            return [group["lr"] + (base_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
                    for base_lr, group in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * epoch / t_max))
                / (1 + math.cos(math.pi * (epoch - 1) / t_max))
                * (group["lr"] - eta_min) + eta_min for group in groups]

    def closed_form_lr(self):
        return [self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted every ``T_0`` epochs, each period ``T_mult`` times longer
    than the last (SGDR). ``step(epoch)`` accepts a fractional epoch for per-batch updates.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.CosineAnnealingWarmRestarts(opt, T_0=2)
        >>> [round(opt.lr, 3) for _ in range(4) if sched.step() is None]
        [0.5, 1.0, 0.5, 1.0]
    """

    state_kinds = {**LRScheduler.state_kinds, "T_0": "positive int", "T_mult": "positive int",
                   "eta_min": "non-negative float", "T_i": "positive int", "T_cur": "float"}

    def __init__(self, optimizer, T_0: int, T_mult: int = 1,  # T_0, T_mult: PyTorch's names
                 eta_min: float = 0.0, last_epoch: int = -1):
        T_0 = self._argument("T_0", T_0)
        T_mult = self._argument("T_mult", T_mult)
        eta_min = self._argument("eta_min", eta_min)
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base_lr in self.base_lrs]

    def step(self, epoch=None) -> None:
        """Advance one epoch, or jump to ``epoch`` (may be fractional)."""
        self._step_count += 1
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur %= self.T_i
                self.T_i *= self.T_mult
        elif checked_argument("CosineAnnealingWarmRestarts.step", "epoch", epoch, "float") < 0:
            raise ArgumentError(f"CosineAnnealingWarmRestarts.step: epoch must be >= 0, got "
                              f"{epoch}")
        elif epoch >= self.T_0:
            if self.T_mult == 1:
                self.T_cur = epoch % self.T_0
            else:
                n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                self.T_i = self.T_0 * self.T_mult ** n
        else:
            self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        set_lrs(type(self).__name__, self.optimizer, self.get_lr())
        self._last_lr = current_lrs(self.optimizer)


