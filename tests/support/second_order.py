"""Second derivatives of the layers' ops, checked the same way in every family's test file:
``eo.gradgradcheck`` in float64, and ``torch.autograd.grad(create_graph=True)`` as the oracle
for the first, second (and value) of the same computation.

A family's test file lists its cases and takes its two tests from :func:`second_order_tests`:

    test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
        second_order_tests(SECOND_ORDER))

A case is ``(id, ours, theirs, builders)``: ``ours`` and ``theirs`` compute the same function
of EveryO and PyTorch tensors (``theirs`` is None where PyTorch has no such computation, e.g.
dropout with a given generator), ``builders`` make the inputs from a NumPy generator.
"""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def F():
    """``torch.nn.functional``, imported when a PyTorch reference runs (torch is optional)."""
    import torch.nn.functional

    return torch.nn.functional


def T():
    """The ``torch`` module, imported when a PyTorch reference runs."""
    import torch

    return torch


def normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def distinct(*shape):
    """No ties: max pooling's winner is unique."""
    return lambda rng: (rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0
                        + rng.uniform(0, 0.05, shape))


def away_from_zero(*shape):
    def build(rng):
        x = rng.standard_normal(shape)
        return np.where(np.abs(x) < 0.1, 0.3 * np.sign(x + 1e-12), x)
    return build


def nchw(t):
    return t.permute(0, 3, 1, 2)


def nhwc(t):
    return t.permute(0, 2, 3, 1)


def case_id(case) -> str:
    return case[0]


def torch_cases(cases) -> list:
    return [case for case in cases if case[2] is not None]


def inputs(builders, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [build(rng) for build in builders]


def assert_gradgradcheck(case) -> None:
    _, fn, _, builders = case
    assert eo.gradgradcheck(fn, *inputs(builders, 1))


def assert_second_derivatives_match_torch(case, torch) -> None:
    """Value, first derivative (with a random output gradient) and the derivative of a random
    weighting of the first, against PyTorch in float64."""
    _, fn, torch_fn, builders = case
    arrays = inputs(builders, seed=4)
    ours = [eo.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = fn(*ours), torch_fn(*theirs)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    rng = np.random.default_rng(2)
    v = rng.standard_normal(out.shape)
    g_ours = eo.grad(out, ours, grad_outputs=eo.tensor(v), create_graph=True)
    g_theirs = torch.autograd.grad(expected, theirs, grad_outputs=torch.tensor(v),
                                   create_graph=True)
    for a, b in zip(g_ours, g_theirs):
        np.testing.assert_allclose(a.data, b.detach().numpy(), rtol=1e-10, atol=1e-12)
    weights = [rng.standard_normal(a.shape) for a in arrays]
    total_ours = sum(((g * w).sum() for g, w in zip(g_ours, weights)), eo.tensor(np.float64(0)))
    total_theirs = sum((g * torch.tensor(w)).sum() for g, w in zip(g_theirs, weights))
    if total_ours.requires_grad:
        second_ours = eo.grad(total_ours, ours, allow_unused=True)
    else:  # the first derivative does not depend on the inputs (a piecewise-linear op)
        second_ours = [None] * len(ours)
    second_theirs = torch.autograd.grad(total_theirs, theirs, allow_unused=True)
    for a, b, x in zip(second_ours, second_theirs, arrays):
        a = np.zeros(x.shape) if a is None else a.data
        b = np.zeros(x.shape) if b is None else b.numpy(force=True)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)


def assert_composite_reproduces(name: str, attrs: dict, arrays) -> None:
    """The fused op ``name``'s ``composite`` gives its forward's values."""
    tensors = [eo.tensor(a, requires_grad=True) for a in arrays]
    out = eo.dispatch(name, *tensors, **attrs)
    np.testing.assert_allclose(out._ctx.composite(*tensors).data, out.data, rtol=1e-12,
                               atol=1e-12)


def second_order_tests(cases) -> tuple:
    """The two tests of a family's ``cases``: ``eo.gradgradcheck`` on every case, and PyTorch
    as the oracle on every case that has a PyTorch computation (skipped without PyTorch)."""

    @pytest.mark.parametrize("case", cases, ids=case_id)
    def test_second_derivatives_pass_gradgradcheck(case):
        assert_gradgradcheck(case)

    @pytest.mark.torch
    @pytest.mark.parametrize("case", torch_cases(cases), ids=case_id)
    def test_second_derivatives_match_torch(case, torch):
        assert_second_derivatives_match_torch(case, torch)

    return test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch
