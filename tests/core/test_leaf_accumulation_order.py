"""A leaf reached twice in one backward gets ``old grad + (sum of its contributions)`` — the
same bits whether or not a hook anywhere sends the pass through the hook-running engine."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def _accumulated_twice(with_hook_elsewhere: bool) -> np.ndarray:
    weight = eo.Parameter(np.float32([1.0, -2.0]))
    weight.grad = np.float32([1e8, 3e7])  # a previous micro-batch's gradient
    other = eo.Parameter(np.float32([1.0]))
    handle = other.register_post_accumulate_grad_hook(lambda p: None) \
        if with_hook_elsewhere else None
    try:
        (eo.sum(weight * 3.0) + eo.sum(weight * 3.0) + eo.sum(other)).backward()
    finally:
        if handle is not None:
            handle.remove()
    return weight.grad


@pytest.mark.parametrize("with_hook_elsewhere", [False, True])
def test_contributions_are_summed_before_they_meet_the_existing_grad(with_hook_elsewhere):
    grad = _accumulated_twice(with_hook_elsewhere)
    expected = np.float32([1e8, 3e7]) + (np.float32([3.0, 3.0]) + np.float32([3.0, 3.0]))
    assert grad.tobytes() == expected.tobytes()
