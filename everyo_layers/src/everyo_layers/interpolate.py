"""``eo.interpolate`` and ``Upsample``: PyTorch's ``F.interpolate`` / ``nn.Upsample`` on NHWC
input, modes ``"nearest"`` and ``"bilinear"`` (with ``align_corners``), by ``size`` or
``scale_factor``.

Both are the separable resampling of :mod:`everyo_layers.resample`: one ``resample2d`` op
with an interpolation matrix per axis, so gradients of every order and the ONNX export come
with that op. PyTorch's rules: the output size is ``floor(in * scale_factor)``; the source
coordinate uses ``1 / scale_factor`` when a scale factor is given (not ``in / out``, which can
differ for a non-integer factor) unless ``recompute_scale_factor=True``; ``align_corners``
is for ``"bilinear"`` only.
"""

from __future__ import annotations

import math
import numbers

from everyo import EveryOError, Module, dispatch
from everyo_layers.checks import LayerArgumentError
from everyo_layers.resample import _check_nhwc, bilinear_matrix, nearest_matrix

MODES = ("nearest", "bilinear")


def _pair_of(owner: str, name: str, value, kind) -> tuple:
    values = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(values) != 2 or not all(isinstance(v, kind) and not isinstance(v, bool)
                                   for v in values):
        what = "an int" if kind is numbers.Integral else "a number"
        raise LayerArgumentError(f"{owner}: {name} must be {what} or a pair of them (H, W), "
                                 f"got {value!r}")
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise LayerArgumentError(f"{owner}: {name} must be positive, got {value!r}")
    return values


def _check_arguments(owner: str, size, scale_factor, mode: str, align_corners) -> None:
    """Every argument's type and range, then their combination, naming ``owner``."""
    if size is not None:
        _pair_of(owner, "size", size, numbers.Integral)
    if scale_factor is not None:
        _pair_of(owner, "scale_factor", scale_factor, numbers.Real)
    if (size is None) == (scale_factor is None):
        raise LayerArgumentError(f"{owner}: give exactly one of size and scale_factor, got "
                                 f"size={size!r}, scale_factor={scale_factor!r}")
    if mode not in MODES:
        raise LayerArgumentError(f"{owner}: mode must be one of {MODES}, got {mode!r}")
    if align_corners is not None and mode != "bilinear":
        raise LayerArgumentError(f"{owner}: align_corners is for mode='bilinear' only "
                                 f"(PyTorch's rule), got mode={mode!r}")


def resize_plan(input_hw, size=None, scale_factor=None, recompute_scale_factor=None) -> list:
    """``[(output length, source scale or None)]`` along H and W (``None``: ``in / out``), for
    arguments :func:`_check_arguments` accepted."""
    if size is not None:
        return [(int(n), None) for n in _pair_of("interpolate", "size", size, numbers.Integral)]
    factors = _pair_of("interpolate", "scale_factor", scale_factor, numbers.Real)
    plan = [(math.floor(n * float(f)), None if recompute_scale_factor else 1.0 / float(f))
            for n, f in zip(input_hw, factors)]
    if min(out for out, _ in plan) <= 0:
        raise EveryOError(f"interpolate: scale_factor {scale_factor!r} leaves no pixel of input "
                          f"{tuple(input_hw)}")
    return plan


def interpolate(input, size=None, scale_factor=None, mode: str = "nearest",
                align_corners=None, recompute_scale_factor=None):
    """Resize NHWC ``input`` (PyTorch's ``F.interpolate``, channels last).

    Args:
        input: ``(N, H, W, C)``.
        size: output ``(H, W)`` (or one int for both).
        scale_factor: a number or ``(sh, sw)``: the output is ``floor(in * scale_factor)``.
        mode: ``"nearest"`` or ``"bilinear"``.
        align_corners: ``"bilinear"`` only: map the corner pixels onto each other (False, the
            default, uses half-pixel centres).
        recompute_scale_factor: with ``scale_factor``, compute the source coordinates from
            the sizes (``in / out``) instead of ``1 / scale_factor``.

    Example:
        >>> import everyo as eo
        >>> eo.interpolate(eo.ones(1, 3, 4, 2), scale_factor=2, mode="bilinear").shape
        (1, 6, 8, 2)
        >>> eo.interpolate(eo.ones(1, 3, 4, 2), size=(5, 5), align_corners=True,
        ...                mode="bilinear").shape
        (1, 5, 5, 2)
    """
    _check_arguments("interpolate", size, scale_factor, mode, align_corners)
    data = _check_nhwc("interpolate", input)
    plan = resize_plan(data.shape[1:3], size, scale_factor, recompute_scale_factor)
    if mode == "nearest":
        rows, cols = (nearest_matrix(n, out, scale) for n, (out, scale) in
                      zip(data.shape[1:3], plan))
    else:
        rows, cols = (bilinear_matrix(n, out, scale, bool(align_corners)) for n, (out, scale) in
                      zip(data.shape[1:3], plan))
    return dispatch("resample2d", input, rows=rows, cols=cols)


class Upsample(Module):
    """PyTorch's ``nn.Upsample`` on NHWC input: :func:`interpolate` with fixed arguments.

    Example:
        >>> import everyo as eo
        >>> eo.Upsample(scale_factor=2, mode="nearest")(eo.ones(1, 3, 4, 2)).shape
        (1, 6, 8, 2)
    """

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        _check_arguments("Upsample", size, scale_factor, mode, align_corners)
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, x):
        return interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                           self.recompute_scale_factor)

    def extra_repr(self) -> str:
        given = (f"size={self.size!r}" if self.size is not None
                 else f"scale_factor={self.scale_factor!r}")
        return f"{given}, mode={self.mode!r}"


LAYERS = {"interpolate": interpolate, "Upsample": Upsample}
