"""``Conv2D`` on NHWC input and the ``conv2d`` op: strided windows (im2col) and ONE matmul.

The op's gradients are ops too, so that they can be differentiated again: with one geometry
(stride, padding, dilation, shapes), ``conv2d(x, w)``, its input gradient ``T(g, w)`` and its
weight gradient ``W(x, g)`` are three bilinear maps, each of whose derivatives is one of the
three. They run the fused kernels (no window-by-window graph), which keeps a gradient penalty
on a CNN within a small factor of a first-order step.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo.kernels import (
    HALF_DTYPES,
    blas_matmul,
    check_operand_unchanged,
    gradients_from_parts,
    kernel,
    narrow,
    widen,
)
from everyo_layers.checks import argument, check_float, check_groups
from everyo_layers.conv_rows import (
    padded_rows,
    row_conv,
    row_input_grad,
    row_weight_grad,
    rows_apply,
)
from everyo_layers.initializers import fan_in_bound, layer_generator, uniform_parameter
from everyo_layers.padding import output_size, resolve_padding
from everyo_layers.windows import (
    check_geometry,
    pad_hw_tensor,
    window_arguments,
    window_tensors,
)


class Conv2DOp(Op):
    """2-D cross-correlation of NHWC ``x`` with ``weight`` (kh, kw, in, out), plus ``bias``.

    ``stride``, ``padding`` and ``dilation`` take the forms ``Conv2D`` accepts (the layer
    passes them resolved to pairs and ``((top, bottom), (left, right))``). The windows are
    gathered into one ``(N*Ho*Wo, kh*kw*in)`` matrix and multiplied by the reshaped weight in one
    BLAS call; float16 multiplies (and adds the bias) through float32 BLAS and rounds once, as
    ``matmul`` does.
    """

    precision = "lower"  # BLAS-shaped: float16 is safe, products accumulate in float32
    __slots__ = ("stride", "dilation", "pads", "x_shape", "out_hw", "w_shape", "rows", "row_path")
    saved_inputs = (0, 1)  # (backward never reads the bias)

    def forward(self, x, weight, bias=None, stride=(1, 1), padding=((0, 0), (0, 0)),
                dilation=(1, 1)):
        if x.ndim != 4 or weight.ndim != 4 or x.shape[3] != weight.shape[2]:
            raise EveryOError(f"conv2d: input {x.shape} (NHWC) and weight {weight.shape} "
                              f"(kh, kw, in, out) do not fit")
        kh, kw, cin, cout = weight.shape
        if bias is not None and bias.shape != (cout,):
            raise EveryOError(f"conv2d: bias of shape {bias.shape} does not fit weight "
                              f"{weight.shape}; expected ({cout},)")
        _, stride, padding, dilation = window_arguments("conv2d", x, (kh, kw), stride, padding,
                                                        dilation)
        n, h, w, _ = x.shape
        out_hw = (output_size(h, kh, stride[0], dilation[0], padding[0]),
                  output_size(w, kw, stride[1], dilation[1], padding[1]))
        if min(out_hw) <= 0:
            raise EveryOError(f"conv2d: a {kh}x{kw} kernel (dilation {dilation}) does not fit "
                              f"input {x.shape} with padding {padding}")
        self.stride, self.dilation, self.pads = stride, dilation, padding
        self.x_shape, self.out_hw, self.w_shape = x.shape, out_hw, weight.shape
        w2 = weight.reshape(kh * kw * cin, cout)
        needs = self.needs_input_grad
        self.rows, self.row_path = None, False
        out_dtype = np.result_type(x, weight) if bias is None else np.result_type(x, weight, bias)
        if out_dtype in HALF_DTYPES:
            # NOTE: 16-bit floats have no BLAS: convert the input to float32 *before* gathering
            # the windows (kh*kw times fewer elements to convert than the window matrix), keep
            # the small 16-bit input rather than the window matrix for backward (which
            # regathers it), and round the product, bias included, once.
            cols = self._columns(widen(x))
            out = np.matmul(cols, widen(w2))
            if bias is not None:
                out += widen(bias)
            out = narrow(out, out_dtype)
            self.saved = (x if needs[1] else None, w2 if needs[0] else None)
        elif rows_apply(x, weight, stride, padding):  # (Conv1D's: no window matrix, conv_rows.py)
            rows = padded_rows(x, padding[1], weight.shape, dilation[1])
            out = row_conv(rows, weight, dilation[1], x.shape, out_hw[1])
            out = np.ascontiguousarray(out) if bias is None else out + bias
            self.rows, self.row_path = (rows if needs[1] else None), True
            self.saved = (None, w2 if needs[0] else None)
            return out
        else:
            cols = self._columns(x)
            out = blas_matmul(cols, w2)
            if bias is not None:  # (in place when it keeps the dtype: the same bits, no copy)
                out = np.add(out, bias, out=out) if bias.dtype == out.dtype else out + bias
            self.saved = (cols if needs[1] else None, w2 if needs[0] else None)
        return out.reshape(n, out_hw[0], out_hw[1], cout)

    def _columns(self, x: np.ndarray) -> np.ndarray:
        """The ``(N*Ho*Wo, kh*kw*in)`` window matrix of ``x`` (one gathering copy)."""
        return kernel.conv2d_columns(x, self.w_shape[:2], self.stride, self.dilation,
                                     self.pads, self.out_hw)

    def backward(self, g):
        return gradients_from_parts(self, g)

    def backward_parts(self, g):
        # NOTE: the bias and weight first: with hooks registered (data-parallel training) the
        # engine finalises them before the costlier input gradient is computed. (The bias
        # before the weight, whose part reads the saved input: a hook that writes the bias in
        # place leaves no part of this op stale.)
        cols, w2 = self.saved
        needs = self.needs_input_grad
        g2 = g.reshape(-1, g.shape[-1])
        if len(needs) > 2 and needs[2]:
            yield 2, kernel.conv_bias_grad(g2)
        if needs[1]:
            check_operand_unchanged(self, 0)  # (hooks run on the bias's part may write)
            if self.rows is not None:
                yield 1, row_weight_grad(self.rows, g, self.dilation[1], self.w_shape)
            elif g.dtype in HALF_DTYPES:  # cols holds the 16-bit input: regather it in float32
                yield 1, narrow(np.matmul(self._columns(widen(cols)).T, widen(g2)),
                                g.dtype).reshape(self.w_shape)
            else:
                yield 1, blas_matmul(cols.T, g2).reshape(self.w_shape)
        if needs[0]:
            check_operand_unchanged(self, 1)  # (e.g. an optimizer step in the weight's hook)
            grad = row_input_grad(g, w2.reshape(self.w_shape), self.dilation[1], self.pads[1],
                                  self.x_shape[2]) if self.row_path else None
            yield 0, self._input_grad(g2, w2) if grad is None else grad

    def _input_grad(self, g2: np.ndarray, w2: np.ndarray) -> np.ndarray:
        """The input's gradient (the ``conv2d_input_grad`` kernel, conv_kernels.py)."""
        return kernel.conv2d_input_grad(g2, w2, self.x_shape, self.w_shape, self.stride,
                                        self.dilation, self.pads, self.out_hw)

    def backward_graph(self, g, out):
        """The differentiable gradients: one Tensor (or None) per operand."""
        x, w = self.parents[:2]
        needs = self.needs_input_grad
        gx = Conv2DInputGradOp.apply(g, w, conv=self) if needs[0] else None
        gw = Conv2DWeightGradOp.apply(x, g, conv=self) if needs[1] else None
        gb = dispatch("sum", g, axis=(0, 1, 2)) if len(needs) > 2 and needs[2] else None
        return gx, gw, gb

    def composite(self, x, weight, bias=None):
        """The same convolution with differentiable core ops (for second derivatives)."""
        kh, kw, cin, cout = self.w_shape
        n, (ho, wo) = self.x_shape[0], self.out_hw
        columns = window_tensors(pad_hw_tensor(x, self.pads, 0.0), (kh, kw), self.stride,
                                 self.dilation, self.out_hw)
        columns = dispatch("stack", *columns, axis=3).reshape(n * ho * wo, kh * kw * cin)
        operands = (columns, weight.reshape(kh * kw * cin, cout))
        out = dispatch("matmul", *(operands if bias is None else operands + (bias,)))
        return out.reshape(n, ho, wo, cout)


