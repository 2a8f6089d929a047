"""Losses: ``MSELoss``, ``L1Loss``, ``CrossEntropyLoss``, ``NLLLoss``, ``BCEWithLogitsLoss``, their
functional forms (``eo.cross_entropy``...) and the fused ops behind them.

Every loss computes in float32 at least (float16 input gives a float32 loss; float64 stays
float64) and takes ``reduction="mean" | "sum" | "none"``. The class axis is the LAST axis.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo.kernels import is_floating, log_softmax_array, stable_sigmoid
from everyo_layers.checks import argument, array_of, check_float
from everyo_layers.loss_reduction import (
    check_reduction,
    reduce_array,
    reduce_tensor,
    spread_array,
    spread_factor,
    spread_tensor,
)
from everyo_layers.loss_weights import class_weights, weighted_class_loss, weighted_elementwise_loss
from everyo_layers.precision import accumulation_dtype


def gather_last(t, index: np.ndarray):
    """``t[..., index]`` per position (Tensors): the entry of the last axis ``index`` names."""
    full = tuple(np.indices(index.shape, sparse=True)) + (index,)
    return dispatch("getitem", t, index=full)


def rows_and_classes(array: np.ndarray, index: np.ndarray) -> tuple:
    """``(array as (positions, C), (row numbers, index flattened))``: the flat fancy index of
    the entries ``array[..., index]`` names, one per position (``array`` (..., C), ``index``
    (...)); ``array``'s 2-D form is a view when it is contiguous.

    NOTE: ~5x cheaper than ``np.take_along_axis``/``put_along_axis`` (their index building is
    Python): a few microseconds of every classification step.
    """
    rows = index.size
    return array.reshape(rows, array.shape[-1]), (np.arange(rows), index.reshape(rows))


def softplus_neg(x):
    """``log(1 + exp(-x))`` (Tensors), stable and smooth everywhere (so its derivatives are
    right at 0)."""
    pair = dispatch("stack", x, x * 0.0, axis=-1)  # log(1 + e^-x) = -log_softmax([x, 0])[0]
    return -dispatch("getitem", dispatch("log_softmax", pair, axis=-1), index=(Ellipsis, 0))


class _LossOp(Op):
    precision = "float32"  # losses sum many values: float16 would overflow
    __slots__ = ("reduction", "count", "shape")

    def spread(self, g: np.ndarray) -> np.ndarray:
        return spread_array(g, self.reduction, self.count, self.shape)


class CrossEntropyOp(_LossOp):
    """Softmax cross-entropy of ``logits`` (..., C) against class indices (...) or class
    probabilities (..., C), with optional label smoothing and an ignored index."""

    __slots__ = ("smoothing",)
    # NOTE: probability targets are kept without a copy when their dtype matches: checked
    saved_attributes = ("target",)

    @property
    def target(self):
        return self.saved[1] if type(self.saved) is tuple else None

    def forward(self, logits, target=None, reduction="mean", label_smoothing=0.0,
                ignore_index=-100):
        z = logits.astype(accumulation_dtype(logits.dtype), copy=False)
        logp = log_softmax_array(z, -1)
        eps = self.smoothing = label_smoothing
        if target.dtype.kind in "iu":
            kept = target != ignore_index
            count = np.count_nonzero(kept)
            every = count == kept.size  # (no target ignored: nothing to mask)
            safe = target.copy() if every else np.where(kept, target, 0)
            flat, entries = rows_and_classes(logp, safe)
            loss = -flat[entries].reshape(safe.shape)
            if eps:
                # NOTE: PyTorch's smoothing: (1-eps) * nll + eps * mean over classes of -logp.
                loss = (1 - eps) * loss - eps * logp.mean(axis=-1)
            if not every:
                loss = np.where(kept, loss, 0)
            loss = loss.astype(z.dtype, copy=False)
            self.saved = (logp, safe, kept)
        else:
            q = target.astype(z.dtype, copy=False)
            if eps:
                q = (1 - eps) * q + eps / z.shape[-1]
            loss = -(q * logp).sum(axis=-1)
            count = loss.size
            self.saved = (logp, q, None)
        self.reduction, self.count, self.shape = reduction, count, loss.shape
        return reduce_array(loss, reduction, count)

    def backward(self, g):
        logp, target, kept = self.saved
        grad = np.exp(logp, order="C")  # (C order: the one-hot is subtracted through a view)
        if kept is None:  # probability targets: softmax * sum(q) - q
            grad *= target.sum(axis=-1, keepdims=True)
            grad -= target
        else:  # softmax - smoothed one-hot, zero on ignored positions
            eps = self.smoothing
            if eps:
                grad -= eps / logp.shape[-1]
            flat, entries = rows_and_classes(grad, target)
            flat[entries] -= 1 - eps
            if self.count != kept.size:
                grad *= kept[..., None]
        up = spread_factor(g, self.reduction, self.count)[..., None]
        return ((grad * up).astype(g.dtype, copy=False),)

    def backward_graph(self, g, out):
        """``(softmax(logits) - smoothed targets) * upstream`` with differentiable ops."""
        (logits,) = self.parents
        logp, target, kept = self.saved
        p = dispatch("softmax", logits.astype(logp.dtype), axis=-1)
        if kept is None:  # probability targets
            grad = p * target.sum(axis=-1, keepdims=True) - target
        else:
            eps, mask = self.smoothing, kept[..., None].astype(logp.dtype)
            onehot = np.full(logp.shape, eps / logp.shape[-1], logp.dtype)
            np.put_along_axis(onehot, target[..., None],
                              np.take_along_axis(onehot, target[..., None], -1) + (1 - eps), -1)
            grad = p * mask - onehot * mask
        up = spread_tensor(g, self.reduction, self.count, self.shape)
        return ((grad * dispatch("reshape", up, shape=up.shape + (1,))).astype(logits.data.dtype),)

    def composite(self, logits):
        """The loss with differentiable ops (for second derivatives)."""
        attrs = self.attrs
        target, eps = attrs["target"], self.smoothing
        logp = dispatch("log_softmax", logits.astype(accumulation_dtype(logits.dtype)), axis=-1)
        if target.dtype.kind in "iu":
            _, safe, kept = self.saved
            loss = -gather_last(logp, safe)
            if eps:
                loss = loss * (1 - eps) - dispatch("mean", logp, axis=-1) * eps
            loss = dispatch("where", kept, loss, 0.0)
        else:
            loss = -dispatch("sum", logp * self.saved[1], axis=-1)
        return reduce_tensor(loss, self.reduction, self.count)


class NLLLossOp(_LossOp):
    """Negative log-likelihood of class indices given log-probabilities (..., C)."""

    __slots__ = ("log_shape",)

    def forward(self, log_probs, target=None, reduction="mean", ignore_index=-100):
        lp = log_probs.astype(accumulation_dtype(log_probs.dtype), copy=False)
        kept = target != ignore_index
        safe = np.where(kept, target, 0)
        loss = -np.take_along_axis(lp, safe[..., None], -1)[..., 0] * kept
        self.saved = (safe, kept)
        self.log_shape = lp.shape
        self.reduction, self.count, self.shape = reduction, np.count_nonzero(kept), loss.shape
        return reduce_array(loss, reduction, self.count)

    def backward(self, g):
        safe, kept = self.saved
        grad = np.zeros(self.log_shape, dtype=g.dtype)
        np.put_along_axis(grad, safe[..., None], (-self.spread(g) * kept)[..., None], -1)
        return (grad,)

    def composite(self, log_probs):
        """The loss with differentiable ops (for second derivatives)."""
        safe, kept = self.saved
        lp = log_probs.astype(accumulation_dtype(log_probs.dtype))
        loss = -gather_last(lp, safe) * kept.astype(lp.data.dtype)
        return reduce_tensor(loss, self.reduction, self.count)


class _ElementwiseLossOp(_LossOp):
    """A loss of ``input`` and ``target`` of equal shapes; both may need gradients."""

    __slots__ = ()

    def forward(self, x, y, reduction="mean", **attrs):
        compute = accumulation_dtype(x.dtype)
        loss = self.elementwise(x.astype(compute, copy=False), y.astype(compute, copy=False),
                                **attrs)
        self.reduction, self.count, self.shape = reduction, loss.size, loss.shape
        return reduce_array(loss, reduction, loss.size)

    def backward(self, g):
        up = self.spread(g)
        gx, gy = self.partials()
        needs = self.needs_input_grad
        return (gx * up if needs[0] else None, gy * up if needs[1] else None)

    def composite(self, x, y):
        """The loss with differentiable ops (for second derivatives)."""
        compute = accumulation_dtype(x.data.dtype)
        return reduce_tensor(self.elementwise_graph(x.astype(compute), y.astype(compute)),
                           self.reduction, self.count)


class MSELossOp(_ElementwiseLossOp):
    __slots__ = ()

    def elementwise(self, x, y):
        diff = x - y
        self.saved = diff
        return diff * diff

    def partials(self):
        gx = 2 * self.saved
        return gx, -gx

    def elementwise_graph(self, x, y):
        diff = x - y
        return diff * diff


class L1LossOp(_ElementwiseLossOp):
    __slots__ = ()

    def elementwise(self, x, y):
        diff = x - y
        self.saved = np.sign(diff)
        return np.abs(diff)

    def partials(self):
        return self.saved, -self.saved

    def elementwise_graph(self, x, y):
        return abs(x - y)


class BCEWithLogitsOp(_ElementwiseLossOp):
    """Binary cross-entropy on logits, ``max(x,0) - x*y + log(1 + exp(-|x|))``, optionally with
    PyTorch's ``pos_weight`` on the positive term."""

    __slots__ = ()
    saved_attributes = ("pos_weight",)  # (kept without a copy when its dtype matches: checked)

    @property
    def pos_weight(self):
        return self.saved[2] if type(self.saved) is tuple else None

    def elementwise(self, x, y, pos_weight=None):
        softplus_neg = np.log1p(np.exp(-np.abs(x))) + np.maximum(-x, 0)  # log(1 + exp(-x))
        if pos_weight is None:
            self.saved = (x, y, None, None)
            return (1 - y) * x + softplus_neg
        pw = pos_weight.astype(x.dtype, copy=False)
        self.saved = (x, y, pw, softplus_neg)
        return (1 - y) * x + (1 + (pw - 1) * y) * softplus_neg

    def partials(self):
        x, y, pw, softplus_neg = self.saved
        sig = stable_sigmoid(x)
        if pw is None:
            return sig - y, -x
        weight = 1 + (pw - 1) * y
        return (1 - y) - weight * (1 - sig), -x + (pw - 1) * softplus_neg

    def elementwise_graph(self, x, y):
        pos_weight = self.attrs.get("pos_weight")
        if pos_weight is None:
            return (1.0 - y) * x + softplus_neg(x)
        pw = np.asarray(pos_weight, x.data.dtype)
        return (1.0 - y) * x + (1.0 + (pw - 1.0) * y) * softplus_neg(x)


