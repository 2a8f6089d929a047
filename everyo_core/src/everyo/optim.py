"""Optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW, with PyTorch's update
rules, defaults and parameter groups. They update ``param.data`` in place.

An optimizer holds ``param_groups``: a list of dicts, each with its ``params`` and its own value
of every option (``lr``, ``weight_decay``, ...). Options a group does not give come from the
constructor's keyword arguments. Schedulers change ``group["lr"]``.
"""

from __future__ import annotations

import functools
import inspect
import math
import weakref
from collections.abc import Mapping

import numpy as np

from everyo.autograd import zero_gradients
from everyo.errors import EveryOError
from everyo.grad_mode import enable_grad
from everyo.kernel_registry import kernel
from everyo.porting_layout import buffer_from_pytorch, pytorch_array
from everyo.tensor import Tensor
from everyo.validation import (
    checked_argument,
    checked_gradients,
    checked_list,
    converted_array,
    expect_state,
    is_real,
)
from everyo.versioning import bump_version

# id(parameter) -> weak references to the parameter and to the .grad a step inside backward
# applied (see below). NOTE: not a WeakKeyDictionary: that compares keys with ==, which a
# Tensor answers element-wise.
_APPLIED_IN_BACKWARD: dict[int, tuple] = {}


def _forget(key: int, ref) -> None:
    if _APPLIED_IN_BACKWARD.get(key, (None,))[0] is ref:
        del _APPLIED_IN_BACKWARD[key]


def mark_applied_in_backward(params) -> None:
    """Record that a step run inside backward (``DistributedDataParallel(optimizer=)``) has
    applied the current ``.grad`` of each of ``params``, so that what must see the gradients
    before the step (``clip_grad_norm_``) refuses them instead of changing nothing.

    Example:
        >>> import everyo as eo, numpy as np
        >>> w = eo.Parameter([1.0]); w.grad = np.float32([1.0])
        >>> mark_applied_in_backward([w]); applied_in_backward([w]) == [w]
        True
        >>> w.grad = np.float32([2.0]); applied_in_backward([w])
        []
    """
    for p in params:
        if p.grad is not None:
            key = id(p)
            entry = _APPLIED_IN_BACKWARD.get(key)
            owner = entry[0] if entry is not None and entry[0]() is p else \
                weakref.ref(p, functools.partial(_forget, key))
            _APPLIED_IN_BACKWARD[key] = (owner, weakref.ref(p.grad))


def applied_in_backward(params) -> list:
    """Those of ``params`` whose current ``.grad`` a step inside backward has already applied
    (:func:`mark_applied_in_backward`; a new gradient, or ``zero_grad``, clears it)."""
    found = []
    for p in params:
        entry = _APPLIED_IN_BACKWARD.get(id(p))
        if entry is not None and entry[0]() is p and p.grad is not None and \
                entry[1]() is p.grad:
            found.append(p)
    return found


#: PyTorch's choices between implementations of the same arithmetic: None or a bool, kept in
#: the groups as PyTorch keeps them, without effect (EveryO has one implementation per kernel
#: provider, which always works on a whole group at once). docs/porting.md.
PERFORMANCE_HINTS = ("foreach", "fused")
#: PyTorch's options EveryO cannot honour: only their default, False, is accepted.
REFUSED_FLAGS = {
    "capturable": "it is for CUDA graph capture; EveryO computes on the CPU",
    "differentiable": "EveryO does not record optimizer steps for autograd",
}


