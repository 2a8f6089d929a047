"""L-BFGS with PyTorch's algorithm (``torch.optim.LBFGS``): a closure re-evaluates the loss,
the two-loop recursion over ``history_size`` curvature pairs gives the direction, and the step is
``lr`` or found by a strong-Wolfe line search (cubic interpolation, PyTorch's constants)."""

from __future__ import annotations

import numpy as np

from everyo.dtypes import BFLOAT16
from everyo.errors import EveryOError
from everyo.grad_mode import enable_grad
from everyo.optim import Optimizer, check_writable
from everyo.porting_layout import flat_from_pytorch, pytorch_array
from everyo.validation import checked_argument, checked_gradients, checked_list
from everyo.versioning import bump_version

_HISTORY = ("old_dirs", "old_stps", "ro")
_VECTORS = ("d", "prev_flat_grad")
_COUNTS = ("max_iter", "max_eval", "history_size")


def _count(name: str, value) -> int:
    """A positive whole number (a float such as 20.0 from a checkpoint counts)."""
    whole = isinstance(value, (int, np.integer)) or (
        isinstance(value, (float, np.floating)) and float(value).is_integer())
    if isinstance(value, (bool, np.bool_)) or not whole or value < 1:
        raise EveryOError(f"LBFGS: {name} must be a positive int, got {value!r}")
    return int(value)


def cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None) -> float:
    """The minimiser of the cubic through two points with values and slopes, clipped to
    ``bounds`` (default the points' interval); the midpoint when the cubic has none."""
    low, high = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square < 0:
        return (low + high) / 2.0
    d2 = np.sqrt(d2_square)
    if x1 <= x2:
        position = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        position = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return float(min(max(position, low), high))


class _Bracket:
    """The line search's interval: steps, losses, gradients and directional derivatives."""

    def __init__(self, t, f, g, gtd):
        self.t, self.f, self.g, self.gtd = list(t), list(f), list(g), list(gtd)

    def positions(self) -> tuple:
        return (0, 1) if self.f[0] <= self.f[-1] else (1, 0)

    def set(self, i, t, f, g, gtd) -> None:
        self.t[i], self.f[i], self.g[i], self.gtd[i] = t, f, g, gtd


def _bracket_phase(evaluate, t, d, f, g, gtd, c1, c2, max_ls):
    """Grow the step until an interval holds a point satisfying the strong Wolfe conditions.
    Returns ``(bracket, done, evaluations, iterations)``."""
    f_new, g_new = evaluate(t)
    evals, ls_iter = 1, 0
    gtd_new = float(g_new @ d)
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    while ls_iter < max_ls:
        if f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev):
            return _Bracket((t_prev, t), (f_prev, f_new), (g_prev, g_new),
                            (gtd_prev, gtd_new)), False, evals, ls_iter
        if abs(gtd_new) <= -c2 * gtd:
            return _Bracket((t,), (f_new,), (g_new,), (gtd_new,)), True, evals, ls_iter
        if gtd_new >= 0:
            return _Bracket((t_prev, t), (f_prev, f_new), (g_prev, g_new),
                            (gtd_prev, gtd_new)), False, evals, ls_iter
        bounds = (t + 0.01 * (t - t_prev), t * 10)
        t_prev, t = t, cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds)
        f_prev, g_prev, gtd_prev = f_new, g_new, gtd_new
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = float(g_new @ d)
        ls_iter += 1
    return _Bracket((0.0, t), (f, f_new), (g, g_new), (gtd, gtd_new)), False, evals, ls_iter


def _safeguarded(bracket: _Bracket, insufficient: bool) -> tuple:
    """The zoom phase's next trial step, kept away from the interval's ends (PyTorch's rule)."""
    t = cubic_interpolate(bracket.t[0], bracket.f[0], bracket.gtd[0],
                          bracket.t[1], bracket.f[1], bracket.gtd[1])
    high, low = max(bracket.t), min(bracket.t)
    eps = 0.1 * (high - low)
    if min(high - t, t - low) >= eps:
        return t, False
    if insufficient or t >= high or t <= low:
        return (high - eps if abs(t - high) < abs(t - low) else low + eps), False
    return t, True


def strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9,
                 max_ls=25) -> tuple:
    """PyTorch's strong-Wolfe line search along ``d`` from loss ``f``, gradient ``g``.

    ``evaluate(t)`` returns the loss and flat gradient at step ``t``. Returns
    ``(loss, flat_grad, t, evaluations)`` of the accepted step.
    """
    d_norm = float(np.abs(d).max())
    bracket, done, evals, ls_iter = _bracket_phase(evaluate, t, d, f, g, gtd, c1, c2, max_ls)
    insufficient = False
    low, high = bracket.positions()
    while not done and ls_iter < max_ls:
        if abs(bracket.t[1] - bracket.t[0]) * d_norm < tolerance_change:
            break
        t, insufficient = _safeguarded(bracket, insufficient)
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = float(g_new @ d)
        ls_iter += 1
        if f_new > f + c1 * t * gtd or f_new >= bracket.f[low]:
            bracket.set(high, t, f_new, g_new, gtd_new)
            low, high = bracket.positions()
            continue
        if abs(gtd_new) <= -c2 * gtd:
            done = True
        elif gtd_new * (bracket.t[high] - bracket.t[low]) >= 0:
            bracket.set(high, bracket.t[low], bracket.f[low], bracket.g[low], bracket.gtd[low])
        bracket.set(low, t, f_new, g_new, gtd_new)
    low = low if len(bracket.t) > 1 else 0
    return bracket.f[low], bracket.g[low], bracket.t[low], evals