# -- functional forms -------------------------------------------------------------------------

def _class_targets(name: str, scores: np.ndarray, target, ignore_index: int) -> np.ndarray:
    """Validate integer class targets against scores (..., C); returns them as an array."""
    argument(name, "ignore_index", ignore_index, "int")  # (a string compared unequal: ignored)
    t = array_of(target)
    classes = scores.shape[-1]
    if t.dtype.kind not in "iu":
        raise EveryOError(f"{name}: class targets must be integers, got {t.dtype.name}")
    if t.shape != scores.shape[:-1]:
        raise EveryOError(f"{name}: input of shape {scores.shape} (classes on the last axis) "
                          f"needs targets of shape {scores.shape[:-1]}, got {t.shape}")
    # NOTE: one comparison on the unsigned view first (a negative class wraps to a huge one);
    # the exact test, which lets ignore_index through, runs only when that finds one
    unsigned = t.view(t.dtype.str.replace("i", "u"))
    if not np.count_nonzero(unsigned >= classes):
        return t
    bad = (t != ignore_index) & ((t < 0) | (t >= classes))
    if bad.any():
        raise EveryOError(f"{name}: target {int(t[bad].flat[0])} is outside the {classes} "
                          f"classes [0, {classes - 1}] of input shape {scores.shape}")
    return t


