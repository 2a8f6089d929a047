"""``eo.GradScaler``: dynamic loss scaling, with PyTorch's API, defaults and update rule.

float16 gradients smaller than about 6e-8 round to zero. Multiplying the loss by a large scale
before ``backward()`` multiplies every gradient by it too, lifting them into float16's range;
``unscale_`` divides the (float32) parameter gradients back before the optimizer steps. When
the scale is too large some gradient overflows to inf or NaN: that step is skipped and the
scale halves. After ``growth_interval`` clean steps in a row it doubles again.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Tensor
from everyo.kernels import kernel
from everyo.validation import checked_argument, checked_gradients, expect_state

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _optimizer_grads(optimizer) -> list[np.ndarray]:
    params = optimizer.params
    return checked_gradients("GradScaler.unscale_", [p for p in params if p.grad is not None],
                             writable=True, numbered_in=params)


#: setting -> (kind, extra range test, what the range test asks); a loaded "scale" is
#: checked as the constructor checks "init_scale"
_SETTING_RULES = {
    "init_scale": ("positive float", None, ""),
    "scale": ("positive float", None, ""),
    "growth_factor": ("positive float", lambda v: v > 1.0, "> 1"),
    "backoff_factor": ("positive float", lambda v: v < 1.0, "in (0, 1)"),
    "growth_interval": ("positive int", None, ""),
}


def _checked_settings(owner: str, values: dict) -> dict:
    """The scale, factors and interval in ``values``, checked and converted: the one rule
    of the constructor and of :meth:`GradScaler.load_state_dict`."""
    checked = {}
    for name, value in values.items():
        kind, in_range, expected = _SETTING_RULES[name]
        checked[name] = checked_argument(owner, name, value, kind)
        if in_range is not None and not in_range(checked[name]):
            raise EveryOError(f"{owner}: {name} must be {expected}, got {value!r}")
    return checked


class GradScaler:
    """Scale the loss, skip steps whose gradients overflowed, and adapt the scale.

    Args:
        init_scale: the first scale.
        growth_factor: multiplies the scale after ``growth_interval`` clean steps.
        backoff_factor: multiplies the scale after a step with an inf/NaN gradient.
        growth_interval: clean steps in a row before the scale grows.
        enabled: ``False`` makes every method a pass-through (scale 1, steps always applied).
        group: a process group (anything with ``all_reduce_sum(ndarray) -> ndarray``); the
            inf/NaN decision is summed over its ranks, so every rank skips the same steps and
            keeps the same scale.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0, 2.0])
        >>> opt = eo.SGD([w], lr=0.1)
        >>> scaler = eo.GradScaler(init_scale=1024.0)
        >>> scaler.backward((w * w).sum())
        >>> w.grad  # scaled: 1024 * 2w
        array([2048., 4096.], dtype=float32)
        >>> scaler.step(opt), w.data  # unscaled before the update
        (True, array([0.8, 1.6], dtype=float32))
        >>> scaler.update(); scaler.get_scale()
        1024.0
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True,
                 group=None):
        settings = _checked_settings("GradScaler", {
            "init_scale": init_scale, "growth_factor": growth_factor,
            "backoff_factor": backoff_factor, "growth_interval": growth_interval})
        if group is not None and not callable(getattr(group, "all_reduce_sum", None)):
            raise EveryOError(f"GradScaler: group must provide all_reduce_sum(ndarray), got "
                              f"{type(group).__name__}")
        self._enabled = bool(enabled)
        self._scale = settings["init_scale"]
        self._growth_factor = settings["growth_factor"]
        self._backoff_factor = settings["backoff_factor"]
        self._growth_interval = settings["growth_interval"]
        self._growth_tracker = 0
        self.group = group
        # id(optimizer) -> {"stage": ..., "found_inf": bool}, cleared by update()
        self._per_optimizer: dict[int, dict] = {}

    # -- scaling --------------------------------------------------------------------------------
    def scale(self, outputs):
        """``outputs`` (a tensor, or a list/tuple of tensors) multiplied by the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            # NOTE: a Python scalar takes the tensor's dtype; a float16 loss would overflow at
            # 65504 before backward even starts, so such a loss is scaled in float32.
            if outputs.data.dtype == np.float16:
                outputs = outputs.astype("float32")
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise EveryOError(f"GradScaler.scale takes a Tensor or a list/tuple of Tensors, got "
                          f"{type(outputs).__name__}")

    def backward(self, loss, retain_graph: bool = False) -> None:
        """``scale(loss).backward()``, with NumPy's overflow warnings silenced.

        An overflow during this backward is expected: it is how ``step`` learns the scale is
        too large. Call ``scaler.scale(loss).backward()`` to see the warnings.
        """
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            self.scale(loss).backward(retain_graph=retain_graph)

    # -- stepping -------------------------------------------------------------------------------
    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": False})

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and record whether any is
        inf/NaN. Call it before clipping gradients; at most once per optimizer per step."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise EveryOError("GradScaler.unscale_() has already been called on this optimizer "
                              "since the last update(); call it at most once per step")
        if state["stage"] == _STEPPED:
            raise EveryOError("GradScaler.unscale_() after step(): call update() first")
        found_inf = not kernel.unscale_all_finite(_optimizer_grads(optimizer),
                                                  1.0 / self._scale)
        if self.group is not None:
            # NOTE: every rank takes part in this all-reduce on every step, found inf or not,
            # so the collectives stay in lockstep and all ranks agree on the skip.
            votes = self.group.all_reduce_sum(np.array([1.0 if found_inf else 0.0]))
            found_inf = bool(np.asarray(votes).reshape(-1)[0] > 0)
        state["found_inf"] = found_inf
        state["stage"] = _UNSCALED

    def step(self, optimizer) -> bool:
        """Unscale (if not done yet) and apply ``optimizer.step()`` unless a gradient is inf/NaN.

        Returns:
            True when the step was applied, False when it was skipped (weights and optimizer
            state are then untouched).
        """
        if not self._enabled:
            optimizer.step()
            return True
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise EveryOError("GradScaler.step() has already been called on this optimizer "
                              "since the last update()")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        state["stage"] = _STEPPED
        if state["found_inf"]:
            return False
        optimizer.step()
        return True

    def update(self, new_scale: float | None = None) -> None:
        """Halve the scale if this step found an inf/NaN, double it after ``growth_interval``
        clean steps; or set ``new_scale`` explicitly. Call once per iteration, after step()."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = checked_argument("GradScaler.update", "new_scale", new_scale,
                                           "positive float", EveryOError)
        else:
            if not self._per_optimizer:
                raise EveryOError("GradScaler.update(): no step() or unscale_() was recorded "
                                  "since the last update()")
            if any(s["found_inf"] for s in self._per_optimizer.values()):
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    # NOTE: PyTorch's rule: no growth past float32's range (a scaled float32
                    # loss would be inf there: every growth would cost a skipped step)
                    grown = self._scale * self._growth_factor
                    if grown <= _FLOAT32_MAX:
                        self._scale = grown
                    self._growth_tracker = 0
        self._per_optimizer.clear()

    # -- inspection and checkpoints -------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def is_enabled(self) -> bool:
        return self._enabled

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def state_dict(self) -> dict:
        """The scale, the factors and the growth tracker (PyTorch's keys); empty when disabled."""
        if not self._enabled:
            return {}
        return {"type": "GradScaler", "scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output, growth tracker included.

        The saved scale and factors are checked by the constructor's rules and the tracker
        against the interval before anything changes; another class's state is refused.
        """
        if not self._enabled:
            return
        owner = "GradScaler.load_state_dict"
        if isinstance(state, dict) and not state:
            raise EveryOError(f"{owner}: the state is empty (it was saved by a disabled "
                              f"GradScaler)")
        state = expect_state(owner, state, "GradScaler", ("scale", "_growth_tracker"),
                             ("growth_factor", "backoff_factor", "growth_interval"))
        settings = _checked_settings(owner, {
            "scale": state["scale"],
            "growth_factor": state.get("growth_factor", self._growth_factor),
            "backoff_factor": state.get("backoff_factor", self._backoff_factor),
            "growth_interval": state.get("growth_interval", self._growth_interval)})
        tracker = checked_argument(owner, "_growth_tracker", state["_growth_tracker"],
                                   "non-negative int")
        if tracker >= settings["growth_interval"]:
            raise EveryOError(f"{owner}: _growth_tracker {tracker} must be below "
                              f"growth_interval {settings['growth_interval']}")
        self._scale = settings["scale"]
        self._growth_factor = settings["growth_factor"]
        self._backoff_factor = settings["backoff_factor"]
        self._growth_interval = settings["growth_interval"]
        self._growth_tracker = tracker

    def __repr__(self) -> str:
        return (f"GradScaler(scale={self.get_scale()}, growth_tracker={self._growth_tracker}, "
                f"enabled={self._enabled})")
