"""``everyo_dist.reduction.reduce_rows``, the public reduction a third-party backend calls
with the rows its peers sent: rows that do not fit ``out`` were reduced silently by their
prefix (a longer row) or raised NumPy's raw errors (a shorter or 2-D row, no rows, an integer
mean, a divisor that is no positive int). Each is refused by name on both kernel providers,
before ``out`` is written."""

from __future__ import annotations

import numpy as np
import pytest

import everyo.kernels as K
from everyo.errors import EveryOError

reduction = pytest.importorskip("everyo_dist.reduction")

N = 5


def _rows(k=3, dtype=np.float32):
    return [np.arange(N, dtype=dtype) + r for r in range(k)]


HOSTILE = {
    "no rows": ([], np.empty(N, np.float32), 1, r"no rows"),
    "a longer row": (_rows()[:2] + [np.arange(N + 3, dtype=np.float32)], np.empty(N, np.float32),
                     1, r"row 2 .*\(8,\).*\(5,\)"),
    "a shorter row": ([np.ones(N - 1, np.float32)] + _rows(2), np.empty(N, np.float32), 1,
                      r"row 0 .*\(4,\)"),
    "a 2-D row": ([np.ones((1, N), np.float32)] + _rows(2), np.empty(N, np.float32), 1,
                  r"row 0 .*\(1, 5\)"),
    "a 2-D out": (_rows(), np.empty((1, N), np.float32), 1, r"out .*\(1, 5\)"),
    "divisor 0": (_rows(), np.empty(N, np.float32), 0, r"divisor"),
    "divisor -2": (_rows(), np.empty(N, np.float32), -2, r"divisor"),
    "divisor 2.0": (_rows(), np.empty(N, np.float32), 2.0, r"divisor"),
    "divisor True": (_rows(), np.empty(N, np.float32), True, r"divisor"),
    "an integer mean": (_rows(dtype=np.int64), np.empty(N, np.int64), 3, r"integer"),
    "object rows": ([np.array([None] * N)] + _rows(2), np.empty(N, np.float32), 1, r"row 0"),
    "a read-only out": (_rows(), np.frombuffer(np.zeros(N, np.float32).tobytes(), np.float32),
                        1, r"read-only"),
}


@pytest.mark.parametrize("provider", ["numpy", "numba"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_rows_that_do_not_fit_out_are_refused_by_name(case, provider):
    if provider != "numpy" and provider not in K.kernel.registry.providers():
        pytest.skip(f"kernel provider {provider} not installed")
    rows, out, divisor, message = HOSTILE[case]
    before = out.copy()
    with K.use(provider), pytest.raises(EveryOError, match=message):
        reduction.reduce_rows(rows, out, divisor)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("provider", ["numpy", "numba"])
def test_what_fits_still_reduces(provider):
    if provider != "numpy" and provider not in K.kernel.registry.providers():
        pytest.skip(f"kernel provider {provider} not installed")
    rows = _rows(3, np.float32)
    with K.use(provider):
        out = reduction.reduce_rows(rows + [np.arange(N, dtype=np.float64)[::-1].copy()[::-1]],
                                    np.empty(N, np.float32), np.int32(4))
        in_place = reduction.reduce_rows(rows, rows[1], 1)  # (out may be one of the rows)
        stacked = reduction.reduce_rows(np.stack(_rows(2)), np.empty(N, np.float32), 2)
        ints = reduction.reduce_rows(_rows(2, np.int64), np.empty(N, np.int64), np.int64(1))
    np.testing.assert_array_equal(out, (4 * np.arange(N) + 3) / 4)
    np.testing.assert_array_equal(in_place, 3 * np.arange(N) + 3)
    np.testing.assert_array_equal(ints, 2 * np.arange(N) + 1)
    np.testing.assert_array_equal(stacked, np.arange(N) + 0.5)  # (rows as one 2-D array)
