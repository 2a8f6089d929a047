"""The transposed convolution's forward and weight gradient as kernels, with the sub-pixel
(phase) formulation as their NumPy references.

Phases: output row ``y = stride * q + p`` only meets kernel rows ``p, p + stride, ...``, so
every phase ``p`` is an ordinary stride-1 correlation of the input with a ``ceil(k / stride)``
-tap slice of the kernel. All phases share one window matrix of the input (``kept
["columns"]``, which the weight gradient reuses) and run as ONE matmul whose columns are
(phase, output channel); the result interleaves into the output in one pass. The weight
and input gradients are the same matmul transposed, on the output gradient regrouped by phase
(the input's then added back from its ``ceil(k / stride)**2`` window positions).

Non-finite operands: the phases multiply the taps a phase lacks (zeros) too, and ``inf * 0``
is NaN, so an infinite input (or output gradient) would turn outputs that never meet it into
NaN. A result with a NaN in it is therefore recomputed tap by tap (:func:`_scatter_forward`,
:func:`_scatter_input_grad`: only the real products, as PyTorch's col2im), so NaN appears
exactly where the sums themselves give it; a finite result is the same either way.

A provider may compute the same sums another way (everyo-numba: one GEMM per group of images
into every pixel's ``kh*kw`` contributions, added into the output while in cache): it need not
fill ``kept``; the references then gather what they need themselves.
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import Kernel, kernel


def transpose_taps(w_shape: tuple, stride: tuple) -> tuple:
    """Kernel taps per phase along H and W: ``ceil(k / stride)``."""
    return -(-w_shape[0] // stride[0]), -(-w_shape[1] // stride[1])


def phase_positions(x_shape: tuple, taps: tuple) -> tuple:
    """Positions per phase along H and W (the input plus ``taps - 1`` either side)."""
    return x_shape[1] + taps[0] - 1, x_shape[2] + taps[1] - 1


def _tap_index(taps: tuple, stride: tuple) -> list:
    """Kernel row/column met by window position t in phase p: ``s * (A - 1 - t) + p``."""
    return [s * (a - 1 - np.arange(a))[:, None] + np.arange(s)[None, :]
            for a, s in zip(taps, stride)]


def phase_weight(weight: np.ndarray, stride: tuple) -> np.ndarray:
    """``(A_h*A_w*in, s_h*s_w*out)``: per window position the kernel taps of every phase
    (zero where a phase has fewer taps)."""
    kh, kw, cout, cin = weight.shape
    (ah, aw), (sh, sw) = transpose_taps(weight.shape, stride), stride
    padded = np.zeros((ah * sh, aw * sw, cout, cin), weight.dtype)
    padded[:kh, :kw] = weight
    rows, cols = _tap_index((ah, aw), stride)
    sub = padded[rows[:, :, None, None], cols[None, None, :, :]]  # (ah, sh, aw, sw, o, i)
    return np.ascontiguousarray(sub.transpose(0, 2, 5, 1, 3, 4)).reshape(
        ah * aw * cin, sh * sw * cout)


def _phase_weight_grad(g_sub: np.ndarray, w_shape: tuple, stride: tuple) -> np.ndarray:
    """The inverse regrouping of :func:`phase_weight` (each tap appears once)."""
    kh, kw, cout, cin = w_shape
    (ah, aw), (sh, sw) = transpose_taps(w_shape, stride), stride
    sub = g_sub.reshape(ah, aw, cin, sh, sw, cout).transpose(0, 3, 1, 4, 5, 2)
    padded = np.empty((ah * sh, aw * sw, cout, cin), g_sub.dtype)
    rows, cols = _tap_index((ah, aw), stride)
    padded[rows[:, :, None, None], cols[None, None, :, :]] = sub
    return padded[:kh, :kw]


def phase_columns(x: np.ndarray, w_shape: tuple, stride: tuple) -> np.ndarray:
    """The phases' shared window matrix of ``x``: ``(N*qh*qw, A_h*A_w*in)``."""
    taps = transpose_taps(w_shape, stride)
    return kernel.conv2d_columns(x, taps, (1, 1), (1, 1),
                                 ((taps[0] - 1,) * 2, (taps[1] - 1,) * 2),
                                 phase_positions(x.shape, taps))


