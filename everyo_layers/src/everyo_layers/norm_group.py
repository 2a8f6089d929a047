"""``GroupNorm`` (channels-last) and ``RMSNorm``, and their fused ops ``group_norm`` and
``rms_norm``. Statistics as the other norms: float32 at least, float64 accumulation
(:func:`everyo_layers.norm_stats.moments`); the output keeps the input's dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from everyo import EveryOError, Module, Op, Parameter, dispatch
from everyo.kernels import kernel
from everyo_layers.checks import (
    argument,
    check_float,
    normalized_shape_argument,
    optional_argument,
)
from everyo_layers.norm_kernels import group_shape
from everyo_layers.precision import accumulation_dtype


class GroupNormOp(Op):
    """Normalise channels-last ``x`` (N, ..., C) over each sample's ``groups`` channel groups
    (and all its positions), then scale and shift per channel."""

    __slots__ = ("groups", "eps", "shape")
    saved_inputs = (1,)  # the weight; the normalised input is a private copy
    saves_output = False

    def forward(self, x, weight=None, bias=None, groups=1, eps=1e-5):
        c = x.shape[-1] if x.ndim else 0
        if x.ndim < 2 or c % groups:
            raise EveryOError(f"group_norm: {groups} groups do not divide the {c} channels of "
                              f"input {x.shape}")
        self.groups, self.eps, self.shape = groups, eps, x.shape
        out, xhat, inv_std = kernel.group_norm_forward(x, weight, bias, groups, eps)
        self.saved = (xhat, inv_std, weight)
        return out

    def backward(self, g):
        xhat, inv_std, weight = self.saved
        return kernel.group_norm_backward(g, xhat, inv_std, weight, self.groups,
                                          self.needs_input_grad)

    def _grouped(self) -> tuple:
        return group_shape(self.shape, self.groups)

    def composite(self, x, weight=None, bias=None):
        xg = dispatch("reshape", x, shape=self._grouped())
        centered = xg - dispatch("mean", xg, axis=(1, 3), keepdims=True)
        var = dispatch("mean", centered * centered, axis=(1, 3), keepdims=True)
        out = dispatch("reshape", centered / dispatch("sqrt", var + self.eps), shape=self.shape)
        if weight is not None:
            out = out * weight
        return out if bias is None else out + bias


def _rms_normalize(xc: np.ndarray, axes: tuple, eps: float) -> tuple:
    """``(xhat, inv_rms)`` of ``xc`` (at least float32), the mean square summed in float64."""
    wide = np.float64 if xc.dtype != np.float64 else None
    ms = np.square(xc).mean(axis=axes, keepdims=True, dtype=wide)
    inv_rms = (1.0 / np.sqrt(ms + eps)).astype(xc.dtype)
    return xc * inv_rms, inv_rms


class RMSNormOp(Op):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the trailing ``ndims`` axes."""

    __slots__ = ("axes", "eps")
    saved_inputs = (1,)
    saves_output = False

    def forward(self, x, weight=None, ndims=1, eps=None):
        compute = accumulation_dtype(x.dtype)
        # PyTorch's default; ml_dtypes' finfo: NumPy's does not know bfloat16
        eps = float(ml_dtypes.finfo(x.dtype).eps) if eps is None else eps
        self.axes, self.eps = tuple(range(x.ndim - ndims, x.ndim)), eps
        xhat, inv_rms = _rms_normalize(x.astype(compute, copy=False), self.axes, eps)
        if not inv_rms.all() and compute != np.float64:
            # a float32 square or mean square overflowed (|x| > ~1.8e19): 1 / inf would zero
            # the output; computed in float64 and rounded once, as the other norms
            xhat, inv_rms = (a.astype(compute) for a in _rms_normalize(
                x.astype(np.float64), self.axes, eps))
        self.saved = (xhat, inv_rms, weight)
        out = xhat if weight is None else xhat * weight
        return out.astype(x.dtype, copy=False)

    def backward(self, g):
        xhat, inv_rms, weight = self.saved
        needs = self.needs_input_grad
        gy = g.astype(xhat.dtype, copy=False)
        gx = gw = None
        if needs[0]:
            gxhat = gy * weight if weight is not None else gy
            mean_gx = (gxhat * xhat).mean(axis=self.axes, keepdims=True)
            gx = (inv_rms * (gxhat - xhat * mean_gx)).astype(g.dtype, copy=False)
        if len(needs) > 1 and needs[1]:
            lead = tuple(range(g.ndim - len(self.axes)))
            gw = (gy * xhat).sum(axis=lead).astype(g.dtype, copy=False)
        return gx, gw

    def composite(self, x, weight=None):
        ms = dispatch("mean", x * x, axis=self.axes, keepdims=True)
        out = x / dispatch("sqrt", ms + self.eps)
        return out if weight is None else out * weight


