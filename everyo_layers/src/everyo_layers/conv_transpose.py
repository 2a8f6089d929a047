"""``Conv2DTranspose`` on NHWC input (Keras's layout and output size) and its op.

The transposed convolution is the input-gradient of a convolution: ONE matmul turns every input
pixel into its ``kh*kw`` output contributions, which are added into the output one kernel
position at a time (a strided slice of the whole batch each, never a loop over pixels).
Its backward is the ordinary convolution: a strided window view and one matmul.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo_layers.checks import check_float
from everyo_layers.initializers import fan_in_bound, uniform_parameter
from everyo_layers.precision import accumulation_dtype
from everyo_layers.windows import check_geometry, window_slices, window_view


def transpose_output_size(size: int, kernel: int, stride: int, padding: str) -> tuple:
    """Keras's output length of a transposed convolution and the crop before it.

    ``"valid"``: ``size * stride + max(kernel - stride, 0)``; ``"same"``: ``size * stride``.
    The full scatter spans ``(size - 1) * stride + kernel``; ``"same"`` drops
    ``max(kernel - stride, 0) // 2`` leading entries (TensorFlow's rule: the gradient of a
    ``"same"`` convolution), missing trailing entries are zeros.

    Returns:
        ``(output length, leading crop)``.

    Example:
        >>> transpose_output_size(16, 4, 2, "same"), transpose_output_size(3, 3, 2, "valid")
        ((32, 1), (7, 0))
    """
    if padding == "same":
        return size * stride, max(kernel - stride, 0) // 2
    return size * stride + max(kernel - stride, 0), 0


def _spread(x, sh: int, sw: int):
    """NHWC ``x`` with ``sh - 1`` zero rows / ``sw - 1`` zero columns between its entries."""
    n, h, w, c = x.shape
    if sh > 1:
        x = dispatch("stack", x, *[x * 0.0] * (sh - 1), axis=2)
        x = dispatch("reshape", x, shape=(n, h * sh, w, c))[:, :(h - 1) * sh + 1]
        h = (h - 1) * sh + 1
    if sw > 1:
        x = dispatch("stack", x, *[x * 0.0] * (sw - 1), axis=3)
        x = dispatch("reshape", x, shape=(n, h, w * sw, c))[:, :, :(w - 1) * sw + 1]
    return x


class Conv2DTransposeOp(Op):
    """Transposed 2-D convolution of NHWC ``x`` with ``weight`` (kh, kw, out, in), plus
    ``bias``; ``out_hw`` is the output size and ``crop`` the leading (top, left) entries of the
    full scatter that are dropped."""

    __slots__ = ("stride", "crop", "out_hw", "x_shape", "w_shape", "full_hw")
    saved_inputs = (0,)  # the input (a reshaped view); the weight is saved as a copy
    saves_output = False

    def forward(self, x, weight, bias=None, stride=(1, 1), out_hw=None, crop=(0, 0)):
        if x.ndim != 4 or weight.ndim != 4 or x.shape[3] != weight.shape[3]:
            raise EveryOError(f"conv2d_transpose: input {x.shape} (NHWC) and weight "
                              f"{weight.shape} (kh, kw, out, in) do not fit")
        kh, kw, cout, cin = weight.shape
        if bias is not None and bias.shape != (cout,):
            raise EveryOError(f"conv2d_transpose: bias of shape {bias.shape} does not fit "
                              f"weight {weight.shape}; expected ({cout},)")
        n, h, w, _ = x.shape
        _, stride, _ = check_geometry("conv2d_transpose", (kh, kw), stride)
        if out_hw is None:
            out_hw = ((h - 1) * stride[0] + kh, (w - 1) * stride[1] + kw)
        self.stride, self.crop, self.out_hw = stride, tuple(crop), tuple(out_hw)
        self.x_shape, self.w_shape = x.shape, weight.shape
        # the scatter's extent, large enough for the crop plus the output
        self.full_hw = (max((h - 1) * stride[0] + kh, crop[0] + out_hw[0]),
                        max((w - 1) * stride[1] + kw, crop[1] + out_hw[1]))
        dtype = np.result_type(x, weight) if bias is None else np.result_type(x, weight, bias)
        compute = accumulation_dtype(dtype)
        x2 = x.reshape(-1, cin).astype(compute, copy=False)
        w2 = self._weight_matrix(weight.astype(compute, copy=False))
        cols = np.matmul(x2, w2).reshape(n, h, w, kh, kw, cout)
        full = np.zeros((n,) + self.full_hw + (cout,), compute)
        for i in range(kh):
            for j in range(kw):
                full[window_slices((i, j), stride, (1, 1), (h, w))] += cols[:, :, :, i, j, :]
        out = full[:, crop[0]:crop[0] + out_hw[0], crop[1]:crop[1] + out_hw[1], :]
        if bias is not None:
            out = out + bias
        needs = self.needs_input_grad
        self.saved = (x2 if needs[1] else None, w2 if needs[0] else None)
        return np.ascontiguousarray(out, dtype=dtype)

    def composite(self, x, weight, bias=None):
        """The same scatter with differentiable ops: one matmul, then per kernel position the
        contributions spread ``stride`` apart (zeros interleaved) and padded into place."""
        n, h, w, cin = self.x_shape
        kh, kw, cout, _ = self.w_shape
        (sh, sw), (fh, fw) = self.stride, self.full_hw
        w2 = dispatch("reshape", dispatch("transpose", weight, axes=(3, 0, 1, 2)),
                      shape=(cin, kh * kw * cout))
        cols = dispatch("reshape", dispatch("matmul", dispatch("reshape", x, shape=(-1, cin)),
                                            w2), shape=(n, h, w, kh, kw, cout))
        full = None
        for i in range(kh):
            for j in range(kw):
                piece = _spread(cols[:, :, :, i, j, :], sh, sw)
                ph, pw = piece.shape[1:3]
                piece = dispatch("pad", piece, pad_width=((0, 0), (i, fh - i - ph),
                                                          (j, fw - j - pw), (0, 0)))
                full = piece if full is None else full + piece
        (top, left), (ho, wo) = self.crop, self.out_hw
        out = full[:, top:top + ho, left:left + wo, :]
        return out if bias is None else out + bias

    @staticmethod
    def _weight_matrix(weight: np.ndarray) -> np.ndarray:
        """``(in, kh*kw*out)``: each input channel's contributions at every kernel position."""
        kh, kw, cout, cin = weight.shape
        return np.ascontiguousarray(weight.transpose(3, 0, 1, 2)).reshape(cin, kh * kw * cout)

    def backward(self, g):
        x2, w2 = self.saved
        needs = self.needs_input_grad
        n, h, w, cin = self.x_shape
        kh, kw, cout, _ = self.w_shape
        compute = accumulation_dtype(g.dtype)
        gfull = np.zeros((n,) + self.full_hw + (cout,), compute)
        (top, left), (ho, wo) = self.crop, self.out_hw
        gfull[:, top:top + ho, left:left + wo, :] = g
        # every input pixel's kh*kw output contributions, gathered as one window matrix
        gcols = window_view(gfull, (kh, kw), self.stride, (1, 1), (h, w)).reshape(-1, kh * kw * cout)
        gx = gw = gb = None
        if needs[0]:
            gx = np.matmul(gcols, w2.T).reshape(self.x_shape).astype(g.dtype, copy=False)
        if needs[1]:
            gw = np.matmul(x2.T, gcols).reshape(cin, kh, kw, cout).transpose(1, 2, 3, 0)
            gw = np.ascontiguousarray(gw, dtype=g.dtype)
        if len(needs) > 2 and needs[2]:
            gb = g.reshape(-1, cout).sum(axis=0, dtype=compute).astype(g.dtype)
        return gx, gw, gb


