"""Checkpoint values that do not survive the conversion to the model's dtype: a finite number
that overflows it (1e300 from a float64 file into a float32 weight, 70000 into float16) became
inf silently; now the load is refused by key, before anything changes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

OVERFLOWING = {
    "float64 1e300 -> float32": ("float32", np.float64(1e300)),
    "float64 -1e39 -> float32": ("float32", np.float64(-1e39)),
    "float32 70000 -> float16": ("float16", np.float32(70000.0)),
    "int 2**17 -> float16": ("float16", np.int64(2 ** 17)),
    "float64 1e39 -> bfloat16": ("bfloat16", np.float64(1e39)),
}


@pytest.mark.parametrize("case", list(OVERFLOWING))
def test_a_finite_value_that_overflows_the_models_dtype_is_refused(case):
    dtype, big = OVERFLOWING[case]
    layer = eo.Linear(3, 2).to(dtype)
    before = {k: np.array(v, copy=True) for k, v in layer.state_dict().items()}
    state = {k: np.asarray(v).astype(np.float64) for k, v in layer.state_dict().items()}
    state["weight"] = state["weight"].astype(np.asarray(big).dtype)
    state["weight"][0, 1] = big
    with pytest.raises(EveryOError, match=r"weight.*(overflow|represent)"):
        layer.load_state_dict(state)
    for k, v in layer.state_dict().items():  # nothing changed
        np.testing.assert_array_equal(np.asarray(v), before[k])


def test_values_that_are_already_inf_or_nan_or_round_still_load():
    """Only a finite value turned infinite is refused: inf and NaN stay what they were, and
    rounding to the narrower dtype (1/3, 1e-50 to 0) is the conversion asked for."""
    layer = eo.Linear(2, 2)
    weight = np.array([[np.inf, np.nan], [1 / 3, 1e-50]])
    layer.load_state_dict({"weight": weight, "bias": np.zeros(2)})
    np.testing.assert_array_equal(layer.weight.data, weight.astype(np.float32))
    half = eo.Linear(2, 2).to("bfloat16")
    half.load_state_dict({"weight": weight, "bias": np.zeros(2)})
    np.testing.assert_array_equal(half.weight.data.astype(np.float32),  # (NaN == NaN there)
                                  weight.astype(ml_dtypes.bfloat16).astype(np.float32))
