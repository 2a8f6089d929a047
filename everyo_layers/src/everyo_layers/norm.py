"""Normalisation: ``LayerNorm``, ``BatchNorm1D``, ``BatchNorm2D`` (channel-last) and their fused
ops. Statistics are computed in float32 even for float16 input; the output keeps the input's
dtype."""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, Parameter, dispatch
from everyo.kernels import kernel
from everyo_layers.checks import (
    argument,
    check_float,
    normalized_shape_argument,
    optional_argument,
)
from everyo_layers.norm_kernels import normalize
from everyo_layers.precision import accumulation_dtype


class LayerNormOp(Op):
    """Normalise over the trailing ``ndims`` axes, then scale and shift (weight, bias optional).

    The arithmetic is the ``layer_norm_forward``/``layer_norm_backward`` kernels
    (``everyo_layers.norm_kernels``)."""

    precision = "float32"
    __slots__ = ("axes",)

    def forward(self, x, weight=None, bias=None, ndims=1, eps=1e-5):
        self.axes = tuple(range(x.ndim - ndims, x.ndim))
        out, xhat, inv_std = kernel.layer_norm_forward(x, weight, bias, ndims, eps)
        self.saved = (xhat, inv_std, weight)
        return out

    def backward(self, g):
        xhat, inv_std, weight = self.saved
        return kernel.layer_norm_backward(g, xhat, inv_std, weight, len(self.axes),
                                          self.needs_input_grad)

    def composite(self, x, weight=None, bias=None):
        """The normalisation with differentiable ops (for second derivatives)."""
        centered = x - dispatch("mean", x, axis=self.axes, keepdims=True)
        var = dispatch("mean", centered * centered, axis=self.axes, keepdims=True)
        return _affine(centered / dispatch("sqrt", var + self.attrs.get("eps", 1e-5)),
                       weight, bias)


class BatchNormOp(Op):
    """Channel-last batch normalisation. With ``training`` it normalises by the batch
    statistics (biased variance) and updates ``running_mean``/``running_var`` in place (unbiased
    variance, PyTorch's rule); otherwise it normalises by the running statistics.

    The arithmetic is the ``batch_norm_forward``/``batch_norm_backward`` kernels
    (``everyo_layers.norm_kernels``)."""

    precision = "float32"
    __slots__ = ("training", "statistics")

    def forward(self, x, weight=None, bias=None, running_mean=None, running_var=None,
                training=True, momentum=0.1, eps=1e-5):
        self.training = training
        if training:
            out, xhat, inv_std, mean, var = kernel.batch_norm_forward(x, weight, bias, eps)
            if running_mean is not None:
                count = x.size // x.shape[-1]
                running_mean *= 1 - momentum
                running_mean += (momentum * mean).astype(running_mean.dtype, copy=False)
                running_var *= 1 - momentum
                unbiased = var * (count / (count - 1))
                running_var += (momentum * unbiased).astype(running_var.dtype, copy=False)
        else:
            # NOTE: copies, not views: a later training-mode call updates the running
            # statistics in place, and this graph's backward must see the values it used.
            compute = accumulation_dtype(x.dtype)
            mean, var = running_mean.astype(compute), running_var.astype(compute)
            self.statistics = (mean, var)
            centered = x.astype(compute, copy=False) - mean
            out, xhat, inv_std = normalize(x, centered, var, eps, weight, bias)
        self.saved = (xhat, inv_std, weight)
        return out

    def backward(self, g):
        xhat, inv_std, weight = self.saved
        return kernel.batch_norm_backward(g, xhat, inv_std, weight, self.training,
                                          self.needs_input_grad)

    def composite(self, x, weight=None, bias=None):
        """Batch (training) or running (evaluation) statistics with differentiable ops; the
        running statistics are not updated again."""
        attrs = self.attrs
        if self.training:
            axes = tuple(range(x.ndim - 1))
            centered = x - dispatch("mean", x, axis=axes, keepdims=True)
            var = dispatch("mean", centered * centered, axis=axes, keepdims=True)
        else:
            mean, var = self.statistics
            centered = x - mean
        return _affine(centered / dispatch("sqrt", var + attrs.get("eps", 1e-5)), weight, bias)


def _affine(xhat, weight, bias):
    out = xhat if weight is None else xhat * weight
    return out if bias is None else out + bias


