"""``PixelShuffle`` / ``PixelUnshuffle`` on channels-last input, in PyTorch's channel order.

``PixelShuffle(r)`` turns ``(N, H, W, C * r * r)`` into ``(N, H * r, W * r, C)``: output
pixel ``(h * r + i, w * r + j)`` of channel ``c`` is input channel ``c * r * r + i * r + j`` at
``(h, w)`` — exactly PyTorch's index on its channel axis. So a convolution ported from
PyTorch (its output channels kept in PyTorch's order, as a weight transpose keeps them) feeds
``PixelShuffle`` and gives PyTorch's image. This is *not* TensorFlow's ``depth_to_space``,
whose channel index is ``(i * r + j) * C + c`` (ONNX's ``DepthToSpace`` calls PyTorch's order
``"CRD"`` and TensorFlow's ``"DCR"``). ``PixelUnshuffle(r)`` is the inverse.

Both are one reshape and one transpose (core ops), so every derivative comes with them.
"""

from __future__ import annotations

from everyo import EveryOError, Module, dispatch
from everyo_layers.checks import argument, check_float


def _check(label: str, x, factor: int, shuffle: bool) -> tuple:
    data = check_float(label, x)
    if data.ndim < 3:
        raise EveryOError(f"{label}: expected channels-last input (..., H, W, C), got shape "
                          f"{data.shape}")
    h, w, c = data.shape[-3:]
    if shuffle and c % (factor * factor):
        raise EveryOError(f"{label}: the {c} channels of input {data.shape} are not divisible "
                          f"by upscale_factor ** 2 = {factor * factor}")
    if not shuffle and (h % factor or w % factor):
        raise EveryOError(f"{label}: height and width of input {data.shape} must be divisible "
                          f"by downscale_factor {factor}")
    return data.shape[:-3], h, w, c


def _leading(lead: tuple) -> tuple:
    """The leading axes of the result: one batch axis as -1 (so a traced export keeps the
    batch size symbolic), none for unbatched input, several as they were."""
    return (-1,) if len(lead) == 1 else lead


class PixelShuffle(Module):
    """``(..., H, W, C * r * r) -> (..., H * r, W * r, C)`` in PyTorch's channel order (see the
    module docstring).

    Example:
        >>> import everyo as eo
        >>> eo.PixelShuffle(2)(eo.ones(1, 3, 4, 8)).shape
        (1, 6, 8, 2)
    """

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = argument("PixelShuffle", "upscale_factor", upscale_factor,
                                       "positive int")

    def forward(self, x):
        r = self.upscale_factor
        lead, h, w, c = _check(f"PixelShuffle({r})", x, r, True)
        out = c // (r * r)
        x = dispatch("reshape", x, shape=(-1, h, w, out, r, r))
        x = dispatch("transpose", x, axes=(0, 1, 4, 2, 5, 3))  # (n, h, i, w, j, c)
        return dispatch("reshape", x, shape=_leading(lead) + (h * r, w * r, out))

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """``(..., H * r, W * r, C) -> (..., H, W, C * r * r)``, the inverse of
    :class:`PixelShuffle`.

    Example:
        >>> import everyo as eo
        >>> eo.PixelUnshuffle(2)(eo.ones(1, 6, 8, 2)).shape
        (1, 3, 4, 8)
    """

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = argument("PixelUnshuffle", "downscale_factor", downscale_factor,
                                         "positive int")

    def forward(self, x):
        r = self.downscale_factor
        lead, h, w, c = _check(f"PixelUnshuffle({r})", x, r, False)
        x = dispatch("reshape", x, shape=(-1, h // r, r, w // r, r, c))
        x = dispatch("transpose", x, axes=(0, 1, 3, 5, 2, 4))  # (n, h, w, c, i, j)
        return dispatch("reshape", x, shape=_leading(lead) + (h // r, w // r, c * r * r))

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


LAYERS = {"PixelShuffle": PixelShuffle, "PixelUnshuffle": PixelUnshuffle}