class LBFGS(Optimizer):
    """L-BFGS (PyTorch's ``torch.optim.LBFGS``); ``step(closure)`` runs up to ``max_iter``
    iterations, calling ``closure()`` (which zeroes the gradients, computes the loss, calls
    ``backward`` and returns the loss) as often as it needs.

    Args:
        params: the parameters (one group only, as PyTorch).
        lr: the step length (the first iteration's is ``min(1, 1/|g|_1) * lr``).
        max_iter, max_eval (default ``max_iter * 5 // 4``), tolerance_grad, tolerance_change,
        history_size: PyTorch's options and defaults.
        line_search_fn: None (a fixed step) or ``"strong_wolfe"``.

    Example:
        >>> import everyo as eo
        >>> w = eo.Parameter([3.0, -2.0], dtype="float64")
        >>> opt = eo.LBFGS([w], line_search_fn="strong_wolfe")
        >>> def closure():
        ...     opt.zero_grad()
        ...     loss = ((w - 1.0) ** 2).sum()
        ...     loss.backward()
        ...     return loss
        >>> _ = opt.step(closure)
        >>> w.data.round(6)
        array([1., 1.])
    """

    def __init__(self, params, lr: float = 1.0, max_iter: int = 20, max_eval=None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9,
                 history_size: int = 100, line_search_fn=None):
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        super().__init__(params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval,
                                      tolerance_grad=tolerance_grad,
                                      tolerance_change=tolerance_change,
                                      history_size=history_size, line_search_fn=line_search_fn))
        if len(self.param_groups) != 1:
            raise EveryOError("LBFGS doesn't support per-parameter options (parameter groups)")

    def _check_options(self, group):
        counts = {name: _count(name, group[name]) for name in _COUNTS}
        super()._check_options(group)
        group.update(counts)  # (counts stay ints whatever the base makes of numbers)
        search = group["line_search_fn"]
        if not (search is None or (isinstance(search, str) and search == "strong_wolfe")):
            raise EveryOError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got "
                              f"{search!r}")
        if search == "strong_wolfe" and group["lr"] <= 0:
            # NOTE: the search's first interpolation would be between two equal steps
            raise EveryOError(f"LBFGS: lr must be positive with line_search_fn="
                              f"'strong_wolfe', got {group['lr']!r}")

    # -- flat views of the parameters ---------------------------------------------------------
    def _flat_grad(self) -> np.ndarray:
        params = self.param_groups[0]["params"]
        checked_gradients("LBFGS.step", [p for p in params if p.grad is not None],
                          numbered_in=params)
        return np.concatenate([np.zeros(p.data.size, p.data.dtype) if p.grad is None
                               else p.grad.reshape(-1) for p in params])

    def _add_step(self, t: float, direction: np.ndarray) -> None:
        offset = 0
        for p in self.param_groups[0]["params"]:
            p.data += t * direction[offset:offset + p.data.size].reshape(p.shape)
            offset += p.data.size
            bump_version(p)

    def _set_params(self, values: list) -> None:
        for p, value in zip(self.param_groups[0]["params"], values):
            p.data[...] = value
            bump_version(p)

    def _evaluate(self, closure) -> float:
        with enable_grad():
            loss = closure()
        return float(loss.data if hasattr(loss, "data") else loss)

    def _directional(self, closure, start: list, direction: np.ndarray):
        def evaluate(t):
            self._add_step(t, direction)
            loss, grad = self._evaluate(closure), self._flat_grad()
            self._set_params(start)
            return loss, grad
        return evaluate

    # -- the step ---------------------------------------------------------------------------
    def step(self, closure=None):
        """Run up to ``max_iter`` L-BFGS iterations; returns the first ``closure()`` loss."""
        if closure is None or not callable(closure):
            raise EveryOError(f"LBFGS.step needs a closure that zeroes the gradients, computes "
                              f"the loss, calls backward() and returns the loss; got "
                              f"{type(closure).__name__}")
        group = self.param_groups[0]
        check_writable("LBFGS.step", group["params"], group["params"])
        state = self.state.setdefault(group["params"][0], {})
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        self.step_count += 1
        with enable_grad():
            first_loss = closure()
        loss = float(first_loss.data if hasattr(first_loss, "data") else first_loss)
        state["func_evals"] += 1
        flat_grad = self._flat_grad()
        if np.abs(flat_grad).max() <= group["tolerance_grad"]:
            return first_loss
        self._iterate(closure, group, state, loss, flat_grad)
        return first_loss

    def _iterate(self, closure, group, state, loss, flat_grad) -> None:
        evals, n_iter = 1, 0
        while n_iter < group["max_iter"]:
            n_iter += 1
            state["n_iter"] += 1
            d = self._direction(state, flat_grad, group["history_size"])
            state["prev_flat_grad"], state["prev_loss"] = flat_grad.copy(), loss
            t = (min(1.0, 1.0 / float(np.abs(flat_grad).sum())) * group["lr"]
                 if state["n_iter"] == 1 else group["lr"])
            state["d"], state["t"] = d, t
            gtd = float(flat_grad @ d)
            if gtd > -group["tolerance_change"]:
                break
            loss, flat_grad, t, used = self._line_step(closure, group, d, t, loss, flat_grad,
                                                       gtd, n_iter)
            state["t"] = t
            evals += used
            state["func_evals"] += used
            if (n_iter == group["max_iter"] or evals >= group["max_eval"]
                    or np.abs(flat_grad).max() <= group["tolerance_grad"]
                    or np.abs(d * t).max() <= group["tolerance_change"]
                    or abs(loss - state["prev_loss"]) < group["tolerance_change"]):
                break

    def _line_step(self, closure, group, d, t, loss, flat_grad, gtd, n_iter) -> tuple:
        """Take the step along ``d``: the strong-Wolfe one, or ``t`` (then re-evaluate unless
        this is the last iteration). Returns ``(loss, flat_grad, t, evaluations)``."""
        if group["line_search_fn"] == "strong_wolfe":
            start = [p.data.copy() for p in group["params"]]
            loss, flat_grad, t, used = strong_wolfe(self._directional(closure, start, d), t, d,
                                                    loss, flat_grad, gtd)
            self._add_step(t, d)
            return loss, flat_grad, t, used
        self._add_step(t, d)
        if n_iter == group["max_iter"]:
            return loss, flat_grad, t, 0
        return self._evaluate(closure), self._flat_grad(), t, 1

    def _direction(self, state: dict, flat_grad: np.ndarray, history_size: int) -> np.ndarray:
        """``-H g`` by the two-loop recursion, after adding the last step's curvature pair."""
        if state["n_iter"] == 1:
            state.update(old_dirs=[], old_stps=[], ro=[], H_diag=1.0)
            return -flat_grad
        y = flat_grad - state["prev_flat_grad"]
        s = state["d"] * state["t"]
        ys = float(y @ s)
        if ys > 1e-10:
            if len(state["old_dirs"]) == history_size:
                for name in _HISTORY:
                    state[name].pop(0)
            state["old_dirs"].append(y)
            state["old_stps"].append(s)
            state["ro"].append(1.0 / ys)
            state["H_diag"] = ys / float(y @ y)
        dirs, steps, ro = state["old_dirs"], state["old_stps"], state["ro"]
        alphas = [0.0] * len(dirs)
        q = -flat_grad
        for i in range(len(dirs) - 1, -1, -1):
            alphas[i] = float(steps[i] @ q) * ro[i]
            q = q - alphas[i] * dirs[i]
        r = q * state["H_diag"]
        for i in range(len(dirs)):
            beta = float(dirs[i] @ r) * ro[i]
            r = r + (alphas[i] - beta) * steps[i]
        return r

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """As every optimizer's; the curvature history is a list of arrays per name."""
        saved = super().state_dict()
        for buffers in saved["state"].values():
            for name in _HISTORY:
                if name in buffers:
                    buffers[name] = [np.array(v, copy=True) for v in buffers[name]]
        return saved

    def load_state_dict(self, state: dict) -> None:
        """As every optimizer's, after checking every buffer the next step reads (counts,
        step length, direction, curvature history) fits the parameters: nothing changes when
        one does not."""
        params = self.param_groups[0]["params"]
        size = sum(p.data.size for p in params)
        dtype = params[0].data.dtype
        saved = state.get("state") if isinstance(state, dict) else None
        history_size = self.param_groups[0]["history_size"]
        groups = state.get("param_groups") if isinstance(state, dict) else None
        if isinstance(groups, (list, tuple)) and groups and isinstance(groups[0], dict):
            try:
                history_size = _count("history_size", groups[0].get("history_size",
                                                                    history_size))
            except EveryOError:
                pass  # (the base's check of the options names it)
        if isinstance(saved, dict) and "type" not in state:  # PyTorch's: PyTorch's layouts
            saved = {key: _in_everyo_layout(buffers, params) for key, buffers in saved.items()}
        converted = ({key: _history(buffers, size, dtype, history_size)
                      for key, buffers in saved.items()} if isinstance(saved, dict) else {})
        super().load_state_dict(state)
        for buffers, vectors in zip(self.state.values(), converted.values()):
            buffers.update(vectors)