class LayerNorm(Module):
    """Normalise each sample over its trailing ``normalized_shape`` axes (mean 0, variance 1),
    then apply a learned per-element scale and shift.

    Args:
        normalized_shape: int or tuple, the trailing shape to normalise over.
        eps: added to the variance.
        elementwise_affine: learn ``weight`` (ones) and ``bias`` (zeros).
        bias: with ``elementwise_affine``, learn the shift too (``False``: scale only).

    Example:
        >>> import everyo as eo
        >>> out = eo.LayerNorm(4)(eo.arange(8.0).reshape(2, 4))
        >>> out.data.mean(axis=-1).round(6).tolist()
        [0.0, 0.0]
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True):
        super().__init__()
        self.normalized_shape = normalized_shape_argument("LayerNorm", normalized_shape)
        self.eps = argument("LayerNorm", "eps", eps, "non-negative float")
        self.elementwise_affine = bool(elementwise_affine)
        if elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, np.float32))
            self.bias = Parameter(np.zeros(self.normalized_shape, np.float32)) if bias else None
        else:
            self.weight = self.bias = None

    def forward(self, x):
        data = check_float(f"LayerNorm{self.normalized_shape}", x)
        n = len(self.normalized_shape)
        if data.shape[data.ndim - n:] != self.normalized_shape or data.ndim < n:
            raise EveryOError(f"LayerNorm{self.normalized_shape}: expected input ending in "
                              f"{self.normalized_shape}, got shape {data.shape}")
        params = tuple(p for p in (self.weight, self.bias) if p is not None)
        return dispatch("layer_norm", x, *params, ndims=n, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class _BatchNorm(Module):
    """Shared by BatchNorm1D/2D: parameters, running statistics and the train/eval switch."""

    ranks: tuple = ()
    layout: str = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum=0.1, affine: bool = True,
                 track_running_stats: bool = True):
        super().__init__()
        name = type(self).__name__
        self.num_features = argument(name, "num_features", num_features, "positive int")
        self.eps = argument(name, "eps", eps, "non-negative float")
        self.momentum = optional_argument(name, "momentum", momentum, "probability")
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        c = self.num_features
        if affine:
            self.weight = Parameter(np.ones(c, np.float32))
            self.bias = Parameter(np.zeros(c, np.float32))
        else:
            self.weight = self.bias = None
        tracked = track_running_stats
        self.register_buffer("running_mean", np.zeros(c, np.float32) if tracked else None)
        self.register_buffer("running_var", np.ones(c, np.float32) if tracked else None)
        self.register_buffer("num_batches_tracked", np.array(0, np.int64) if tracked else None)

    @property
    def label(self) -> str:
        return f"{type(self).__name__}({self.num_features})"

    def _check(self, x) -> np.ndarray:
        data = check_float(self.label, x)
        if data.ndim not in self.ranks or data.shape[-1] != self.num_features:
            hint = ""
            if data.ndim >= 2 and data.shape[1] == self.num_features != data.shape[-1]:
                hint = " — channels go last here, is this channels-first?"
            raise EveryOError(f"{self.label}: expected {self.layout} input with "
                              f"{self.num_features} channels on the last axis, got shape "
                              f"{data.shape}{hint}")
        return data

    def forward(self, x):
        data = self._check(x)
        use_batch_stats = self.training or not self.track_running_stats
        momentum = 0.0
        if use_batch_stats and data.size // data.shape[-1] < 2:
            # NOTE: one value per channel has variance 0: the output would be all zeros (or
            # just the bias). PyTorch refuses it whenever batch statistics are used.
            raise EveryOError(f"{self.label}: normalising by batch statistics needs more than "
                              f"one value per channel, got input shape {data.shape}")
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1
            # NOTE: momentum=None means a cumulative average, as in PyTorch.
            momentum = (1.0 / int(self.num_batches_tracked) if self.momentum is None
                        else float(self.momentum))
        params = (self.weight, self.bias) if self.affine else ()
        return dispatch("batch_norm", x, *params, running_mean=self.running_mean,
                        running_var=self.running_var, training=use_batch_stats,
                        momentum=momentum, eps=self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1D(_BatchNorm):
    """Batch normalisation of ``(N, C)`` or ``(N, L, C)`` input, per channel (the last axis).

    Example:
        >>> import everyo as eo
        >>> bn = eo.BatchNorm1D(3)
        >>> bn(eo.randn(8, 3, seed=0)).shape, bn.running_mean.shape
        ((8, 3), (3,))
    """

    ranks = (2, 3)
    layout = "(N, C) or (N, L, C)"


class BatchNorm2D(_BatchNorm):
    """Batch normalisation of NHWC input, per channel (the last axis).

    Example:
        >>> import everyo as eo
        >>> eo.BatchNorm2D(4)(eo.randn(2, 5, 5, 4, seed=0)).shape
        (2, 5, 5, 4)
    """

    ranks = (4,)
    layout = "NHWC"


OPS = {"layer_norm": LayerNormOp, "batch_norm": BatchNormOp}
LAYERS = {"LayerNorm": LayerNorm, "BatchNorm1D": BatchNorm1D, "BatchNorm2D": BatchNorm2D}
