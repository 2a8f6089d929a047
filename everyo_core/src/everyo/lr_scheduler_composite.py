"""Schedulers built from phases or from other schedulers: ``OneCycleLR``, ``SequentialLR``
(e.g. warm-up then cosine) and ``ReduceLROnPlateau`` (driven by a metric). PyTorch's
semantics and arithmetic, one learning rate per parameter group."""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from everyo.errors import EveryOError
from everyo.lr_scheduler import LRScheduler, current_lrs, epoch_list, per_group
from everyo.validation import ArgumentError, checked_argument, checked_list, is_real


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the learning rate rises from ``max_lr / div_factor`` to ``max_lr``
    over ``pct_start`` of ``total_steps``, then falls to ``initial_lr / final_div_factor``;
    momentum (or Adam's beta1) moves the opposite way. Step it after every batch.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=0.1, momentum=0.9)
        >>> sched = eo.OneCycleLR(opt, max_lr=1.0, total_steps=10)
        >>> round(opt.lr, 6), opt.momentum  # starts at max_lr / 25, momentum at its top
        (0.04, 0.95)
    """

    state_kinds = {**LRScheduler.state_kinds, "total_steps": "positive int"}
    state_choices = {"anneal_strategy": ("cos", "linear")}

    def __init__(self, optimizer, max_lr, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1):
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise EveryOError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
            total_steps = (checked_argument("OneCycleLR", "epochs", epochs, "positive int")
                           * checked_argument("OneCycleLR", "steps_per_epoch", steps_per_epoch,
                                      "positive int"))
        total_steps = self._argument("total_steps", total_steps)
        pct_start = checked_argument("OneCycleLR", "pct_start", pct_start, "probability")
        div_factor = checked_argument("OneCycleLR", "div_factor", div_factor, "positive float")
        final_div_factor = checked_argument("OneCycleLR", "final_div_factor", final_div_factor,
                                    "positive float")
        anneal_strategy = self._checked_entry("OneCycleLR", "anneal_strategy", anneal_strategy,
                                              None)
        self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
        warm_end = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(warm_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (float(2 * pct_start * total_steps) - 2, "max_lr", "initial_lr",
                            "base_momentum", "max_momentum"),
                           (total_steps - 1, "initial_lr", "min_lr", "max_momentum",
                            "max_momentum")]
        else:
            self.phases = [(warm_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (total_steps - 1, "max_lr", "min_lr", "base_momentum",
                            "max_momentum")]
        groups = optimizer.param_groups
        if last_epoch == -1:
            tops = per_group("max_lr", optimizer, max_lr, "non-negative float", "OneCycleLR")
            for group, top in zip(groups, tops):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            defaults = getattr(optimizer, "defaults", {})
            if "momentum" not in defaults and "betas" not in defaults:
                raise EveryOError(f"OneCycleLR: {type(optimizer).__name__} has neither "
                                  f"momentum nor betas; pass cycle_momentum=False")
            self.use_beta1 = "betas" in defaults
            if last_epoch == -1:
                tops = per_group("max_momentum", optimizer, max_momentum, "float",
                                 "OneCycleLR")
                bottoms = per_group("base_momentum", optimizer, base_momentum, "float",
                                    "OneCycleLR")
                for group, top, bottom in zip(groups, tops, bottoms):
                    self._set_momentum(group, top)
                    group["max_momentum"], group["base_momentum"] = top, bottom
        super().__init__(optimizer, last_epoch)

    def _checked_entry(self, owner: str, key: str, value, current):
        if key == "phases":
            return _checked_phases(owner, value)
        checked = super()._checked_entry(owner, key, value, current)
        if key == "use_beta1" and checked != current:
            # NOTE: derived from the optimizer (Adam's betas or SGD's momentum), not a choice
            raise EveryOError(f"{owner}: use_beta1 is {checked} in the state, but "
                              f"{type(self.optimizer).__name__} "
                              f"{'has' if current else 'has no'} betas")
        return checked

    def _set_momentum(self, group: dict, value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise EveryOError(f"OneCycleLR: stepped {step} times, but total_steps is "
                              f"{self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for i, (end_step, lr_from, lr_to, mom_from, mom_to) in enumerate(self.phases):
                if step <= end_step or i == len(self.phases) - 1:
                    pct = (step - start_step) / (end_step - start_step)
                    lrs.append(self._anneal(group[lr_from], group[lr_to], pct))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[mom_from], group[mom_to],
                                                               pct))
                    break
                start_step = end_step
        return lrs


#: The names OneCycleLR's phases move between (lr from, lr to, momentum from, momentum to),
#: by the number of phases (the constructor's two layouts).
_PHASE_NAMES = {
    2: [("initial_lr", "max_lr", "max_momentum", "base_momentum"),
        ("max_lr", "min_lr", "base_momentum", "max_momentum")],
    3: [("initial_lr", "max_lr", "max_momentum", "base_momentum"),
        ("max_lr", "initial_lr", "base_momentum", "max_momentum"),
        ("initial_lr", "min_lr", "max_momentum", "max_momentum")],
}


def _checked_phases(owner: str, value) -> list:
    """OneCycleLR's saved phases: ``(end step, *names)`` laid out as the constructor lays
    out two or three phases, with finite end steps."""
    phases = [p.tolist() if isinstance(p, np.ndarray) else p
              for p in checked_list(owner, "phases", value)]
    names = _PHASE_NAMES.get(len(phases), ())
    if not (names and all(isinstance(p, (list, tuple)) and len(p) == 5 and is_real(p[0])
                          and all(isinstance(n, str) for n in p[1:])
                          and tuple(p[1:]) == expected for p, expected in zip(phases, names))):
        raise EveryOError(f"{owner}: phases must be the constructor's two or three (end step, "
                          f"lr from, lr to, momentum from, momentum to) with finite end steps; "
                          f"got {str(value)[:160]}")
    return [(float(p[0]), *p[1:]) for p in phases]


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at the epochs in ``milestones``
    (e.g. ``LinearLR`` warm-up, then ``CosineAnnealingLR``).

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> warm = eo.LinearLR(opt, start_factor=0.5, total_iters=2)
        >>> decay = eo.ExponentialLR(opt, gamma=0.5)
        >>> sched = eo.SequentialLR(opt, [warm, decay], milestones=[2])
        >>> lrs = [opt.lr]
        >>> for _ in range(4):
        ...     sched.step(); lrs.append(opt.lr)
        >>> lrs
        [0.5, 0.75, 1.0, 0.5, 0.25]
    """

    state_kinds = {"last_epoch": "int"}

    def __init__(self, optimizer, schedulers: list, milestones: list, last_epoch: int = -1):
        if not schedulers:
            raise EveryOError("SequentialLR needs at least one scheduler")
        for i, scheduler in enumerate(schedulers):
            if isinstance(scheduler, ReduceLROnPlateau):
                raise EveryOError(f"SequentialLR: scheduler {i} is a ReduceLROnPlateau, which "
                                  f"needs a metric in step(); step it yourself")
            if getattr(scheduler, "optimizer", None) is not optimizer:
                raise EveryOError(f"SequentialLR: scheduler {i} "
                                  f"({type(scheduler).__name__}) belongs to another optimizer")
        milestones = epoch_list("SequentialLR", milestones)
        if milestones != sorted(milestones):
            raise ArgumentError(f"SequentialLR: milestones must increase, got "
                                f"{milestones}")
        if len(milestones) != len(schedulers) - 1:
            raise EveryOError(f"SequentialLR: {len(schedulers)} schedulers need "
                              f"{len(schedulers) - 1} milestones, got {len(milestones)}")
        self._schedulers, self._milestones = list(schedulers), list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # NOTE: each scheduler's constructor already stepped once; undo that and start over
        # from the initial rates with the first scheduler, as PyTorch does.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for scheduler in self._schedulers:
            _rewind(scheduler)
        first = self._schedulers[bisect_right(self._milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self) -> None:
        """Advance one epoch with the scheduler whose stretch this epoch is in."""
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return {"type": type(self).__name__, **state}

    def _checked_entry(self, owner: str, key: str, value, current):
        if key == "_milestones":
            milestones = epoch_list(owner, value)
            if milestones != sorted(milestones) or len(milestones) != len(self._schedulers) - 1:
                raise EveryOError(f"{owner}: _milestones must be {len(self._schedulers) - 1} "
                                  f"increasing epochs (one between each two of the "
                                  f"{len(self._schedulers)} schedulers), got {milestones}")
            return milestones
        if key != "_schedulers":
            return super()._checked_entry(owner, key, value, current)
        saved = checked_list(owner, key, value, len(self._schedulers))
        return [scheduler._checked_state(state)
                for scheduler, state in zip(self._schedulers, saved)]

    def _apply_state(self, checked: dict) -> None:
        checked = dict(checked)
        for scheduler, state in zip(self._schedulers, checked.pop("_schedulers")):
            scheduler._apply_state(state)
        super()._apply_state(checked)


def _rewind(scheduler) -> None:
    nested = getattr(scheduler, "_schedulers", None)
    if nested is not None:
        for inner in nested:
            _rewind(inner)
    elif hasattr(scheduler, "last_epoch"):
        scheduler.last_epoch -= 1


class ReduceLROnPlateau(LRScheduler):
    """Multiply the learning rate by ``factor`` when a metric has stopped improving for
    ``patience`` epochs: ``scheduler.step(validation_loss)``.

    Example:
        >>> import everyo as eo
        >>> opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
        >>> sched = eo.ReduceLROnPlateau(opt, factor=0.5, patience=1)
        >>> for loss in [1.0, 1.0, 1.0]:
        ...     sched.step(loss)
        >>> sched.get_last_lr()
        [0.5]
    """

    state_kinds = {"last_epoch": "non-negative int", "factor": "fraction below one",
                   "patience": "non-negative int", "threshold": "non-negative float",
                   "cooldown": "non-negative int", "eps": "non-negative float",
                   "cooldown_counter": "non-negative int", "num_bad_epochs": "non-negative int"}
    per_group_state = ("min_lrs", "_last_lr")
    state_choices = {"mode": ("min", "max"), "threshold_mode": ("rel", "abs")}

    def __init__(self, optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr=0, eps: float = 1e-8):
        name = "ReduceLROnPlateau"
        factor = self._argument("factor", factor)
        patience = self._argument("patience", patience)
        threshold = self._argument("threshold", threshold)
        cooldown = self._argument("cooldown", cooldown)
        eps = self._argument("eps", eps)
        mode = self._checked_entry(name, "mode", mode, None)
        threshold_mode = self._checked_entry(name, "threshold_mode", threshold_mode, None)
        self.min_lrs = per_group("min_lr", optimizer, min_lr, "non-negative float", name)
        self.optimizer, self.factor = optimizer, factor
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode
        self.last_epoch = 0
        self._last_lr = current_lrs(optimizer)
        self.best = math.inf if mode == "min" else -math.inf
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def _is_better(self, value: float, best: float) -> bool:
        if self.threshold_mode == "rel":
            scale = 1.0 - self.threshold if self.mode == "min" else self.threshold + 1.0
            return value < best * scale if self.mode == "min" else value > best * scale
        if self.mode == "min":
            return value < best - self.threshold
        return value > best + self.threshold

    def step(self, metrics) -> None:  # type: ignore[override]  # PyTorch: step(metrics)
        """Record this epoch's metric; reduce the learning rate after a plateau."""
        try:
            current = float(metrics.item() if hasattr(metrics, "item") else metrics)
        except (TypeError, ValueError):
            raise ArgumentError(f"ReduceLROnPlateau.step: metrics must be one number "
                                f"(e.g. the validation loss), got {metrics!r}") from None
        self.last_epoch += 1
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
                old_lr = float(group["lr"])
                new_lr = max(old_lr * self.factor, min_lr)
                if old_lr - new_lr > self.eps:
                    group["lr"] = new_lr
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = current_lrs(self.optimizer)