def cross_entropy(input, target, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100, weight=None):
    """Softmax cross-entropy of logits with integer class targets (or class probabilities).

    Args:
        input: logits of shape (..., C) — the class axis is the last one.
        target: integer classes of shape (...), or probabilities of shape (..., C).
        reduction: "mean" (over non-ignored targets), "sum" or "none".
        label_smoothing: mix the target with the uniform distribution (PyTorch's rule).
        ignore_index: class-index targets equal to it contribute nothing.
        weight: optional per-class weights (C,); "mean" then divides by the summed weights of
            the counted targets (PyTorch's rule, see :mod:`everyo_layers.loss_weights`).

    Returns:
        A float32 (float64 for float64 input) tensor, scalar unless reduction="none".

    Example:
        >>> import everyo as eo, numpy as np
        >>> loss = eo.cross_entropy(eo.zeros(2, 4), np.array([0, 3]))
        >>> round(loss.item(), 4)  # log(4)
        1.3863
    """
    check_reduction("cross_entropy", reduction)
    scores = check_float("cross_entropy", input)
    if scores.ndim < 1:
        raise EveryOError("cross_entropy: input needs a class axis, got a scalar")
    if not 0.0 <= label_smoothing <= 1.0:
        raise EveryOError(f"cross_entropy: label_smoothing must be in [0, 1], got "
                          f"{label_smoothing}")
    t = array_of(target)
    if is_floating(t.dtype):
        if t.shape != scores.shape:
            raise EveryOError(f"cross_entropy: probability targets must match the input shape "
                              f"{scores.shape}, got {t.shape}")
    else:
        t = _class_targets("cross_entropy", scores, t, ignore_index)
    if weight is not None:
        w = class_weights("cross_entropy", weight, scores.shape[-1], scores.dtype)
        return weighted_class_loss("cross_entropy", input, t, w, reduction, ignore_index,
                                   float(label_smoothing))
    return dispatch("cross_entropy", input, target=t, reduction=reduction,
                    label_smoothing=float(label_smoothing), ignore_index=ignore_index)


