"""The one-row convolution path (everyo_layers/conv_rows.py: kw shifted GEMMs, no window matrix)
against the im2col formulation it replaces, on the shapes Conv1D sends through conv2d.

Bound: the same products summed in another order (per kernel position, then added), so each
output differs from the im2col GEMM's by at most a few roundings of the sum of the absolute
products: ``|ours - im2col| <= 4 * kw*C * eps * (|x| @ |w|)`` elementwise (weight gradient:
the N*Wo-term sums, same form).
"""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers import conv_rows
from everyo_layers.conv_kernels import conv2d_input_grad
from everyo_layers.conv_rows import (
    padded_rows,
    row_conv,
    row_input_grad,
    row_weight_grad,
    rows_apply,
)
from everyo_layers.windows import pad_hw, window_view

CASES = [  # (n, h, w, c, out, kw, dilation, (left, right))
    (3, 1, 11, 4, 8, 5, 2, (4, 4)), (2, 1, 9, 3, 5, 3, 1, (2, 0)), (1, 1, 7, 2, 3, 2, 3, (0, 0)),
    (2, 3, 6, 5, 4, 3, 1, (1, 1)), (0, 1, 5, 2, 2, 3, 1, (1, 1)), (4, 1, 16, 16, 1, 4, 1, (2, 1)),
    (5, 1, 1000, 3, 2, 3, 2, (2, 2)),  # (5020 rows, one block)
    (3, 1, 900, 16, 16, 3, 2, (2, 2)),  # (2712 rows: blocks of 3906, the last one short)
    (9, 1, 300, 64, 64, 5, 2, (4, 4)),  # (conv1d's channels: 12 blocks of 244, two groups)
]


def _windows(x, kw, dilation, left_right):
    pads = ((0, 0), tuple(left_right))
    width = x.shape[2] + sum(left_right) - (kw - 1) * dilation
    view = window_view(pad_hw(x, pads), (1, kw), (1, 1), (1, dilation), (x.shape[1], width))
    return view.reshape(-1, kw * x.shape[3]), width


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n, h, w, c, out, kw, dilation, left_right", CASES)
def test_row_conv_matches_the_window_matrix_product(rng, dtype, n, h, w, c, out, kw, dilation,
                                                      left_right):
    _check_against_the_window_matrix(rng, dtype, n, h, w, c, out, kw, dilation, left_right)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_conv_in_groups_of_one_block_matches_the_window_matrix_product(rng, monkeypatch,
                                                                         dtype):
    """Every block its own group (forward) and its own partial product (weight gradient): the
    group offsets are exercised without inputs of tens of MB."""
    monkeypatch.setattr(conv_rows, "_GROUP_ROWS", 1)
    monkeypatch.setattr(conv_rows, "_PARTIAL_BYTES", 1)
    _check_against_the_window_matrix(rng, dtype, 9, 1, 300, 64, 64, 5, 2, (4, 4))
    _check_against_the_window_matrix(rng, dtype, 3, 2, 50, 40, 60, 3, 3, (3, 1))


def _check_against_the_window_matrix(rng, dtype, n, h, w, c, out, kw, dilation, left_right):
    x = rng.standard_normal((n, h, w, c)).astype(dtype)
    weight = rng.standard_normal((1, kw, c, out)).astype(dtype)
    assert rows_apply(x, weight, (1, 1), ((0, 0), left_right))
    cols, width = _windows(x, kw, dilation, left_right)
    rows = padded_rows(x, left_right, weight.shape, dilation)
    eps = np.finfo(dtype).eps

    ours = row_conv(rows, weight, dilation, x.shape, width)
    w2 = weight.reshape(kw * c, out)
    expected = (cols.astype(np.float64) @ w2.astype(np.float64)).reshape(ours.shape)
    scale = (np.abs(cols.astype(np.float64)) @ np.abs(w2.astype(np.float64))).reshape(ours.shape)
    assert ours.shape == (n, h, width, out) and ours.dtype == dtype
    assert np.all(np.abs(ours - expected) <= 4 * kw * c * eps * scale)

    g = rng.standard_normal(ours.shape).astype(dtype)
    grad = row_weight_grad(rows, g, dilation, weight.shape)
    g2 = g.reshape(-1, out).astype(np.float64)
    expected = (cols.astype(np.float64).T @ g2).reshape(weight.shape)
    scale = (np.abs(cols.astype(np.float64)).T @ np.abs(g2)).reshape(weight.shape)
    assert grad.shape == weight.shape and grad.dtype == dtype
    assert np.all(np.abs(grad - expected) <= 4 * max(g2.shape[0], 1) * eps * scale)

    gx = row_input_grad(g, weight, dilation, left_right, w)
    pads = ((0, 0), tuple(left_right))
    expected = conv2d_input_grad(g2, w2.astype(np.float64), x.shape, weight.shape, (1, 1),
                                 (1, dilation), pads, (h, width))
    scale = conv2d_input_grad(np.abs(g2), np.abs(w2.astype(np.float64)), x.shape,
                              weight.shape, (1, 1), (1, dilation), pads, (h, width))
    assert gx.shape == x.shape and gx.dtype == dtype and gx.flags.c_contiguous
    assert np.all(np.abs(gx - expected) <= 4 * kw * out * eps * scale)


