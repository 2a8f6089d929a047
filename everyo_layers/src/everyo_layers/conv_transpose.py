"""``Conv2DTranspose`` on NHWC input (Keras's layout and output size) and its op.

The transposed convolution is the input-gradient of a convolution. Its forward and both
gradients are kernels (conv_transpose_kernels.py): the NumPy references split the output into
``stride`` phases, each an ordinary stride-1 correlation, all in ONE matmul over one window
matrix; a provider may work per input pixel instead (everyo-numba: every pixel's ``kh*kw``
contributions added into the output, the output gradient's windows for the gradients).
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo.kernels import kernel
from everyo.validation import is_int
from everyo_layers.checks import LayerArgumentError, argument, check_float, pair
from everyo_layers.conv_transpose_kernels import phase_positions, transpose_taps
from everyo_layers.initializers import fan_in_bound, layer_generator, uniform_parameter
from everyo_layers.precision import accumulation_dtype
from everyo_layers.windows import check_geometry


def transpose_output_size(size: int, kernel: int, stride: int, padding,
                          output_padding: int = 0) -> tuple:
    """The output length of a transposed convolution and the crop before it.

    Keras's rules: ``"valid"``: ``size * stride + max(kernel - stride, 0)``; ``"same"``:
    ``size * stride``. The full scatter spans ``(size - 1) * stride + kernel``; ``"same"``
    drops ``max(kernel - stride, 0) // 2`` leading entries (TensorFlow's rule: the gradient of
    a ``"same"`` convolution), missing trailing entries are zeros. An int ``padding`` is
    PyTorch's: ``(size - 1) * stride - 2 * padding + kernel + output_padding``, cropping
    ``padding`` leading entries (``output_padding`` extra trailing entries, zeros plus the
    bias where they pass the scatter).

    Returns:
        ``(output length, leading crop)``.

    Example:
        >>> transpose_output_size(16, 4, 2, "same"), transpose_output_size(3, 3, 2, "valid")
        ((32, 1), (7, 0))
        >>> transpose_output_size(5, 3, 2, 1, output_padding=1)  # PyTorch's (5-1)*2 - 2 + 3 + 1
        (10, 1)
    """
    if padding == "same":
        return size * stride, max(kernel - stride, 0) // 2
    if padding == "valid":
        return size * stride + max(kernel - stride, 0), 0
    return (size - 1) * stride - 2 * padding + kernel + output_padding, padding


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
    full scatter that are dropped.

    Forward and gradients are kernels (conv_transpose_kernels.py: the sub-pixel phases' one
    matmul in the references).
    """

    __slots__ = ("stride", "crop", "out_hw", "x_shape", "w_shape", "taps", "ext_hw")
    saved_inputs = (0, 1)  # (a provider's weight gradient may read x, the input gradient w)
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
        self.taps = taps = transpose_taps(weight.shape, stride)
        q = phase_positions(x.shape, taps)
        self.ext_hw = (max(q[0] * stride[0], crop[0] + out_hw[0]),
                       max(q[1] * stride[1], crop[1] + out_hw[1]))
        dtype = np.result_type(x, weight) if bias is None else np.result_type(x, weight, bias)
        compute = accumulation_dtype(dtype)
        x_c, w_c = x.astype(compute, copy=False), weight.astype(compute, copy=False)
        kept: dict = {}
        out = kernel.conv2d_transpose_forward(x_c, w_c, bias, stride, self.crop, self.out_hw,
                                              kept)
        needs = self.needs_input_grad
        if not needs[1]:
            kept.pop("columns", None)
        self.saved = (x_c if needs[1] else None, w_c if needs[0] else None, kept)
        return out.astype(dtype, copy=False)

    def composite(self, x, weight, bias=None):
        """The same scatter with differentiable ops: one matmul, then per kernel position the
        contributions spread ``stride`` apart (zeros interleaved) and padded into place."""
        n, h, w, cin = self.x_shape
        kh, kw, cout, _ = self.w_shape
        (sh, sw), (fh, fw) = self.stride, self.ext_hw
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

    def backward(self, g):
        x_c, w_c, kept = self.saved
        needs = self.needs_input_grad
        cout = self.w_shape[2]
        compute = accumulation_dtype(g.dtype)
        gx = gw = gb = None
        if needs[1]:  # (first: the reference's regrouped gradient is kept for the input's)
            gw = np.ascontiguousarray(kernel.conv2d_transpose_weight_grad(
                x_c, g, kept, self.w_shape, self.stride, self.crop), dtype=g.dtype)
        if needs[0]:
            gx = np.ascontiguousarray(kernel.conv2d_transpose_input_grad(
                g, w_c.astype(compute, copy=False), kept, self.x_shape, self.stride, self.crop),
                dtype=g.dtype)
        if len(needs) > 2 and needs[2]:
            gb = kernel.conv_bias_grad(g.reshape(-1, cout))  # (16-bit: summed in float32)
        return gx, gw, gb