# -- the gradients as ops (their own derivatives are the other two maps) ----------------------

def _convolve(conv: Conv2DOp, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    kh, kw, cin, cout = conv.w_shape
    n, (ho, wo) = x.shape[0], conv.out_hw
    return (conv._columns(x) @ w.reshape(kh * kw * cin, cout)).reshape(n, ho, wo, cout)


def _input_grad(conv: Conv2DOp, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    kh, kw, cin, cout = conv.w_shape
    return conv._input_grad(g.reshape(-1, cout), w.reshape(kh * kw * cin, cout))


def _columns(conv: Conv2DOp, x: np.ndarray) -> np.ndarray:
    """The window matrix of ``x``; the one the conv op kept for its own backward when ``x`` is
    that op's input (gathering it is a large share of a convolution's cost)."""
    saved = conv.saved
    if (type(saved) is tuple and saved[0] is not None and conv.parents is not None
            and x is conv.parents[0].data and saved[0].dtype == x.dtype
            and saved[0].ndim == 2):
        return saved[0]
    return conv._columns(x)


def _weight_grad(conv: Conv2DOp, x: np.ndarray, g: np.ndarray, columns=None) -> np.ndarray:
    columns = _columns(conv, x) if columns is None else columns
    return (columns.T @ g.reshape(-1, g.shape[-1])).reshape(conv.w_shape)


def _conv2d_like(conv: Conv2DOp, x, w):
    """``conv2d(x, w)`` (Tensors) with the geometry of the recorded conv2d op ``conv``."""
    return dispatch("conv2d", x, w, stride=conv.stride, padding=conv.pads,
                    dilation=conv.dilation)


class Conv2DInputGradOp(Op):
    """``T(g, w)``: the input gradient of the convolution ``conv`` (a transposed convolution)."""

    __slots__ = ("conv",)
    name = "conv2d_input_grad"
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, g, w, conv):
        self.conv, self.saved = conv, (g, w)
        return _input_grad(conv, g, w)

    def backward(self, h):
        g, w = self.saved
        need_g, need_w = self.needs_input_grad
        return (_convolve(self.conv, h, w) if need_g else None,
                _weight_grad(self.conv, h, g) if need_w else None)

    def backward_graph(self, h, out):
        g, w = self.parents
        need_g, need_w = self.needs_input_grad
        return (_conv2d_like(self.conv, h, w) if need_g else None,
                Conv2DWeightGradOp.apply(h, g, conv=self.conv) if need_w else None)


class Conv2DWeightGradOp(Op):
    """``W(x, g)``: the weight gradient of the convolution ``conv``."""

    __slots__ = ("conv",)
    name = "conv2d_weight_grad"
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, x, g, conv):
        columns = _columns(conv, x)
        self.conv, self.saved = conv, (x, g, columns)
        return _weight_grad(conv, x, g, columns)

    def backward(self, h):
        x, g, columns = self.saved
        need_x, need_g = self.needs_input_grad
        kh, kw, cin, cout = self.conv.w_shape
        n, (ho, wo) = x.shape[0], self.conv.out_hw
        return (_input_grad(self.conv, g, h) if need_x else None,
                (columns @ h.reshape(kh * kw * cin, cout)).reshape(n, ho, wo, cout)
                if need_g else None)

    def backward_graph(self, h, out):
        x, g = self.parents
        need_x, need_g = self.needs_input_grad
        return (Conv2DInputGradOp.apply(g, h, conv=self.conv) if need_x else None,
                _conv2d_like(self.conv, x, h) if need_g else None)