def nll_loss(input, target, reduction: str = "mean", ignore_index: int = -100, weight=None):
    """Negative log-likelihood: ``-input[..., target]`` for log-probabilities (..., C).

    Example:
        >>> import everyo as eo, numpy as np
        >>> eo.nll_loss(eo.log_softmax(eo.zeros(2, 2)), np.array([0, 1])).item() > 0
        True
    """
    check_reduction("nll_loss", reduction)
    scores = check_float("nll_loss", input)
    t = _class_targets("nll_loss", scores, target, ignore_index)
    if weight is not None:
        w = class_weights("nll_loss", weight, scores.shape[-1], scores.dtype)
        return weighted_class_loss("nll_loss", input, t, w, reduction, ignore_index)
    return dispatch("nll_loss", input, target=t, reduction=reduction, ignore_index=ignore_index)


def _check_elementwise(name: str, input, target, reduction: str) -> None:
    check_reduction(name, reduction)
    x = check_float(name, input)
    y = check_float(f"{name} (target)", target)
    if x.shape != y.shape:
        # NOTE: no broadcasting: (N, 1) against (N,) silently builds an N x N loss in NumPy.
        raise EveryOError(f"{name}: input shape {x.shape} and target shape {y.shape} differ")


def _elementwise(name: str, op: str, input, target, reduction: str, **attrs):
    _check_elementwise(name, input, target, reduction)
    return dispatch(op, input, target, reduction=reduction, **attrs)


def mse_loss(input, target, reduction: str = "mean"):
    """Mean squared error ``(input - target)**2`` (shapes must match).

    Example:
        >>> import everyo as eo
        >>> eo.mse_loss(eo.ones(3), eo.zeros(3)).item()
        1.0
    """
    return _elementwise("mse_loss", "mse_loss", input, target, reduction)


def l1_loss(input, target, reduction: str = "mean"):
    """Mean absolute error ``|input - target|`` (shapes must match).

    Example:
        >>> import everyo as eo
        >>> eo.l1_loss(eo.ones(3), eo.zeros(3), reduction="sum").item()
        3.0
    """
    return _elementwise("l1_loss", "l1_loss", input, target, reduction)