class Conv2DTranspose(Module):
    """Transposed 2-D convolution over NHWC input (Keras's ``Conv2DTranspose``, and PyTorch's
    ``ConvTranspose2d`` with an integer ``padding``).

    Args:
        in_channels, out_channels: channels of the input and the output.
        kernel_size: int or (kh, kw).
        stride: int or (sh, sw).
        padding: ``"valid"`` (output ``in * stride + max(kernel - stride, 0)``) or ``"same"``
            (output ``in * stride``), Keras's rule; or an int or ``(ph, pw)``, PyTorch's:
            output ``(in - 1) * stride - 2 * padding + kernel + output_padding``.
        output_padding: int or ``(oh, ow)`` extra trailing rows/columns (PyTorch's, each
            smaller than the stride); only with an integer ``padding``.
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
        >>> eo.Conv2DTranspose(8, 4, 3, stride=2, padding=1, output_padding=1)(
        ...     eo.ones(2, 5, 5, 8)).shape
        (2, 10, 10, 4)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1,
                 padding="valid", bias: bool = True, seed=None, output_padding=0):
        super().__init__()
        self.in_channels = argument("Conv2DTranspose", "in_channels", in_channels,
                                    "positive int")
        self.out_channels = argument("Conv2DTranspose", "out_channels", out_channels,
                                     "positive int")
        self.kernel_size, self.stride, _ = check_geometry("Conv2DTranspose", kernel_size, stride)
        self.padding, self.output_padding = _padding_arguments(padding, output_padding,
                                                               self.stride)
        rng = layer_generator(seed)
        kh, kw = self.kernel_size
        # NOTE: PyTorch's ConvTranspose2d computes its fan-in from weight dim 1, i.e. out*kh*kw.
        bound = fan_in_bound(self.out_channels * kh * kw)
        self.weight = uniform_parameter(rng, (kh, kw, self.out_channels, self.in_channels), bound)
        self.bias = uniform_parameter(rng, (self.out_channels,), bound) if bias else None

    @property
    def label(self) -> str:
        return f"Conv2DTranspose({self.in_channels}→{self.out_channels})"

    def output_sizes(self, input_hw) -> list:
        """``[(output length, leading crop)]`` along H and W for an input of ``input_hw``."""
        pads = (self.padding,) * 2 if isinstance(self.padding, str) else self.padding
        return [transpose_output_size(n, k, s, p, o) for n, k, s, p, o in
                zip(input_hw, self.kernel_size, self.stride, pads, self.output_padding)]

    def forward(self, x, output_size=None):
        """``x`` NHWC; ``output_size``: PyTorch's, the ``(H, W)`` (or whole NHWC shape) wanted,
        reached with an output padding chosen for this call (only with an integer
        ``padding``; each size within ``stride - 1`` of the smallest)."""
        data = check_float(self.label, x)
        if data.ndim != 4 or data.shape[-1] != self.in_channels or 0 in data.shape[1:3]:
            raise EveryOError(f"{self.label}: expected NHWC input with {self.in_channels} "
                              f"channels and at least one pixel, got shape {data.shape}")
        sizes = self.output_sizes(data.shape[1:3]) if output_size is None else \
            self._sizes_for(data.shape, output_size)
        if min(s[0] for s in sizes) <= 0:
            raise EveryOError(f"{self.label}: padding {self.padding} leaves no output for input "
                              f"{data.shape[1:3]} (output {tuple(s[0] for s in sizes)})")
        operands = (x, self.weight) if self.bias is None else (x, self.weight, self.bias)
        return dispatch("conv2d_transpose", *operands, stride=self.stride,
                        out_hw=tuple(s[0] for s in sizes), crop=tuple(s[1] for s in sizes))

    def _sizes_for(self, shape: tuple, output_size) -> list:
        """:meth:`output_sizes` with the output padding that gives ``output_size`` (PyTorch's
        ``ConvTranspose2d._output_padding``), or an error naming what does not fit."""
        if isinstance(self.padding, str):
            raise LayerArgumentError(f"{self.label}: output_size needs an integer padding "
                                     f"(PyTorch's output size), not {self.padding!r}")
        wanted = output_size.tolist() if isinstance(output_size, np.ndarray) else output_size
        if not (isinstance(wanted, (tuple, list)) and len(wanted) in (2, 4)
                and all(map(is_int, wanted))):
            raise LayerArgumentError(f"{self.label}: output_size must be (H, W) or an NHWC "
                                     f"shape of ints, got {output_size!r}")
        if len(wanted) == 4:
            if wanted[0] != shape[0] or wanted[3] != self.out_channels:
                raise LayerArgumentError(
                    f"{self.label}: a 4-entry output_size is an NHWC shape (batch "
                    f"{shape[0]}, H, W, {self.out_channels} channels), got {tuple(wanted)}; "
                    f"PyTorch's NCHW sizes put the channels second: pass (H, W)")
            wanted = wanted[1:3]
        smallest = [transpose_output_size(n, k, s, p)[0] for n, k, s, p in
                    zip(shape[1:3], self.kernel_size, self.stride, self.padding)]
        largest = [low + s - 1 for low, s in zip(smallest, self.stride)]
        if any(not low <= int(size) <= high for size, low, high in
               zip(wanted, smallest, largest)):
            raise LayerArgumentError(
                f"{self.label}: output_size {tuple(wanted)} cannot be reached from input "
                f"{tuple(shape[1:3])}: each size must lie between {tuple(smallest)} and "
                f"{tuple(largest)} (PyTorch's rule)")
        return [transpose_output_size(n, k, s, p, int(size) - low) for n, k, s, p, size, low
                in zip(shape[1:3], self.kernel_size, self.stride, self.padding, wanted,
                       smallest)]

    def extra_repr(self) -> str:
        extra = f", output_padding={self.output_padding}" if any(self.output_padding) else ""
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding!r}{extra}")


def _padding_arguments(padding, output_padding, stride) -> tuple:
    """``(padding, output_padding)``: ``"valid"``/``"same"`` or a non-negative int pair, and an
    int pair each smaller than the stride (PyTorch's rule), or a :class:`LayerArgumentError`."""
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise LayerArgumentError(f"Conv2DTranspose: padding must be 'valid', 'same', an int "
                                     f"or a pair of ints, got {padding!r}")
    else:
        padding = pair(padding, "Conv2DTranspose padding")
        if min(padding) < 0:
            raise LayerArgumentError(f"Conv2DTranspose: padding must not be negative, got "
                                     f"{padding}")
    output_padding = pair(output_padding, "Conv2DTranspose output_padding")
    if any(output_padding) and isinstance(padding, str):
        raise LayerArgumentError(f"Conv2DTranspose: output_padding={output_padding} needs an "
                                 f"integer padding (PyTorch's output size), not {padding!r}")
    if any(o < 0 or o >= s for o, s in zip(output_padding, stride)):
        raise LayerArgumentError(f"Conv2DTranspose: output_padding {output_padding} must be "
                                 f"non-negative and smaller than the stride {stride}")
    return padding, output_padding


OPS = {"conv2d_transpose": Conv2DTransposeOp}
LAYERS = {"Conv2DTranspose": Conv2DTranspose}
