"""The ``grouped_conv2d`` op: ``Conv2D(groups=...)``, depthwise included, on NHWC input.

Two kernels, both loop-free over pixels:

- depthwise (one input channel per group): the ``depthwise_conv2d_forward`` /
  ``depthwise_conv2d_backward`` kernels (``conv_depthwise_kernels``; a provider may replace
  them);
- general groups: the strided window view regrouped to ``(groups, N*Ho*Wo, kh*kw*in/groups)``
  and ONE batched matmul with the weight regrouped to ``(groups, kh*kw*in/groups, out/groups)``.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Op, dispatch
from everyo.kernels import kernel
from everyo_layers.padding import output_size
from everyo_layers.precision import accumulation_dtype
from everyo_layers.windows import pad_hw, window_arguments, window_slices, window_view


def grouped_geometry(op: str, x: np.ndarray, weight: np.ndarray, bias, groups: int, stride,
                     padding, dilation) -> tuple:
    """Validate a grouped convolution's operands; return ``(stride, pads, dilation, out_hw)``."""
    if x.ndim != 4 or weight.ndim != 4 or groups <= 0 or x.shape[3] != weight.shape[2] * groups \
            or weight.shape[3] % groups:
        raise EveryOError(f"{op}: input {x.shape} (NHWC) and weight {weight.shape} "
                          f"(kh, kw, in/groups, out) do not fit groups={groups}")
    kh, kw, _, cout = weight.shape
    if bias is not None and bias.shape != (cout,):
        raise EveryOError(f"{op}: bias of shape {bias.shape} does not fit weight "
                          f"{weight.shape}; expected ({cout},)")
    _, stride, pads, dilation = window_arguments(op, x, (kh, kw), stride, padding, dilation)
    out_hw = (output_size(x.shape[1], kh, stride[0], dilation[0], pads[0]),
              output_size(x.shape[2], kw, stride[1], dilation[1], pads[1]))
    if min(out_hw) <= 0:
        raise EveryOError(f"{op}: a {kh}x{kw} kernel (dilation {dilation}) does not fit "
                          f"input {x.shape} with padding {pads}")
    return stride, pads, dilation, out_hw