class Conv2DTranspose(Module):
    """Transposed 2-D convolution over NHWC input (Keras's ``Conv2DTranspose``).

    Args:
        in_channels, out_channels: channels of the input and the output.
        kernel_size: int or (kh, kw).
        stride: int or (sh, sw).
        padding: ``"valid"`` (output ``in * stride + max(kernel - stride, 0)``) or ``"same"``
            (output ``in * stride``), Keras's rule.
        bias: learn an additive bias per output channel.
        seed: seed of the initialisation (PyTorch's: U(+-1/sqrt(out*kh*kw))).

    Attributes:
        weight: Parameter of shape ``(kh, kw, out_channels, in_channels)`` (Keras's layout;
            PyTorch's ``ConvTranspose2d.weight`` is ``weight.transpose(3, 2, 0, 1)``).
        bias: Parameter of shape ``(out_channels,)`` or None.

    Example:
        >>> import everyo as eo
        >>> up = eo.Conv2DTranspose(8, 4, 4, stride=2, padding="same", seed=0)
        >>> up(eo.ones(2, 5, 5, 8)).shape, up.weight.shape
        ((2, 10, 10, 4), (4, 4, 4, 8))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1,
                 padding: str = "valid", bias: bool = True, seed=None):
        super().__init__()
        if in_channels <= 0 or out_channels <= 0:
            raise EveryOError(f"Conv2DTranspose: channels must be positive, got {in_channels} "
                              f"and {out_channels}")
        if padding not in ("valid", "same"):
            raise EveryOError(f"Conv2DTranspose: padding must be 'valid' or 'same', got "
                              f"{padding!r}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride, _ = check_geometry("Conv2DTranspose", kernel_size, stride)
        self.padding = padding
        rng = np.random.default_rng(seed)
        kh, kw = self.kernel_size
        # NOTE: PyTorch's ConvTranspose2d computes its fan-in from weight dim 1, i.e. out*kh*kw.
        bound = fan_in_bound(self.out_channels * kh * kw)
        self.weight = uniform_parameter(rng, (kh, kw, self.out_channels, self.in_channels), bound)
        self.bias = uniform_parameter(rng, (self.out_channels,), bound) if bias else None

    @property
    def label(self) -> str:
        return f"Conv2DTranspose({self.in_channels}→{self.out_channels})"

    def forward(self, x):
        data = check_float(self.label, x)
        if data.ndim != 4 or data.shape[-1] != self.in_channels:
            raise EveryOError(f"{self.label}: expected NHWC input with {self.in_channels} "
                              f"channels, got shape {data.shape}")
        sizes = [transpose_output_size(n, k, s, self.padding) for n, k, s in
                 zip(data.shape[1:3], self.kernel_size, self.stride)]
        operands = (x, self.weight) if self.bias is None else (x, self.weight, self.bias)
        return dispatch("conv2d_transpose", *operands, stride=self.stride,
                        out_hw=tuple(s[0] for s in sizes), crop=tuple(s[1] for s in sizes))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding!r}")


OPS = {"conv2d_transpose": Conv2DTransposeOp}
LAYERS = {"Conv2DTranspose": Conv2DTranspose}
