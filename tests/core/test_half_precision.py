"""The 16-bit conversions of the cast node and the BLAS-shaped ops are bit-identical to astype:
over all 65,536 half-precision bit patterns and over float32 edge cases, in arrays large enough
to take the fast block-wise path."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.dtypes import FLOAT16, HALF_DTYPES
from everyo.half_precision import BLOCK, narrow, rounded_float32, widen
from everyo.ops.linalg import blas_matmul

HALVES = sorted(HALF_DTYPES, key=lambda d: d.name)
ALL_16_BIT = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def bits_of(array: np.ndarray) -> np.ndarray:
    return array.view({2: np.uint16, 4: np.uint32}[array.dtype.itemsize])


def float32_edge_cases() -> np.ndarray:
    """float32 values at every place a 16-bit rounding can go wrong, more than 2 * BLOCK of
    them so that the block-wise path (and its last, partial block) runs."""
    every_half = np.concatenate([widen(ALL_16_BIT.view(d)) for d in HALVES]).view(np.uint32)
    # neighbours one float32 ulp away, and the exact midpoints (ties) between consecutive
    # 16-bit values with their neighbours: the round-to-nearest-even decisions
    f16 = ALL_16_BIT.view(FLOAT16).astype(np.float32)
    finite = f16[np.isfinite(f16)]
    finite = np.sort(finite[finite >= 0])
    f16_ties = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    bf16_ties = (np.arange(1 << 15, dtype=np.uint32) << 16 | 0x8000)  # halfway between bf16s
    ties = np.concatenate([f16_ties.view(np.uint32), bf16_ties])
    ties = np.concatenate([ties, ties | 0x80000000])  # and their negatives
    specials = np.array([
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000,  # subnormals
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,  # float32 max, +-inf
        0x7F7F8000, 0x7F7F7FFF,  # bfloat16's overflow threshold (ties to inf) and just below
        0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC00001, 0xFFFFFFFF,
        0x7F80FFFF, 0x7FFF8000, 0xFFFF8000,  # NaN payloads: signalling, quiet, carry-prone
    ], np.uint32)
    overflow = np.array([65504.0, 65519.996, 65520.0, 65535.0, 65536.0, 1e9], np.float32)
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    parts = [every_half, every_half + 1, every_half - 1, ties, ties + 1, ties - 1, specials,
             overflow.view(np.uint32), (-overflow).view(np.uint32), random_bits]
    values = np.concatenate(parts).view(np.float32)
    assert values.size > 2 * BLOCK and values.size % BLOCK  # fast path with a partial block
    return values


EDGES = float32_edge_cases()


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_widen_matches_astype_on_every_16_bit_pattern(half):
    values = ALL_16_BIT.view(half)
    np.testing.assert_array_equal(bits_of(widen(values)), bits_of(values.astype(np.float32)))


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_narrow_round_trips_every_16_bit_pattern(half):
    # every pattern, twice over and shuffled, so that the array takes the block-wise path
    widened = widen(np.tile(ALL_16_BIT, 3).view(half))
    np.random.default_rng(1).shuffle(widened)
    with np.errstate(invalid="ignore"):  # NaN patterns: astype and narrow both warn
        expected, got = widened.astype(half), narrow(widened, half)
    np.testing.assert_array_equal(bits_of(got), bits_of(expected))


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_narrow_matches_astype_on_float32_edge_cases(half):
    with np.errstate(over="ignore", invalid="ignore"):
        expected = EDGES.astype(half)
        got = narrow(EDGES, half)
    assert got.dtype == half and got.shape == EDGES.shape
    np.testing.assert_array_equal(bits_of(got), bits_of(expected))


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_narrow_keeps_shape_and_handles_non_contiguous_input(half):
    grid = EDGES[: 4 * BLOCK].reshape(512, -1)[:, ::2]  # a strided view
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(bits_of(narrow(grid, half)), bits_of(grid.astype(half)))


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_widen_of_transposed_and_strided_views(half):
    grid = np.tile(ALL_16_BIT, 4).view(half).reshape(512, 512)
    for view in (grid.T, grid[::3, 1::2], grid.T[::2]):  # F-ordered, strided, both
        got = widen(view)
        assert got.shape == view.shape
        np.testing.assert_array_equal(bits_of(got), bits_of(view.astype(np.float32)))


def test_narrow_returns_the_array_itself_when_no_conversion_is_needed():
    big = np.zeros(4 * BLOCK, np.float32)
    assert narrow(big, np.dtype(np.float32)) is big
    assert narrow(big, np.dtype(np.float64)).dtype == np.float64


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_the_cast_node_converts_both_ways_like_astype(half):
    x = eo.tensor(EDGES, requires_grad=True)
    with np.errstate(over="ignore", invalid="ignore"):
        low = x.to(half.name)
        np.testing.assert_array_equal(bits_of(low.data), bits_of(EDGES.astype(half)))
        grad = EDGES.astype(half)
        low.backward(grad)
    np.testing.assert_array_equal(bits_of(x.grad), bits_of(grad.astype(np.float32)))


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_blas_matmul_rounds_the_float32_product_once(half):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((300, 64)).astype(half)
    b = rng.standard_normal((64, 700)).astype(half)  # 210,000 outputs: the block-wise path
    bias = rng.standard_normal(700).astype(np.float32)
    exact = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_array_equal(bits_of(blas_matmul(a, b)), bits_of(exact.astype(half)))
    with_bias = blas_matmul(a, b, bias.astype(half))
    expected = (exact + bias.astype(half).astype(np.float32)).astype(half)
    np.testing.assert_array_equal(bits_of(with_bias), bits_of(expected))


# -- rounded_float32: a float32 array rounded to 16-bit values without the 16-bit array ----------


def near_every_16_bit_value_and_midpoint(half: np.dtype) -> np.ndarray:
    """float32 patterns within 4 ulps of every finite 16-bit value and of every midpoint
    between consecutive ones (both signs), below 2**16 in magnitude: arrays that take the fast
    path in every block (larger values, infs and NaNs send their block to astype), float16's
    overflow threshold 65520 and the values up to 2**16 included."""
    values = widen(ALL_16_BIT.view(half))
    finite = np.unique(np.abs(values[np.isfinite(values)]))
    midpoints = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    centres = np.concatenate([finite, midpoints]).view(np.uint32).astype(np.int64)
    near = (centres[:, None] + np.arange(-4, 5)).reshape(-1)
    near = near[(near >= 0) & (near < 0x7F800000)].astype(np.uint32)
    overflow = np.arange(np.float32(65504).view(np.uint32), np.float32(2.0**16).view(
        np.uint32), dtype=np.uint32)  # (every float32 from float16's max up to 2**16)
    near = np.concatenate([near, overflow])
    near = np.concatenate([near, near | 0x80000000]).view(np.float32)
    return near[np.abs(near) < 2.0**16]


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_rounded_float32_near_every_16_bit_value_and_midpoint(half):
    values = near_every_16_bit_value_and_midpoint(half)
    np.random.default_rng(3).shuffle(values)  # (blocks mixing subnormals, normals, signs)
    # below 2**15 (no block reaches float16's top binade), then everything up to 2**16
    for part in (values[np.abs(values) < 2.0**15], values):
        assert part.size > 2 * BLOCK
        with np.errstate(over="ignore"):  # (astype overflows float16 to inf from 65520 on)
            expected = part.astype(half).astype(np.float32)
        np.testing.assert_array_equal(bits_of(rounded_float32(part, half)), bits_of(expected))
        in_place = part.copy()
        assert rounded_float32(in_place, half, out=in_place) is in_place
        np.testing.assert_array_equal(bits_of(in_place), bits_of(expected))


@pytest.mark.parametrize("half", HALVES, ids=lambda d: d.name)
def test_rounded_float32_matches_astype_on_float32_edge_cases(half):
    # overflow to inf, infs, NaN payloads (their blocks go through astype), subnormals, ties
    with np.errstate(over="ignore", invalid="ignore"):
        expected = EDGES.astype(half).astype(np.float32)
        got = rounded_float32(EDGES, half)
        np.testing.assert_array_equal(bits_of(got), bits_of(expected))
        shaped = EDGES[: 4 * BLOCK].reshape(512, -1)
        in_place = shaped.copy()
        rounded_float32(in_place, half, out=in_place)
        np.testing.assert_array_equal(bits_of(in_place), bits_of(shaped.astype(half).astype(
            np.float32)))
        strided = shaped[:, ::2]  # non-contiguous input: rounded through a contiguous copy
        np.testing.assert_array_equal(bits_of(rounded_float32(strided, half)),
                                      bits_of(strided.astype(half).astype(np.float32)))


def test_rounded_float32_of_a_small_or_16_bit_array():
    small = np.array([1.00048828125, -1e-8, 7e4, 3.0], np.float32)
    with np.errstate(over="ignore"):
        got = rounded_float32(small, FLOAT16)
        assert rounded_float32(small.astype(FLOAT16), FLOAT16).dtype == np.float32
    np.testing.assert_array_equal(bits_of(got), bits_of(np.array(
        [1.0, -0.0, np.inf, 3.0], np.float32)))