_OWNER = "LBFGS.load_state_dict"
#: What an iteration reads back once one has run (n_iter >= 1).
_ITERATION = ("d", "t", "prev_flat_grad", "H_diag") + _HISTORY


def _in_everyo_layout(buffers, params: list):
    """PyTorch's L-BFGS vectors (each parameter flattened in PyTorch's layout, in order)
    in EveryO's layouts, as the parameters' weights converted (docs/porting.md)."""
    if not isinstance(buffers, dict):
        return buffers  # (_history names it)

    def convert(name, value):
        return flat_from_pytorch(f"{_OWNER}: {name!r}", params, pytorch_array(repr(name), value))

    def scalar(name, value):
        value = pytorch_array(repr(name), value)  # PyTorch keeps some as 0-d tensors
        return value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value

    converted = dict(buffers)
    converted.pop("al", None)  # PyTorch's scratch space of a direction's computation
    for name in ("t", "H_diag", "prev_loss"):
        if name in buffers:
            converted[name] = scalar(name, buffers[name])
    if isinstance(buffers.get("ro"), (list, tuple)):
        converted["ro"] = [scalar("ro", v) for v in buffers["ro"]]
    for name in _VECTORS:
        if name in buffers:
            converted[name] = convert(name, buffers[name])
    for name in ("old_dirs", "old_stps"):
        if isinstance(buffers.get(name), (list, tuple)):
            converted[name] = [convert(name, v) for v in buffers[name]]
    return converted


def _history(buffers: dict, size: int, dtype, history_size: int) -> dict:
    """The saved counts, step, direction, gradient and curvature pairs, checked and
    converted (vectors to the parameters' dtype)."""
    if not isinstance(buffers, dict):
        raise EveryOError(f"{_OWNER}: a parameter's state is a dict, got "
                          f"{type(buffers).__name__}")
    checked: dict = {name: checked_argument(_OWNER, repr(name), buffers[name], "non-negative int",
                                            EveryOError)
                     for name in ("func_evals", "n_iter") if name in buffers}
    checked.update({name: checked_argument(_OWNER, repr(name), buffers[name], "float", EveryOError)
                    for name in ("t", "H_diag", "prev_loss") if name in buffers})
    checked.update({name: _vector(name, buffers[name], size, dtype)
                    for name in _VECTORS if name in buffers})
    lengths = set()
    for name in _HISTORY:
        if name in buffers:
            items = checked_list(_OWNER, repr(name), buffers[name])
            checked[name] = ([checked_argument(_OWNER, repr(name), v, "float", EveryOError)
                              for v in items] if name == "ro"
                             else [_vector(name, v, size, dtype) for v in items])
            lengths.add(len(items))
    if len(lengths) > 1 or max(lengths, default=0) > history_size:
        raise EveryOError(f"{_OWNER}: the curvature history {_HISTORY} has lengths "
                          f"{sorted(lengths)}; they must be equal and at most history_size "
                          f"{history_size}")
    missing = [name for name in _ITERATION if name not in buffers]
    if checked.get("n_iter", 0) >= 1 and missing:
        raise EveryOError(f"{_OWNER}: the state has run {checked['n_iter']} iterations but "
                          f"lacks {missing}, which the next one reads")
    return checked


def _vector(name: str, value, size: int, dtype) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = np.asarray(None)
    if array.dtype.kind not in "biuf" and array.dtype != BFLOAT16:
        raise EveryOError(f"{_OWNER}: {name!r} is not a vector of real numbers (dtype "
                          f"{array.dtype})")
    array = array.astype(dtype).reshape(-1)
    if array.size != size:
        raise EveryOError(f"{_OWNER}: {name!r} has {array.size} entries, the "
                          f"parameters {size}")
    return array