def binary_cross_entropy_with_logits(input, target, reduction: str = "mean", pos_weight=None,
                                     weight=None):
    """Binary cross-entropy of logits against targets in [0, 1], computed stably.

    Args:
        input: logits, any shape. target: same shape. pos_weight: optional weight of the
            positive term, broadcast over the last axis (PyTorch's). weight: optional weight
            of each element's loss, broadcast to the input ("mean" still divides by the number
            of elements, as PyTorch).

    Example:
        >>> import everyo as eo
        >>> round(eo.binary_cross_entropy_with_logits(eo.zeros(2), eo.ones(2)).item(), 4)
        0.6931
    """
    attrs = {}
    name = "binary_cross_entropy_with_logits"
    if pos_weight is not None:
        attrs["pos_weight"] = _broadcasting_weight(name, "pos_weight", pos_weight, input)
    if weight is not None:
        w = _broadcasting_weight(name, "weight", weight, input)
        _check_elementwise(name, input, target, reduction)
        return weighted_elementwise_loss("bce_with_logits", input, target, w, reduction, **attrs)
    return _elementwise("binary_cross_entropy_with_logits", "bce_with_logits", input, target,
                        reduction, **attrs)


def _broadcasting_weight(name: str, what: str, weight, input) -> np.ndarray:
    w = check_float(f"{name} ({what})", weight)
    shape = array_of(input).shape
    try:
        fits = np.broadcast_shapes(w.shape, shape) == shape
    except ValueError:
        fits = False
    if not fits:  # NOTE: broadcasting *beyond* the input would silently grow the loss
        raise EveryOError(f"{name}: {what} of shape {w.shape} does not broadcast to the input "
                          f"shape {shape}")
    return w


# -- modules ----------------------------------------------------------------------------------

class _Loss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        check_reduction(type(self).__name__, reduction)
        self.reduction = reduction

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class MSELoss(_Loss):
    """Mean squared error; see :func:`mse_loss`."""

    def forward(self, input, target):
        return mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    """Mean absolute error; see :func:`l1_loss`."""

    def forward(self, input, target):
        return l1_loss(input, target, self.reduction)


class CrossEntropyLoss(_Loss):
    """Softmax cross-entropy of logits (..., C) and integer targets; see :func:`cross_entropy`.

    Example:
        >>> import everyo as eo, numpy as np
        >>> criterion = eo.CrossEntropyLoss(label_smoothing=0.1)
        >>> criterion(eo.zeros(3, 5), np.array([0, 1, 4])).dtype
        'float32'
    """

    def __init__(self, reduction: str = "mean", label_smoothing: float = 0.0,
                 ignore_index: int = -100, weight=None):
        super().__init__(reduction)
        self.label_smoothing = argument("CrossEntropyLoss", "label_smoothing", label_smoothing,
                                        "probability")
        self.ignore_index = argument("CrossEntropyLoss", "ignore_index", ignore_index, "int")
        self.weight = None if weight is None else np.asarray(array_of(weight))

    def forward(self, input, target):
        return cross_entropy(input, target, self.reduction, self.label_smoothing,
                             self.ignore_index, self.weight)


class NLLLoss(_Loss):
    """Negative log-likelihood of log-probabilities; see :func:`nll_loss`."""

    def __init__(self, reduction: str = "mean", ignore_index: int = -100, weight=None):
        super().__init__(reduction)
        self.ignore_index = argument("NLLLoss", "ignore_index", ignore_index, "int")
        self.weight = None if weight is None else np.asarray(array_of(weight))

    def forward(self, input, target):
        return nll_loss(input, target, self.reduction, self.ignore_index, self.weight)


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy on logits; see :func:`binary_cross_entropy_with_logits`."""

    def __init__(self, reduction: str = "mean", pos_weight=None, weight=None):
        super().__init__(reduction)
        self.pos_weight = None if pos_weight is None else np.asarray(array_of(pos_weight))
        self.weight = None if weight is None else np.asarray(array_of(weight))

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.reduction, self.pos_weight,
                                                self.weight)


OPS = {"cross_entropy": CrossEntropyOp, "nll_loss": NLLLossOp, "mse_loss": MSELossOp,
       "l1_loss": L1LossOp, "bce_with_logits": BCEWithLogitsOp}
LAYERS = {"MSELoss": MSELoss, "L1Loss": L1Loss, "CrossEntropyLoss": CrossEntropyLoss,
          "NLLLoss": NLLLoss, "BCEWithLogitsLoss": BCEWithLogitsLoss,
          "cross_entropy": cross_entropy, "nll_loss": nll_loss, "mse_loss": mse_loss,
          "l1_loss": l1_loss, "binary_cross_entropy_with_logits": binary_cross_entropy_with_logits}