def phase_rows(kept: dict, g: np.ndarray, x_shape: tuple, w_shape: tuple, stride: tuple,
               crop: tuple, dtype) -> np.ndarray:
    """The output gradient regrouped by phase (``kept["g_rows"]``, made once per backward)."""
    if kept.get("g_rows") is None:
        q = phase_positions(x_shape, transpose_taps(w_shape, stride))
        kept["g_rows"] = kernel.conv2d_transpose_phase_rows(g, stride, crop, q, dtype)
    return kept["g_rows"]


def conv2d_transpose_forward(x: np.ndarray, weight: np.ndarray, bias, stride: tuple,
                             crop: tuple, out_hw: tuple, kept: dict) -> np.ndarray:
    """The transposed convolution of NHWC ``x`` with ``weight`` (kh, kw, out, in), cropped by
    ``crop`` to ``out_hw``, plus ``bias``: the phases' one matmul, interleaved."""
    n, width = x.shape[0], stride[0] * stride[1] * weight.shape[2]
    q = phase_positions(x.shape, transpose_taps(weight.shape, stride))
    kept["columns"] = columns = phase_columns(x, weight.shape, stride)
    phases = np.matmul(columns, phase_weight(weight, stride)).reshape(n, q[0], q[1], width)
    out = kernel.conv2d_transpose_interleave(phases, stride, crop, out_hw, bias)
    if _has_nan(out):
        return _scatter_forward(x, weight, bias, stride, crop, out_hw)
    return out