class Conv2D(Module):
    """2-D convolution over NHWC input (channels last, as Keras).

    Args:
        in_channels, out_channels: channels of the input and the output.
        kernel_size: int or (kh, kw).
        stride: int or (sh, sw).
        padding: ``"valid"``, ``"same"`` (TensorFlow's rule: output ``ceil(in/stride)``, the odd
            extra pad on the bottom/right), an int, ``(ph, pw)`` or
            ``((top, bottom), (left, right))``.
        dilation: int or (dh, dw); "same" padding accounts for the dilated kernel's extent.
        groups: split the channels into ``groups`` independent convolutions (both channel counts
            must be divisible by it); ``groups=in_channels`` is a depthwise convolution.
        bias: learn an additive bias per output channel.
        seed: seed of the initialisation (PyTorch's: U(+-1/sqrt(in/groups*kh*kw))).

    Attributes:
        weight: Parameter of shape ``(kh, kw, in_channels // groups, out_channels)``.
        bias: Parameter of shape ``(out_channels,)`` or None.

    Example:
        >>> import everyo as eo
        >>> conv = eo.Conv2D(3, 8, 3, padding="same", seed=0)
        >>> conv(eo.ones(2, 5, 5, 3)).shape, conv.weight.shape
        ((2, 5, 5, 8), (3, 3, 3, 8))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1,
                 padding="valid", dilation=1, groups: int = 1, bias: bool = True, seed=None):
        super().__init__()
        self.in_channels = argument("Conv2D", "in_channels", in_channels, "positive int")
        self.out_channels = argument("Conv2D", "out_channels", out_channels, "positive int")
        self.kernel_size, self.stride, self.dilation = check_geometry(
            "Conv2D", kernel_size, stride, dilation)
        self.groups = check_groups("Conv2D", groups, self.in_channels, self.out_channels)
        resolve_padding(padding, (1, 1), self.kernel_size)  # validate the form early
        self.padding = padding
        rng = layer_generator(seed)
        kh, kw = self.kernel_size
        per_group = self.in_channels // self.groups
        bound = fan_in_bound(per_group * kh * kw)
        self.weight = uniform_parameter(rng, (kh, kw, per_group, self.out_channels), bound)
        self.bias = uniform_parameter(rng, (self.out_channels,), bound) if bias else None

    @property
    def label(self) -> str:
        return f"Conv2D({self.in_channels}→{self.out_channels})"

    def forward(self, x):
        data = check_float(self.label, x)
        if data.ndim != 4 or data.shape[-1] != self.in_channels:
            hint = (" — is this NCHW?" if data.ndim == 4 and data.shape[1] == self.in_channels
                    else "")
            raise EveryOError(f"{self.label}: expected NHWC input with {self.in_channels} "
                              f"channels, got shape {data.shape}{hint}")
        pads = resolve_padding(self.padding, data.shape[1:3], self.kernel_size, self.stride,
                               self.dilation)
        operands = (x, self.weight) if self.bias is None else (x, self.weight, self.bias)
        if self.groups > 1:
            return dispatch("grouped_conv2d", *operands, stride=self.stride, padding=pads,
                            dilation=self.dilation, groups=self.groups)
        return dispatch("conv2d", *operands, stride=self.stride, padding=pads,
                        dilation=self.dilation)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding!r}, dilation={self.dilation}, "
                f"groups={self.groups}")


OPS = {"conv2d": Conv2DOp}
LAYERS = {"Conv2D": Conv2D}