def test_row_input_grad_leaves_padding_past_the_kernel_to_the_col2im_path(rng):
    """More padding than the kernel reaches (outputs that see only zeros) or an output
    gradient wider than the weight: None, and Conv1D's input gradient still matches PyTorch's
    rule (the window path's), checked in float64."""
    g = rng.standard_normal((2, 1, 9, 3))
    weight = rng.standard_normal((1, 3, 2, 3))
    assert row_input_grad(g, weight, 1, (3, 0), 5) is None  # (reach 2 < left 3)
    assert row_input_grad(g, weight.astype(np.float32), 1, (1, 1), 9) is None
    assert row_input_grad(g, weight, 1, (2, 2), 7) is not None
    layer = eo.Conv1D(2, 3, 3, padding=3, seed=0).to("float64")
    x = eo.tensor(rng.standard_normal((2, 5, 2)), requires_grad=True)
    (layer(x) ** 2).sum().backward()
    out_g = 2 * layer(x).data.reshape(2, 1, 9, 3)
    expected = conv2d_input_grad(out_g.reshape(-1, 3), layer.weight.data.reshape(-1, 3),
                                 (2, 1, 5, 2), (1, 3, 2, 3), (1, 1), (1, 1),
                                 ((0, 0), (3, 3)), (1, 9))
    np.testing.assert_allclose(x.grad.reshape(2, 1, 5, 2), expected, rtol=1e-12, atol=1e-12)


def test_rows_apply_only_where_it_computes_conv2d():
    x = np.zeros((1, 1, 8, 2), np.float32)
    w = np.zeros((1, 3, 2, 2), np.float32)
    assert rows_apply(x, w, (1, 1), ((0, 0), (1, 1)))
    assert not rows_apply(x, w, (1, 2), ((0, 0), (1, 1)))  # strided
    assert not rows_apply(x, w, (1, 1), ((1, 0), (1, 1)))  # padding above
    assert not rows_apply(x, w[:, :1], (1, 1), ((0, 0), (0, 0)))  # 1x1: the free reshape
    assert not rows_apply(x, np.zeros((2, 3, 2, 2), np.float32), (1, 1), ((0, 0), (1, 1)))
    assert not rows_apply(x.astype(np.float16), w.astype(np.float16), (1, 1), ((0, 0), (1, 1)))
    assert not rows_apply(x, w.astype(np.float64), (1, 1), ((0, 0), (1, 1)))


def test_conv1d_through_the_row_path_equals_the_window_path_in_float64(rng):
    """The layer's forward and both gradients, row path against conv2d's im2col path forced by a
    two-row view of the same data (a 2-high kernel whose second row is zero)."""
    layer = eo.Conv1D(3, 4, 3, dilation=2, padding="same", seed=1).to("float64")
    x = eo.tensor(rng.standard_normal((2, 9, 3)), requires_grad=True)
    out = layer(x)
    (out * out).sum().backward()

    w4 = np.concatenate([layer.weight.data[None], np.zeros((1,) + layer.weight.shape)])
    weight2 = eo.tensor(w4, requires_grad=True)
    x2 = eo.tensor(x.data.copy(), requires_grad=True)
    bias2 = eo.tensor(layer.bias.data.copy(), requires_grad=True)
    x4 = eo.dispatch("pad", x2.reshape(2, 1, 9, 3), pad_width=((0, 0), (0, 1), (0, 0), (0, 0)))
    ref = eo.dispatch("conv2d", x4, weight2, bias2, padding=((0, 0), (2, 2)),
                      dilation=(1, 2)).reshape(2, 9, 4)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.data, ref.data, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.weight.grad, weight2.grad[0], rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(layer.bias.grad, bias2.grad, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad, x2.grad, rtol=1e-11, atol=1e-11)


def test_row_weight_grad_of_a_wider_output_gradient_is_computed_wide(rng):
    """A float64 bias on a float32 layer makes the output (and its gradient) float64: the
    weight gradient must come out of the float64 gradient, not of a float32 rounding of it."""
    x = rng.standard_normal((2, 1, 6, 2)).astype(np.float32)
    g = rng.standard_normal((2, 1, 6, 2)) * (1 + 1e-9)  # (not exact in float32)
    grad = row_weight_grad(padded_rows(x, (1, 1), (1, 3, 2, 2), 1), g, 1, (1, 3, 2, 2))
    cols, _ = _windows(x, 3, 1, (1, 1))
    expected = (cols.astype(np.float64).T @ g.reshape(-1, 2)).reshape(1, 3, 2, 2)
    assert grad.dtype == np.float64
    np.testing.assert_allclose(grad, expected, rtol=1e-13, atol=1e-13)


def test_conv1d_with_a_wider_bias_runs_the_row_path_in_float32_then_widens(rng):
    layer = eo.Conv1D(2, 2, 3, padding="same", seed=0)
    layer.bias = eo.Parameter(layer.bias.data.astype(np.float64))
    x = eo.tensor(rng.standard_normal((2, 6, 2)).astype(np.float32))
    out = layer(x)
    assert out.data.dtype == np.float64
    (out * out).sum().backward()
    assert layer.weight.grad is not None and layer.bias.grad is not None