class Optimizer:
    """Base class: holds parameter groups and the per-parameter state.

    Subclasses list their options in ``defaults`` (passed to ``__init__``), the names of their
    per-parameter arrays in ``state_names``, and implement ``_update``.

    ``optimizer.lr`` (or any other option) reads the value every group shares and sets it in
    every group; with groups that differ, use ``optimizer.param_groups[i]["lr"]``.
    """

    state_names: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict):
        object.__setattr__(self, "defaults", dict(defaults))
        object.__setattr__(self, "param_groups", [])
        object.__setattr__(self, "state", {})
        object.__setattr__(self, "step_count", 0)
        if isinstance(params, Tensor):
            raise EveryOError(f"{type(self).__name__} takes an iterable of parameters (or of "
                              f"dicts), got a single tensor of shape {params.shape}; wrap it "
                              f"in a list")
        if isinstance(params, (str, bytes, dict)) or not hasattr(params, "__iter__"):
            raise EveryOError(f"{type(self).__name__} takes an iterable of parameters (or of "
                              f"parameter-group dicts), got a {type(params).__name__}")
        groups = list(params)
        if not groups:
            raise EveryOError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # -- groups -----------------------------------------------------------------------------
    def add_param_group(self, param_group: dict) -> None:
        """Add a group of parameters with its own options (e.g. when unfreezing layers).

        Args:
            param_group: a dict with ``params`` (a tensor or an iterable of tensors) and any
                options; the missing ones take the optimizer's defaults.

        Example:
            >>> import everyo as eo
            >>> a, b = eo.Parameter([1.0]), eo.Parameter([2.0])
            >>> opt = eo.SGD([a], lr=0.1)
            >>> opt.add_param_group({"params": [b], "lr": 0.01})
            >>> [g["lr"] for g in opt.param_groups]
            [0.1, 0.01]
        """
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise EveryOError(f"{name}: a parameter group is a dict with 'params', got a "
                              f"{type(param_group).__name__}")
        if "params" not in param_group:
            raise EveryOError(f"{name}: parameter group {len(self.param_groups)} has no "
                              f"'params' key")
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for p in params:
            if not isinstance(p, Tensor) or not p.requires_grad:
                raise EveryOError(f"{name}: every parameter must be a tensor that requires "
                                  f"grad; got a {type(p).__name__} of shape "
                                  f"{getattr(p, 'shape', '?')}")
        if len({id(p) for p in params}) != len(params):
            raise EveryOError(f"{name}: a parameter appears twice in group "
                              f"{len(self.param_groups)}")
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in taken for p in params):
            raise EveryOError(f"{name}: some parameters appear in more than one parameter group")
        group = {"params": params}
        for key, value in param_group.items():
            if key != "params":
                group[key] = value
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self._check_options(group)
        self.param_groups.append(group)

    def _check_options(self, group: dict) -> None:
        """Check (and convert) every option of ``group``: the constructor's rule, which
        :meth:`load_state_dict` applies to a saved group too. An option whose default is a
        bool must be a bool; any other number must be finite and >= 0."""
        name = type(self).__name__
        for key, value in group.items():
            if key == "params":
                continue
            if key in PERFORMANCE_HINTS:
                if value is not None:
                    group[key] = checked_argument(name, key, value, "bool", EveryOError)
                continue
            if key in REFUSED_FLAGS and checked_argument(name, key, value, "bool", EveryOError):
                raise EveryOError(f"{name}: {key}=True is not supported ({REFUSED_FLAGS[key]}); "
                                  f"leave it False")
            default = _declared_default(type(self), key, value)
            if isinstance(default, (bool, np.bool_)):
                group[key] = checked_argument(name, key, value, "bool", EveryOError)
            elif isinstance(default, (int, float, np.integer, np.floating)):
                group[key] = checked_argument(name, key, value, "non-negative float",
                                              EveryOError)

    @property
    def params(self) -> list:
        """Every parameter of every group, in order."""
        return [p for group in self.param_groups for p in group["params"]]

    def __getattr__(self, name: str):
        defaults = self.__dict__.get("defaults", {})
        if name not in defaults:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        values = [group[name] for group in self.param_groups]
        if any(v != values[0] for v in values[1:]):
            raise EveryOError(f"{type(self).__name__}.{name}: the parameter groups have "
                              f"different values {values}; read param_groups[i][{name!r}]")
        return values[0]

    def __setattr__(self, name: str, value) -> None:
        if name in self.__dict__.get("defaults", {}):
            for group in self.param_groups:
                group[name] = value
        else:
            object.__setattr__(self, name, value)

    # -- stepping -----------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Set every parameter's ``.grad`` to None (or to zeros: ``set_to_none=False``)."""
        zero_gradients(self.params, set_to_none, type(self).__name__)

    def step(self, closure=None):
        """Apply one update to every parameter that has a gradient.

        ``closure`` (PyTorch's): a function that zeroes the gradients, computes the loss and
        calls ``backward()``; it runs first, with gradients enabled, and its loss is returned
        (None without a closure)."""
        loss = evaluate_closure(closure, type(self).__name__)
        self.step_parameters(self.params)
        return loss

    def step_parameters(self, params, count: bool = True) -> None:
        """Update only those of ``params`` that have a gradient, exactly as :meth:`step`
        updates them (``DistributedDataParallel(optimizer=)`` steps each bucket as its
        reduction lands). ``count``: this call begins an optimizer step (``step_count``)."""
        wanted = {id(p) for p in params}
        groups = [(group, [p for p in group["params"] if id(p) in wanted and p.grad is not None])
                  for group in self.param_groups]
        for _, chosen in groups:  # NOTE: all checked before anything changes
            checked_gradients(type(self).__name__ + ".step", chosen, numbered_in=self.params)
            check_writable(type(self).__name__ + ".step", chosen, self.params)
        if count:
            self.step_count += 1
        for group, chosen in groups:
            if chosen:
                self._update_group(chosen, group)
            for p in chosen:
                # NOTE: a graph that saved p before this step must not run backward
                bump_version(p)

    def _update_group(self, params: list, group: dict) -> None:
        """Update ``params`` (the parameters of ``group`` that have a gradient). By default one
        :meth:`_update` call each; SGD and Adam run one kernel over the whole group."""
        for p, g in zip(params, _gradients(params, group)):
            self._update(p.data, g, self.state.setdefault(p, {}), group)

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict,
                group: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Options of every group and per-parameter buffers (copies), PyTorch's layout.

        ``state`` maps a parameter's position (counted across groups) to its buffers;
        ``param_groups`` holds each group's options with ``params`` as those positions.
        """
        index = {id(p): i for i, p in enumerate(self.params)}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
                                for k, v in s.items()}
                 for p, s in self.state.items() if id(p) in index and s}
        return {"type": type(self).__name__, "step_count": self.step_count,
                "state": state, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned. Every option is checked by the
        constructor's rules and every buffer converted before anything changes; another
        optimizer's state, or one whose groups or buffer shapes do not fit, is refused."""
        name = type(self).__name__
        owner = f"{name}.load_state_dict"
        if isinstance(state, dict) and "hyperparameters" in state and state.get("type") == name:
            state = _from_single_group_layout(state)
        # NOTE: every EveryO optimizer state names its class: one that does not is PyTorch's,
        # whose buffers have PyTorch's layout (docs/porting.md)
        from_pytorch = isinstance(state, Mapping) and "type" not in state
        state = expect_state(owner, state, name, ("state", "param_groups"), ("step_count",))
        saved_groups = checked_list(owner, "param_groups", state["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise EveryOError(f"{owner}: the state has {len(saved_groups)} "
                              f"parameter groups, the optimizer {len(self.param_groups)}")
        by_index = self._parameters_by_saved_index(owner, saved_groups, from_pytorch)
        updated = []
        for saved, group in zip(saved_groups, self.param_groups):
            new = dict(group)
            new.update({key: _plain(value) for key, value in saved.items() if key != "params"})
            self._check_options(new)
            updated.append(new)
        buffers = self._checked_buffers(owner, state["state"], by_index, from_pytorch)
        self._check_complete(owner, updated, buffers, by_index)
        step_count = checked_argument(owner, "step_count", state.get("step_count", 0),
                                      "non-negative int", EveryOError)
        for group, new in zip(self.param_groups, updated):
            group.update(new)
        self.step_count = step_count
        self.state = buffers

    def _buffers_read_together(self, group: dict) -> tuple:
        """The buffers one step reads together for a parameter of ``group``: a parameter
        with one of them must have them all (the step creates them only all at once)."""
        return ()

    def _check_complete(self, owner: str, groups: list, buffers: dict, by_index: dict) -> None:
        index_of = {id(p): i for i, p in by_index.items()}
        for group in groups:
            together = self._buffers_read_together(group)
            for p in group["params"]:
                have = [name for name in together if name in buffers.get(p, ())]
                if have and len(have) != len(together):
                    raise EveryOError(
                        f"{owner}: parameter {index_of.get(id(p), '?')} has {have[0]!r} but "
                        f"not {[n for n in together if n not in have]}: with its group's "
                        f"options a step reads {list(together)} together")

    def _parameters_by_saved_index(self, owner: str, saved_groups: list,
                                   from_pytorch: bool = False) -> dict:
        """``{index in the state: parameter}``, after checking each group's size."""
        by_index = {}
        for i, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if not isinstance(saved, dict) or "params" not in saved:
                raise EveryOError(f"{owner}: group {i} of the state is not a dict with 'params'")
            indices = checked_list(owner, f"group {i}'s params", saved["params"])
            if len(indices) != len(group["params"]):
                hint = (" (PyTorch's state: a layer that stores its parameters otherwise, such "
                        "as MultiHeadAttention's packed in_proj_weight, cannot be matched by "
                        "position)" if from_pytorch else "")
                raise EveryOError(f"{owner}: group {i} has {len(indices)} parameters in the "
                                  f"state, {len(group['params'])} in the optimizer{hint}")
            for index, p in zip(indices, group["params"]):
                by_index[checked_argument(owner, f"group {i}'s params", index,
                                          "non-negative int", EveryOError)] = p
        return by_index

    def _checked_buffers(self, owner: str, saved, by_index: dict,
                         from_pytorch: bool = False) -> dict:
        """The saved per-parameter buffers, converted to each parameter's dtype and checked;
        PyTorch's (``from_pytorch``) first converted to the parameter's EveryO layout."""
        if not isinstance(saved, dict):
            raise EveryOError(f"{owner}: 'state' must be a dict of per-parameter buffers, got "
                              f"a {type(saved).__name__}")
        buffers = {}
        for index, entries in saved.items():
            i = checked_argument(owner, "a parameter index", index, "non-negative int",
                                 EveryOError)
            if i not in by_index:
                raise EveryOError(f"{owner}: the state has buffers for parameter {i}, which no "
                                  f"group lists")
            if not isinstance(entries, dict):
                raise EveryOError(f"{owner}: the buffers of parameter {i} are not a dict")
            p = by_index[i]
            buffers[p] = {key: self._checked_buffer(owner, i, key, value, p, from_pytorch)
                          for key, value in entries.items()}
        return buffers

    def _checked_buffer(self, owner: str, i: int, key: str, value, p: Tensor,
                        from_pytorch: bool = False):
        if key == "step":
            return _saved_count(owner, f"step of parameter {i}", value)
        if key not in self.state_names:
            return _plain(value)
        if from_pytorch:
            value = buffer_from_pytorch(f"{owner}: buffer {key!r} of parameter {i}", p,
                                        pytorch_array(f"{owner}: buffer {key!r} of parameter "
                                                      f"{i}", value))
        array, problem = converted_array(f"buffer {key!r} of parameter {i}", value, p.data,
                                         "parameter")
        if problem:
            raise EveryOError(f"{owner}: {problem}")
        return array


def evaluate_closure(closure, owner: str):
    """``closure()`` with gradients enabled (None for None); a closure that cannot be called
    is an error naming ``owner``'s step."""
    if closure is None:
        return None
    if not callable(closure):
        raise EveryOError(f"{owner}.step(closure): closure must be a function that computes "
                          f"the loss and calls backward(), got a {type(closure).__name__}")
    with enable_grad():
        return closure()


def check_writable(owner: str, params: list, numbered_in: list) -> None:
    """Refuse a parameter whose ``.data`` cannot be written (``p.data = `` a memory-mapped file
    or a broadcast view): a step would raise NumPy's error after moving the ones before it."""
    for p in params:
        if not p.data.flags.writeable:
            index = next(i for i, q in enumerate(numbered_in) if q is p)
            raise EveryOError(f"{owner}: parameter {index} (shape {p.data.shape}, "
                              f"{p.data.dtype}) is read-only (its .data is a read-only array: a "
                              f"memory-mapped file, a broadcast view?); assign it a writable copy")


def _gradients(params: list, group: dict) -> list:
    """The gradients a step of ``group`` follows: with ``maximize``, PyTorch's rule, each
    ``.grad`` negated before anything else (weight decay, momentum) reads it. A gradient
    narrower than its weight (a hand-assigned float16 one on a float32 weight) is converted
    to the weight's dtype first (exactly): computed in its own dtype, ``lr * g`` or ``g * g``
    underflowed to zero, a step silently lost."""
    grads = [_at_least_weight_dtype(p.grad, p.data.dtype) for p in params]
    if group.get("maximize"):
        return [-g for g in grads]
    return grads


def _at_least_weight_dtype(grad: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if grad.dtype == dtype or np.result_type(grad.dtype, dtype) == grad.dtype:
        return grad
    return grad.astype(dtype)


def _saved_count(owner: str, name: str, value) -> int:
    """A saved step count: an int, or the 0-d float tensor PyTorch's optimizers save
    (``tensor(3.)``) when it holds a whole number; anything else is refused by name."""
    if not is_real(value) and not isinstance(value, (str, bytes)):
        try:
            array = np.asarray(value)
        except (TypeError, ValueError, RuntimeError):
            array = None
        if array is not None and array.ndim == 0 and array.dtype.kind in "fiu":
            value = array[()]
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and \
            float(value).is_integer():
        value = int(value)
    return checked_argument(owner, name, value, "non-negative int", EveryOError)


def _declared_default(cls: type, key: str, value):
    """The default ``cls``'s constructor declares for option ``key`` (what decides the
    option's kind), or ``value`` for an option the constructor does not declare."""
    parameter = inspect.signature(cls).parameters.get(key)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return value
    return parameter.default


def _plain(value):
    """A saved scalar (possibly a 0-d array after a round trip) as a Python number."""
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.copy()
    return value


def _from_single_group_layout(state: dict) -> dict:
    """Read a checkpoint written before parameter groups: one group, a list of buffers."""
    buffers = list(state["state"])
    group = dict(state["hyperparameters"])
    group["params"] = list(range(len(buffers)))
    return {"type": state["type"], "step_count": state.get("step_count", 0),
            "state": {i: s for i, s in enumerate(buffers) if s}, "param_groups": [group]}


class SGD(Optimizer):
    """Stochastic gradient descent with PyTorch's momentum/dampening/Nesterov rule.

    Args:
        params: parameters, or a list of dicts (parameter groups) each with ``params``.
        lr, momentum, dampening, nesterov, weight_decay: PyTorch's options and defaults.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0])
        >>> opt = eo.SGD([w], lr=0.1)
        >>> (w * w).sum().backward(); opt.step()
        >>> w.data
        array([0.8], dtype=float32)
    """

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach=None, differentiable: bool = False, fused=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize, foreach=foreach,
                                      differentiable=differentiable, fused=fused))

    def _check_options(self, group):
        super()._check_options(group)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise EveryOError("SGD: nesterov needs momentum > 0 and dampening == 0")

    def _update_group(self, params, group):
        states = [self.state.setdefault(p, {}) for p in params]
        buffers = kernel.sgd_step([p.data for p in params], _gradients(params, group),
                                  [state.get("momentum_buffer") for state in states],
                                  group["lr"], group["momentum"], group["dampening"],
                                  group["nesterov"], group["weight_decay"])
        if group["momentum"]:
            for state, buffer in zip(states, buffers):
                state["momentum_buffer"] = buffer


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; ``weight_decay`` adds L2 to the gradient.

    Args:
        params: parameters, or a list of dicts (parameter groups) each with ``params``.
        lr, betas, eps, weight_decay, amsgrad: PyTorch's options and defaults.

    Example:
        >>> import everyo as eo
        >>> decay, no_decay = eo.Parameter([[1.0]]), eo.Parameter([0.0])
        >>> opt = eo.Adam([{"params": [decay], "weight_decay": 0.1},
        ...                {"params": [no_decay]}], lr=1e-3)
        >>> [g["weight_decay"] for g in opt.param_groups]
        [0.1, 0.0]
    """

    state_names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, foreach=None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused=None, decoupled_weight_decay: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                                      capturable=capturable, differentiable=differentiable,
                                      fused=fused, decoupled_weight_decay=decoupled_weight_decay))

    def _check_options(self, group):
        super()._check_options(group)
        # NOTE: checked here too: AdamW's constructor does not declare it (PyTorch's neither)
        group["decoupled_weight_decay"] = checked_argument(
            type(self).__name__, "decoupled_weight_decay", group["decoupled_weight_decay"],
            "bool", EveryOError)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list, np.ndarray)) or len(betas) != 2:
            # NOTE: checked here, not at the first step() (which failed unpacking them)
            raise EveryOError(f"{type(self).__name__}: betas must be two numbers "
                              f"(beta1, beta2), got {betas!r}")
        if not all(is_real(b) and 0.0 <= b < 1.0 for b in betas):
            raise EveryOError(f"{type(self).__name__}: betas must be two finite numbers "
                              f"in [0, 1), got {tuple(betas)}")
        group["betas"] = tuple(float(b) for b in betas)

    def _update_group(self, params, group):
        beta1, beta2 = group["betas"]
        states = [self.state.setdefault(p, {}) for p in params]
        for p, state in zip(params, states):
            if "exp_avg" not in state:
                state["exp_avg"] = np.zeros_like(p.data)
                state["exp_avg_sq"] = np.zeros_like(p.data)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = np.zeros_like(p.data)
            # NOTE: the bias correction counts this parameter's own updates, as PyTorch's: a
            # parameter whose first gradient arrives late starts from t = 1.
            state["step"] = int(state.get("step", 0)) + 1
        maxima = [state["max_exp_avg_sq"] for state in states] if group["amsgrad"] else None
        kernel.adam_step([p.data for p in params], _gradients(params, group),
                         [state["exp_avg"] for state in states],
                         [state["exp_avg_sq"] for state in states], maxima,
                         [state["step"] for state in states], group["lr"], beta1, beta2,
                         group["eps"], group["weight_decay"], group["decoupled_weight_decay"])

    def _buffers_read_together(self, group):
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for buffers in self.state.values():
            # NOTE: a checkpoint written before steps were counted per parameter has none;
            # the optimizer's own count is what its bias correction used then.
            if "exp_avg" in buffers and "step" not in buffers:
                buffers["step"] = self.step_count


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); default ``weight_decay=0.01``.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([1.0])
        >>> eo.AdamW([{"params": [w], "weight_decay": 0.1}], lr=3e-4).param_groups[0]["lr"]
        0.0003
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, amsgrad: bool = False, *, maximize: bool = False,
                 foreach=None, capturable: bool = False, differentiable: bool = False,
                 fused=None, decoupled_weight_decay: bool = True):
        # NOTE: decoupled_weight_decay is not PyTorch's AdamW argument, but it is in AdamW's
        # defaults and groups (PyTorch's too), which AdamW(groups, **defaults) passes back
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=decoupled_weight_decay)

    def _check_options(self, group):
        super()._check_options(group)
        if not group["decoupled_weight_decay"]:
            raise EveryOError("AdamW: decoupled_weight_decay must be True (Adam is the one "
                              "with L2 weight decay)")