class GroupNorm(Module):
    """Group normalisation of channels-last input ``(N, ..., C)``: each sample's channels are
    split into ``num_groups`` groups, each normalised over its channels and all positions.

    Args:
        num_groups: groups of channels (must divide ``num_channels``).
        num_channels: channels (the last axis).
        eps: added to the variance.
        affine: learn a per-channel ``weight`` (ones) and ``bias`` (zeros).

    Example:
        >>> import everyo as eo
        >>> eo.GroupNorm(2, 4)(eo.randn(2, 3, 3, 4, seed=0)).shape
        (2, 3, 3, 4)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True):
        super().__init__()
        num_groups = argument("GroupNorm", "num_groups", num_groups, "positive int")
        num_channels = argument("GroupNorm", "num_channels", num_channels, "positive int")
        if num_channels % num_groups:
            raise EveryOError(f"GroupNorm: num_groups ({num_groups}) must be positive and "
                              f"divide num_channels ({num_channels})")
        self.num_groups, self.num_channels = num_groups, num_channels
        self.eps = argument("GroupNorm", "eps", eps, "non-negative float")
        self.affine = bool(affine)
        self.weight = Parameter(np.ones(num_channels, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_channels, np.float32)) if affine else None

    @property
    def label(self) -> str:
        return f"GroupNorm({self.num_groups}, {self.num_channels})"

    def forward(self, x):
        data = check_float(self.label, x)
        if data.ndim < 2 or data.shape[-1] != self.num_channels:
            raise EveryOError(f"{self.label}: expected channels-last input (N, ..., C) with "
                              f"{self.num_channels} channels, got shape {data.shape}")
        params = (self.weight, self.bias) if self.affine else ()
        return dispatch("group_norm", x, *params, groups=self.num_groups, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape`` axes (no
    centering), then a learned per-element scale.

    Args:
        normalized_shape: int or tuple, the trailing shape to normalise over.
        eps: added to the mean square; None means the input dtype's machine epsilon (PyTorch).
        elementwise_affine: learn ``weight`` (ones).

    Example:
        >>> import everyo as eo
        >>> out = eo.RMSNorm(2)(eo.tensor([[3.0, 4.0]]))
        >>> [round(float(v), 4) for v in out.data[0]]
        [0.8485, 1.1314]
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True):
        super().__init__()
        self.normalized_shape = normalized_shape_argument("RMSNorm", normalized_shape)
        self.eps = optional_argument("RMSNorm", "eps", eps, "non-negative float")
        self.weight = (Parameter(np.ones(self.normalized_shape, np.float32))
                       if elementwise_affine else None)

    def forward(self, x):
        label = f"RMSNorm{self.normalized_shape}"
        data = check_float(label, x)
        n = len(self.normalized_shape)
        if data.ndim < n or data.shape[data.ndim - n:] != self.normalized_shape:
            raise EveryOError(f"{label}: expected input ending in {self.normalized_shape}, got "
                              f"shape {data.shape}")
        params = () if self.weight is None else (self.weight,)
        return dispatch("rms_norm", x, *params, ndims=n, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


OPS = {"group_norm": GroupNormOp, "rms_norm": RMSNormOp}
LAYERS = {"GroupNorm": GroupNorm, "RMSNorm": RMSNorm}