def _has_nan(result: np.ndarray) -> bool:
    """Whether ``result`` may hold a NaN: its sum is NaN (one pass; infinities of both signs,
    or an overflowing sum, also send it to the recheck, which is then merely redundant)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.isnan(np.add.reduce(result, axis=None)))


def _tap_views(full: np.ndarray, a: int, b: int, hw: tuple, stride: tuple) -> np.ndarray:
    """The output positions kernel tap ``(a, b)`` reaches from every input pixel."""
    return full[:, a:a + (hw[0] - 1) * stride[0] + 1:stride[0],
                b:b + (hw[1] - 1) * stride[1] + 1:stride[1]]


def _scatter_forward(x, weight, bias, stride, crop, out_hw):
    """The forward tap by tap: only real products, added in tap order, then the bias."""
    n, h, w, _ = x.shape
    kh, kw, cout, _ = weight.shape
    (top, left), (ho, wo) = crop, out_hw
    full = np.zeros((n, max((h - 1) * stride[0] + kh, top + ho),
                     max((w - 1) * stride[1] + kw, left + wo), cout), x.dtype.newbyteorder("="))
    for a in range(kh):
        for b in range(kw):
            _tap_views(full, a, b, (h, w), stride)[...] += np.matmul(x, weight[a, b].T)
    out = np.ascontiguousarray(full[:, top:top + ho, left:left + wo])
    if bias is not None:
        out += bias
    return out


def conv2d_transpose_weight_grad(x: np.ndarray, g: np.ndarray, kept: dict, w_shape: tuple,
                                 stride: tuple, crop: tuple) -> np.ndarray:
    """The weight's gradient (kh, kw, out, in) in x's dtype (native byte order), given the
    output gradient ``g`` (any floating dtype that converts exactly to x's)."""
    columns = kept.get("columns")
    if columns is None:
        columns = phase_columns(x, w_shape, stride)
    g_rows = phase_rows(kept, g, x.shape, w_shape, stride, crop, x.dtype.newbyteorder("="))
    return _phase_weight_grad(np.matmul(columns.T, g_rows), w_shape, stride)


def conv2d_transpose_input_grad(g: np.ndarray, weight: np.ndarray, kept: dict, x_shape: tuple,
                                stride: tuple, crop: tuple) -> np.ndarray:
    """The input's gradient ``x_shape`` (N, H, W, in) in the weight's dtype, given the output
    gradient ``g``: the phases' matmul transposed, then a ``ceil(k / stride)**2``-position
    col2im (may be a view of a larger array)."""
    n, h, w, cin = x_shape
    ah, aw = taps = transpose_taps(weight.shape, stride)
    q = phase_positions(x_shape, taps)
    compute = weight.dtype.newbyteorder("=")
    g_rows = phase_rows(kept, g, x_shape, weight.shape, stride, crop, compute)
    blocks = np.matmul(g_rows, phase_weight(weight.astype(compute, copy=False), stride).T)
    blocks = blocks.reshape(n, q[0], q[1], ah, aw, cin)
    padded = np.zeros((n, h + 2 * (ah - 1), w + 2 * (aw - 1), cin), compute)
    for i in range(ah):
        for j in range(aw):
            padded[:, i:i + q[0], j:j + q[1]] += blocks[:, :, :, i, j]
    grad = padded[:, ah - 1:ah - 1 + h, aw - 1:aw - 1 + w]
    if _has_nan(grad):
        return _scatter_input_grad(g, weight.astype(compute, copy=False), x_shape, stride, crop)
    return grad


def _scatter_input_grad(g, weight, x_shape, stride, crop):
    """The input gradient tap by tap: the output gradient placed in the full scatter's frame
    (zeros where the crop dropped outputs), each tap's positions times that tap, in tap
    order."""
    n, h, w, cin = x_shape
    kh, kw, cout, _ = weight.shape
    top, left = crop
    full_h, full_w = (h - 1) * stride[0] + kh, (w - 1) * stride[1] + kw
    full = np.zeros((n, full_h, full_w, cout), weight.dtype)
    kept = g[:, :max(full_h - top, 0), :max(full_w - left, 0)]
    full[:, top:top + kept.shape[1], left:left + kept.shape[2]] = kept
    grad = np.zeros(x_shape, weight.dtype)
    for a in range(kh):
        for b in range(kw):
            grad += np.matmul(_tap_views(full, a, b, (h, w), stride), weight[a, b])
    return grad


KERNELS = {
    "conv2d_transpose_forward": Kernel(conv2d_transpose_forward, """
        x: (N, H, W, in) float32 or float64, any strides; weight: (kh, kw, out, in) of x's
        dtype; bias: (out,) of a dtype that widens exactly to x's, or None; stride int pair;
        crop (top, left) and out_hw (Ho, Wo): the output is the full scatter
        ((H-1)*sh + kh, (W-1)*sw + kw) from (top, left) on, zeros (plus the bias) past it.
        Returns a new C-contiguous (N, Ho, Wo, out) array in x's dtype: each output the sum
        of its input-times-tap products (BLAS's order), then the bias. kept: a dict the
        implementation may store intermediates in for conv2d_transpose_weight_grad (the
        reference: its window matrix, "columns"); contents left open. Overwrites nothing
        else."""),
    "conv2d_transpose_weight_grad": Kernel(conv2d_transpose_weight_grad, """
        x: the forward's input, float32 or float64, any strides; g: the output gradient (N,
        Ho, Wo, out), a floating dtype that converts exactly to x's; kept: the forward's dict
        (or an empty one), to which the gradient regrouped by phase ("g_rows") may be added;
        w_shape (kh, kw, out, in), stride and crop as the forward's. Returns the weight's
        gradient (kh, kw, out, in) in x's dtype: sums of products in BLAS's order. Overwrites
        nothing else."""),
    "conv2d_transpose_input_grad": Kernel(conv2d_transpose_input_grad, """
        g: the output gradient (N, Ho, Wo, out), a floating dtype that converts exactly to
        the weight's; weight: (kh, kw, out, in) float32 or float64; kept: the forward's dict
        (or an empty one), to which the gradient regrouped by phase ("g_rows") may be added;
        x_shape (N, H, W, in), stride and crop as the forward's. Returns the input's gradient
        (x_shape) in the weight's dtype (native byte order): sums of products in BLAS's
        order. May return a view of a larger array. Overwrites nothing else."""),
}