class GroupedConv2DOp(Op):
    """2-D cross-correlation of NHWC ``x`` with ``weight`` (kh, kw, in/groups, out) in
    ``groups`` independent channel groups, plus ``bias``; as :class:`Conv2DOp` otherwise."""

    __slots__ = ("stride", "dilation", "pads", "groups", "x_shape", "out_hw", "w_shape", "dtype")
    saved_inputs = (0, 1)  # the (unpadded) input and the weight may be saved as they are
    saves_output = False

    def forward(self, x, weight, bias=None, stride=(1, 1), padding=((0, 0), (0, 0)),
                dilation=(1, 1), groups=1):
        self.stride, self.pads, self.dilation, self.out_hw = grouped_geometry(
            "grouped_conv2d", x, weight, bias, groups, stride, padding, dilation)
        self.groups, self.x_shape, self.w_shape = int(groups), x.shape, weight.shape
        self.dtype = np.result_type(x, weight) if bias is None else np.result_type(x, weight, bias)
        compute = accumulation_dtype(self.dtype)
        xp = pad_hw(x.astype(compute, copy=False), self.pads)
        w = weight.astype(compute, copy=False)
        self.saved = (xp, w)
        if weight.shape[2] == 1:
            out = kernel.depthwise_conv2d_forward(xp, w, self.stride, self.dilation, self.out_hw)
        else:
            out = self._matmul(xp, w)
        if bias is not None:
            out += bias
        return out.astype(self.dtype, copy=False)

    def composite(self, x, weight, bias=None):
        """One ``conv2d`` per group on its channel slice, concatenated."""
        cin_g, cout_g = self.w_shape[2], self.w_shape[3] // self.groups
        outs = []
        for k in range(self.groups):
            part = (x[..., k * cin_g:(k + 1) * cin_g], weight[..., k * cout_g:(k + 1) * cout_g])
            if bias is not None:
                part += (bias[k * cout_g:(k + 1) * cout_g],)
            outs.append(dispatch("conv2d", *part, stride=self.stride, padding=self.pads,
                                 dilation=self.dilation))
        return dispatch("concatenate", *outs, axis=3)

    def _positions(self):
        kh, kw = self.w_shape[:2]
        return [(i, j) for i in range(kh) for j in range(kw)]

    def _columns(self, xp):
        """``(groups, N*Ho*Wo, kh*kw*cin_g)``: the window matrix of every group."""
        kh, kw, cin_g, _ = self.w_shape
        view = window_view(xp, (kh, kw), self.stride, self.dilation, self.out_hw)
        m = view.shape[0] * view.shape[1] * view.shape[2]
        view = view.reshape(m, kh * kw, self.groups, cin_g)
        # NOTE: explicit sizes, never -1: NumPy cannot infer an axis when another one is 0
        # (an empty batch).
        return np.ascontiguousarray(view.transpose(2, 0, 1, 3)).reshape(self.groups, m,
                                                                         kh * kw * cin_g)

    def _grouped_weight(self, w):
        """``(groups, kh*kw*cin_g, cout_g)``."""
        kh, kw, cin_g, cout = w.shape
        w = w.reshape(kh * kw * cin_g, self.groups, cout // self.groups)
        return np.ascontiguousarray(w.transpose(1, 0, 2))

    def _matmul(self, xp, w):
        n = xp.shape[0]
        out = np.matmul(self._columns(xp), self._grouped_weight(w))  # (G, M, cout_g)
        return out.transpose(1, 0, 2).reshape(n, self.out_hw[0], self.out_hw[1], self.w_shape[3])

    def backward(self, g):
        xp, w = self.saved
        needs = self.needs_input_grad
        gc = g.astype(xp.dtype, copy=False)
        gb = kernel.conv_bias_grad(gc.reshape(-1, g.shape[-1])).astype(g.dtype) if (
            len(needs) > 2 and needs[2]) else None
        if self.w_shape[2] == 1:
            gx, gw = kernel.depthwise_conv2d_backward(gc, xp, w, self.stride, self.dilation,
                                                      self.out_hw, needs[0], needs[1])
        else:
            gx, gw = self._matmul_backward(gc, xp, w)
        if gx is not None:
            (top, _), (left, _) = self.pads
            _, h, wd, _ = self.x_shape
            gx = gx[:, top:top + h, left:left + wd, :].astype(g.dtype, copy=False)
        if gw is not None:
            gw = gw.astype(g.dtype, copy=False)
        return gx, gw, gb

    def _matmul_backward(self, g, xp, w):
        needs = self.needs_input_grad
        n, ho, wo, cout = g.shape
        kh, kw, cin_g, _ = self.w_shape
        groups, cout_g = self.groups, cout // self.groups
        # (G, M, cout_g)
        gg = np.ascontiguousarray(g.reshape(-1, groups, cout_g).transpose(1, 0, 2))
        gx = gw = None
        if needs[1]:
            gw_g = np.matmul(self._columns(xp).transpose(0, 2, 1), gg)  # (G, kh*kw*cin_g, cout_g)
            gw = gw_g.reshape(groups, kh * kw * cin_g, cout_g).transpose(1, 0, 2).reshape(
                kh, kw, cin_g, cout)
        if needs[0]:
            # per group: (M, cout_g) @ (cout_g, kh*kw*cin_g) -> every position's input gradient
            wt = self._grouped_weight(w).transpose(0, 2, 1)
            blocks = np.matmul(gg, wt).reshape(groups, n, ho, wo, kh, kw, cin_g)
            blocks = blocks.transpose(4, 5, 1, 2, 3, 0, 6).reshape(kh, kw, n, ho, wo,
                                                                   groups * cin_g)
            gx = np.zeros(xp.shape, xp.dtype)
            for i, j in self._positions():
                gx[window_slices((i, j), self.stride, self.dilation, self.out_hw)] += blocks[i, j]
        return gx, gw


OPS = {"grouped_conv2d": GroupedConv2DOp}
LAYERS: dict = {}

