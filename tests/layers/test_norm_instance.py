"""InstanceNorm1D/2D (channels last) against PyTorch's InstanceNorm1d/2d on the permuted input:
forward and every gradient in float32 and float64, running statistics (momentum, None), eval
mode, unbatched input, state-dict keys; numerical and second derivatives; bad input named."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.second_order import F, normal, second_order_tests
from support.torch_oracle import compare_with_torch, leaf

KINDS = {"InstanceNorm1D": ((3, 6, 4), (0, 2, 1)), "InstanceNorm2D": ((3, 5, 4, 4), (0, 3, 1, 2))}


def _twins(torch, kind, dtype, **options):
    ours = getattr(eo, kind)(4, **options).to(dtype)
    theirs = getattr(torch.nn, kind[:-1] + "d")(4, **options).to(getattr(torch, dtype))
    return ours, theirs


def _channels_first(order):
    inverse = tuple(np.argsort(order))
    return (lambda t: t.permute(*order)), (lambda t: t.permute(*inverse))


@pytest.mark.torch
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("affine", [False, True])
def test_matches_torch_in_training(torch, rng, kind, dtype, affine):
    shape, order = KINDS[kind]
    ours, theirs = _twins(torch, kind, dtype, affine=affine)
    to_first, to_last = _channels_first(order)
    params = []
    if affine:
        ours.weight.data[...] = rng.uniform(0.5, 1.5, 4)
        ours.bias.data[...] = rng.standard_normal(4)
        tw, tb = leaf(torch, ours.weight.data, dtype), leaf(torch, ours.bias.data, dtype)
        params = [(ours.weight, tw), (ours.bias, tb)]

    def reference(t):
        out = torch.nn.functional.instance_norm(to_first(t), eps=theirs.eps,
                                                weight=tw if affine else None,
                                                bias=tb if affine else None)
        return to_last(out)

    compare_with_torch(torch, ours, reference, [rng.standard_normal(shape) * 3 + 2], params,
                       dtype=dtype)


@pytest.mark.torch
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
def test_running_statistics_and_eval_match_torch(torch, rng, kind, momentum):
    shape, order = KINDS[kind]
    ours, theirs = _twins(torch, kind, "float64", affine=True, track_running_stats=True,
                          momentum=momentum)
    to_first, to_last = _channels_first(order)
    for step in range(3):
        x = rng.standard_normal(shape) * (step + 1) + step
        out, ref = ours(x), to_last(theirs(to_first(torch.tensor(x))))
        np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name).numpy(),
                                   rtol=1e-12)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    ours.eval()
    theirs.eval()
    x = rng.standard_normal(shape)
    mine = eo.tensor(x, requires_grad=True)
    ref_x = torch.tensor(x, requires_grad=True)
    out, ref = ours(mine), to_last(theirs(to_first(ref_x)))
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(mine.grad, ref_x.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_eval_without_running_statistics_uses_each_samples_own(rng):
    norm = eo.InstanceNorm2D(2).to("float64").eval()
    out = norm(rng.standard_normal((2, 3, 3, 2)) * 5 + 3).data
    np.testing.assert_allclose(out.mean(axis=(1, 2)), 0, atol=1e-12)
    np.testing.assert_allclose(out.var(axis=(1, 2)), 1, rtol=1e-4)


def test_unbatched_input_is_one_sample(rng):
    norm = eo.InstanceNorm1D(3, affine=True)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(norm(x).data, norm(x[None]).data[0])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gradcheck(rng, kind):
    norm = getattr(eo, kind)(4, affine=True).to("float64")
    norm.weight.data[...] = rng.uniform(0.5, 1.5, 4)
    assert eo.gradcheck(norm, rng.standard_normal(KINDS[kind][0]), params=list(norm.parameters()))


@pytest.mark.parametrize("call, problem", [
    (lambda: eo.InstanceNorm2D(4)(eo.zeros(2, 4, 5, 5)),
     r"InstanceNorm2D\(4\): expected NHWC or HWC input with 4 channels on the last axis, got "
     r"shape \(2, 4, 5, 5\) — channels go last here"),
    (lambda: eo.InstanceNorm1D(4)(eo.zeros(4)), r"InstanceNorm1D\(4\).*\(N, L, C\) or \(L, C\)"),
    (lambda: eo.InstanceNorm1D(4)(eo.zeros(2, 1, 4)),
     r"InstanceNorm1D\(4\): normalising by each sample's statistics needs more than one "
     r"position"),
    (lambda: eo.InstanceNorm1D(4)(eo.tensor(np.zeros((2, 3, 4), np.int64))),
     "floating-point"),
    (lambda: eo.InstanceNorm2D(0), "InstanceNorm2D: num_features must be a positive int"),
])
def test_bad_input_is_named(call, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        call()


SECOND_ORDER = [
    ("instance_norm2d_via_group_norm",
     lambda x, w, b: eo.dispatch("group_norm", x, w, b, groups=3, eps=1e-5),
     lambda x, w, b: F().instance_norm(x.permute(0, 3, 1, 2), weight=w, bias=b).permute(
         0, 2, 3, 1), [normal(2, 3, 4, 3), normal(3), normal(3)]),
    ("instance_norm1d_layer", lambda x: eo.InstanceNorm1D(3).to("float64")(x),
     lambda x: F().instance_norm(x.permute(0, 2, 1)).permute(0, 2, 1), [normal(2, 5, 3)]),
]
test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))
