"""Edge cases PyTorch's OpInfo samples found: each follows PyTorch, or raises a clear
EveryOError, or is documented in docs/autograd.md."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import everyo as eo


def test_pow_zero_exponent_has_zero_gradient_at_zero():
    x = eo.tensor(np.array([0.0, 2.0]), requires_grad=True)
    (x ** 0.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0])
    (g,) = eo.grad((x ** 0.0).sum(), x, create_graph=True)
    np.testing.assert_array_equal(g.data, [0.0, 0.0])


@pytest.mark.torch
def test_pow_zero_exponent_matches_pytorch(torch):
    x = torch.tensor([0.0, 2.0], dtype=torch.float64, requires_grad=True)
    (x ** 0.0).sum().backward()
    ours = eo.tensor(np.array([0.0, 2.0]), requires_grad=True)
    (ours ** 0.0).sum().backward()
    np.testing.assert_array_equal(ours.grad, x.grad.numpy())


def test_transpose_with_negative_axes_differentiates():
    assert eo.gradcheck(lambda t: eo.transpose(t, (-1, 0, 1)), np.random.default_rng(0)
                        .standard_normal((2, 3, 4)))
    assert eo.gradgradcheck(lambda t: eo.transpose(t, (-1, 0, 1)) ** 2,
                            np.random.default_rng(1).standard_normal((2, 3, 4)))


@pytest.mark.parametrize("fn", [eo.softmax, eo.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0,)])
def test_softmax_on_empty_tensors(fn, shape):
    x = eo.tensor(np.zeros(shape), requires_grad=True)
    out = fn(x)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 0), (0, 4)), ((2, 3, 0), (2, 0, 4)),
                                               ((3, 0), (0,))])
def test_matmul_with_empty_inner_dimension(a_shape, b_shape):
    a = eo.tensor(np.ones(a_shape), requires_grad=True)
    b = eo.tensor(np.ones(b_shape), requires_grad=True)
    out = a @ b
    assert not out.data.any()
    out.sum().backward()
    assert a.grad.shape == a_shape and b.grad.shape == b_shape


@pytest.mark.torch
@pytest.mark.parametrize("ddof", [3, 4])
def test_var_with_ddof_at_least_n_is_inf_like_pytorch(ddof, torch):
    x = eo.tensor(np.array([0.0, 1.0, 2.0]), requires_grad=True)
    v = eo.var(x, ddof=ddof)
    xt = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    with pytest.warns(UserWarning):
        vt = torch.var(xt, correction=ddof)
    assert np.isinf(v.data) and v.data > 0 and np.isinf(vt.item())
    v.backward()
    vt.backward()
    # Same pattern of inf and nan (the centre element is 0 * inf); the signs follow
    # 2 (x - mean) / 0, which PyTorch does not keep for the first element.
    np.testing.assert_array_equal(np.isinf(x.grad), np.isinf(xt.grad.numpy()))
    np.testing.assert_array_equal(np.isnan(x.grad), np.isnan(xt.grad.numpy()))
    assert x.grad[2] == np.inf and x.grad[0] == -np.inf


@pytest.mark.parametrize("call, name", [
    (lambda: eo.softmax(eo.ones(2, 3), axis=2), "softmax: axis 2"),
    (lambda: eo.log_softmax(eo.ones(2, 3), axis=-3), "log_softmax: axis -3"),
    (lambda: eo.softmax(eo.ones(2, 3), axis=(0, 1)), "softmax: axis must be an int"),
    (lambda: eo.concatenate([eo.ones(2, 3), eo.ones(2, 3)], axis=2), "concatenate: axis 2"),
    (lambda: eo.stack([eo.ones(2), eo.ones(2)], axis=3), "stack: axis 3"),
    (lambda: eo.concatenate([], axis=0), "concatenate: needs at least one"),
    # negative widths crop (PyTorch's rule); cropping an axis away is the error
    (lambda: eo.pad(eo.ones(2, 3), ((0, 0), (-2, -1))), "pad: widths .* crop axis 1"),
    (lambda: eo.pad(eo.ones(2, 3), ((1, 1, 1),)), "pad: pad_width"),
    (lambda: eo.tensor([2, 3]) ** eo.tensor([-1, 2]), "pow: an integer tensor.*negative"),
    (lambda: eo.tensor([2, 3]) ** -2, "pow: an integer tensor.*negative"),
])
def test_numpy_errors_do_not_leak(call, name):
    with pytest.raises(eo.EveryOError, match=name):
        call()


def test_integer_pow_with_non_negative_exponents_still_works():
    np.testing.assert_array_equal((eo.tensor([2, 3]) ** 2).data, [4, 9])


@pytest.mark.torch
def test_relu_at_nan_follows_pytorch(torch):
    values = np.array([np.nan, -1.0, 0.0, 1.0])
    x = eo.tensor(values, requires_grad=True)
    xt = torch.tensor(values, requires_grad=True)
    eo.relu(x).sum().backward()
    torch.relu(xt).sum().backward()
    np.testing.assert_array_equal(eo.relu(x).data, torch.relu(xt).detach().numpy())
    np.testing.assert_array_equal(x.grad, xt.grad.numpy())


def test_relu_at_nan_16_bit_floats_match_float32():
    from everyo.dtypes import BFLOAT16

    values = np.array([np.nan, -np.nan, -1.0, -0.0, 0.0, 1.0, np.inf, -np.inf])
    grads = []
    for dtype in (np.dtype("float32"), np.dtype("float16"), BFLOAT16):
        x = eo.tensor(values.astype(dtype), requires_grad=True)
        eo.relu(x).sum().backward()
        grads.append(x.grad.astype(np.float32))
    np.testing.assert_array_equal(grads[1], grads[0])
    np.testing.assert_array_equal(grads[2], grads[0])


def test_maximum_at_nan_sends_the_gradient_to_the_nan_operand():
    a = eo.tensor(np.array([np.nan, 1.0, np.nan, 2.0]), requires_grad=True)
    b = eo.tensor(np.array([1.0, np.nan, np.nan, 2.0]), requires_grad=True)
    out = eo.maximum(a, b)
    assert np.isnan(out.data[:3]).all()
    out.sum().backward()
    np.testing.assert_array_equal(a.grad, [1.0, 0.0, 0.5, 0.5])
    np.testing.assert_array_equal(b.grad, [0.0, 1.0, 0.5, 0.5])
    a.grad = b.grad = None
    eo.minimum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad, [1.0, 0.0, 0.5, 0.5])


@pytest.mark.torch
def test_clip_grad_norm_with_nan_norm_follows_pytorch(torch):
    p = eo.Parameter(np.array([1.0, np.nan]))
    q = eo.Parameter(np.ones(2))
    p.grad, q.grad = np.array([1.0, np.nan]), np.ones(2)
    total = eo.clip_grad_norm_([p, q], 1.0)
    pt = torch.nn.Parameter(torch.tensor([1.0, np.nan], dtype=torch.float64))
    qt = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    pt.grad, qt.grad = torch.tensor([1.0, np.nan], dtype=torch.float64), torch.ones(2,
                                                                                   dtype=torch.float64)
    total_t = torch.nn.utils.clip_grad_norm_([pt, qt], 1.0)
    assert np.isnan(total) and np.isnan(total_t.item())
    np.testing.assert_array_equal(np.isnan(q.grad), np.isnan(qt.grad.numpy()))


def kill_a_write(tmp_path, target, kill: str, write: str) -> None:
    """A child process starts a write (``write``, code naming ``target``) and is killed by
    ``kill`` (code replacing a step of the write) before it can finish or clean up."""
    code = ("import os, everyo as eo, numpy as np, everyo.serialization as s, "
            f"everyo.atomic_files as a\n{kill}\n{write}\n")
    subprocess.run([sys.executable, "-c", code], check=False,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(leftovers) == 1 and not target.exists()


def test_a_killed_save_leaves_a_temporary_that_the_next_save_removes(tmp_path):
    target = tmp_path / "model.npz"
    kill_a_write(tmp_path, target, "s.np.savez = lambda *a, **k: os._exit(9)",
                 f"eo.save({{'w': np.ones(3)}}, {str(target)!r})")
    old = tmp_path / ".everyo-abandoned.tmp"  # an old-style name: removed once it is old
    old.write_bytes(b"x")
    os.utime(old, (0, 0))
    eo.save({"w": np.zeros(2)}, target)
    assert sorted(os.listdir(tmp_path)) == ["model.npz"]
    np.testing.assert_array_equal(eo.load(target)["w"], np.zeros(2))


def test_a_killed_export_leaves_a_temporary_that_the_next_export_removes(tmp_path):
    pytest.importorskip("onnx")
    target = tmp_path / "model.onnx"
    kill_a_write(tmp_path, target, "a.os.replace = lambda *args: os._exit(9)",
                 f"eo.export_onnx(eo.Linear(3, 2), {str(target)!r}, (1, 3))")
    old = os.umask(0o022)
    try:
        eo.export_onnx(eo.Linear(3, 2), target, (1, 3))
    finally:
        os.umask(old)
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]
    assert os.stat(target).st_mode & 0o777 == 0o644  # 0o666 & ~umask


def test_a_running_save_keeps_its_temporary(tmp_path):
    import socket

    from everyo.serialization import remove_stale_temporaries

    host = socket.gethostname().replace("-", "_")
    alive = tmp_path / f".everyo-{os.getpid()}@{host}-abc.tmp"
    alive.write_bytes(b"x")
    assert remove_stale_temporaries(str(tmp_path)) == []
    assert alive.exists()


def test_the_truth_value_of_a_tensor_of_several_elements_is_an_everyo_error():
    # NumPy's raw ValueError escaped before, e.g. from list.index(param), which compares with ==
    assert bool(eo.tensor([3.0])) and not bool(eo.tensor(0.0))
    with pytest.raises(eo.EveryOError, match=r"shape \(2,\) is ambiguous"):
        bool(eo.ones(2))
    first, second = eo.Parameter([0.0, 1.0]), eo.Parameter([1.0, 2.0])
    with pytest.raises(eo.EveryOError, match="`is` to look a tensor up"):
        [first, second].index(second)


def test_a_cast_to_an_integer_dtype_has_no_gradient_as_in_pytorch():
    # the cast was recorded and backward sent a straight-through gradient to w ([3, 4] here)
    w = eo.tensor(np.array([1.7, 2.2], np.float32), requires_grad=True)
    x = eo.tensor(np.array([3.0, 4.0], np.float32))
    assert not w.astype("int32").requires_grad and not (w > 2.0).requires_grad
    (w * 2 + x * w.astype("int32")).sum().backward()
    np.testing.assert_array_equal(w.grad, [2.0, 2.0])
    with pytest.raises(eo.EveryOError, match="does not require grad"):
        (x * w.astype("int32")).sum().backward()


def _clip_case():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 1.5, 0.2, 2.5])
    lo = np.array([1.0, 1.0, 1.0, 3.5, 3.5, 2.0, 1.0, 1.0])
    hi = np.array([3.0, 3.0, 2.0, 3.0, 3.0, 1.0, 1.0, 1.0])
    return x, lo, hi  # (ties with each bound, min > max, min == max)


@pytest.mark.torch
@pytest.mark.parametrize("bounds", ["both", "min", "max"])
def test_clip_with_tensor_bounds_differentiates_them_as_pytorch(bounds, torch):
    x, lo, hi = _clip_case()
    lo_arg = eo.tensor(lo, requires_grad=True) if bounds != "max" else None
    hi_arg = eo.tensor(hi, requires_grad=True) if bounds != "min" else None
    xs = eo.tensor(x, requires_grad=True)
    out = eo.clip(xs, lo_arg, hi_arg)
    weights = np.arange(1.0, 9.0)
    (out * weights).sum().backward()
    xt = torch.tensor(x, requires_grad=True)
    lot = torch.tensor(lo, requires_grad=True) if lo_arg is not None else None
    hit = torch.tensor(hi, requires_grad=True) if hi_arg is not None else None
    expected = torch.clamp(xt, lot, hit)
    (expected * torch.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(out.data, expected.detach().numpy())
    np.testing.assert_array_equal(xs.grad, xt.grad.numpy())
    tie = (x < lo) & (lo == hi)  # element 6: PyTorch gives neither bound its gradient
    for ours, theirs in ((lo_arg, lot), (hi_arg, hit)):
        if ours is not None:
            expected_grad = theirs.grad.numpy().copy()
            if bounds == "both":  # we split it between them, as maximum/minimum split a tie
                assert not expected_grad[tie].any()
                expected_grad[tie] = weights[tie] / 2
            np.testing.assert_array_equal(ours.grad, expected_grad)


def test_clip_with_broadcast_tensor_bounds_has_first_and_second_derivatives():
    rng = np.random.default_rng(3)
    x, lo, hi = rng.standard_normal((3, 4)), rng.standard_normal(4) - 1.0, np.array(0.5)
    assert eo.gradcheck(lambda a, b, c: eo.clip(a, b, c) ** 2, x, lo, hi)
    assert eo.gradgradcheck(lambda a, b, c: eo.clip(a, b, c) ** 2, x, lo, hi)
    assert eo.gradcheck(lambda a, b: a.clip(min=b), x, lo)
    held = eo.tensor(lo)  # a bound that does not require grad
    ys = eo.tensor(x, requires_grad=True)
    eo.clip(ys, held, 1.0).sum().backward()
    np.testing.assert_array_equal(ys.grad, ((x >= lo) & (x <= 1.0)).astype(float))


# -- one rule for every axis argument (everyo.kernels.check_axis) -----------------------------

AXIS_OPS = {
    "sum": lambda x, axis: eo.sum(x, axis=axis),
    "mean": lambda x, axis: eo.mean(x, axis=axis),
    "max": lambda x, axis: eo.max(x, axis=axis),
    "min": lambda x, axis: eo.min(x, axis=axis),
    "var": lambda x, axis: eo.var(x, axis=axis),
    "softmax": lambda x, axis: eo.softmax(x, axis=axis),
    "log_softmax": lambda x, axis: eo.log_softmax(x, axis=axis),
    "concatenate": lambda x, axis: eo.concatenate([x, x], axis=axis),
    "stack": lambda x, axis: eo.stack([x, x], axis=axis),
    "cumsum": lambda x, axis: eo.dispatch("cumsum", x, axis=axis),
    "gather": lambda x, axis: eo.dispatch("gather", x, axis=axis,
                                          index=np.zeros((2, 3), np.int64)),
    "transpose": lambda x, axis: eo.transpose(x, (axis, 0)),
    "flatten": lambda x, axis: x.flatten(axis),
    "squeeze": lambda x, axis: x.squeeze(axis),
}


@pytest.mark.parametrize("op", AXIS_OPS)
@pytest.mark.parametrize("axis, message", [
    (True, "axis must be an int, got True"), (1.0, "axis must be an int, got 1.0"),
    ("1", "axis must be an int, got '1'"), (5, "axis 5 is out of range"),
    (-5, "axis -5 is out of range")])
def test_every_axis_argument_follows_one_rule(op, axis, message):
    x = eo.ones(2, 3)
    with pytest.raises(eo.EveryOError, match=f"{op}: {message}"):
        AXIS_OPS[op](x, axis)


@pytest.mark.parametrize("op", AXIS_OPS)
def test_numpy_integers_and_negative_axes_are_axes(op):
    x = eo.tensor(np.arange(6.0).reshape(2, 3))
    last = 2 if op == "stack" else 1  # (stack's axes are its result's)
    np.testing.assert_array_equal(AXIS_OPS[op](x, np.int64(-1)).data, AXIS_OPS[op](x, last).data)


def test_a_repeated_reduction_axis_is_named():
    with pytest.raises(eo.EveryOError, match="sum: axis 1 is listed twice"):
        eo.sum(eo.ones(2, 3), axis=(1, -1))


@pytest.mark.parametrize("axes, message", [
    ((1, True), "axis must be an int, got True"), ((1, 1.0), "axis must be an int, got 1.0"),
    ((1, -2), "axis 1 is listed twice")])
def test_squeeze_checks_each_of_several_axes(axes, message):
    with pytest.raises(eo.EveryOError, match=f"squeeze: {message}"):
        eo.ones(2, 1, 1).squeeze(axes)


def test_check_axis_is_public_for_plugins():
    from everyo.kernels import check_axis

    assert check_axis(-1, 3, "myop") == 2
    assert check_axis(0, 0, "myop") == 0  # a 0-d tensor takes axis 0 / -1, as in PyTorch
    with pytest.raises(eo.EveryOError, match=r"myop: axis 3 is out of range for shape \(2, 3, 4\)"):
        check_axis(3, 3, "myop", (2, 3, 4))


# -- bad shapes are named; reductions of nothing -------------------------------------------

BROADCASTING = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
    "maximum": eo.maximum, "minimum": eo.minimum,
    "where": lambda a, b: eo.where(np.ones((2, 3), bool), a, b),
    "clip": lambda a, b: eo.clip(a, b.data, None),
    "matmul": lambda a, b: eo.ones(2, 3, 4) @ eo.ones(5, 4, 6),
}


@pytest.mark.parametrize("op", BROADCASTING)
def test_shapes_that_do_not_broadcast_name_the_op_and_both_shapes(op):
    a, b = eo.ones(2, 3), eo.ones(4)
    shapes = (r"\(2, 3, 4\).*\(5, 4, 6\)" if op == "matmul" else r"\(2, 3\).*\(4,\)")
    with pytest.raises(eo.EveryOError, match=f"^{op}: .*{shapes}.* do not broadcast"):
        BROADCASTING[op](a, b)


def test_a_matmul_bias_that_does_not_broadcast_is_named():
    with pytest.raises(eo.EveryOError, match=r"matmul: bias of shape \(3,\) does not broadcast"):
        eo.dispatch("matmul", eo.ones(2, 4), eo.ones(4, 5), eo.ones(3))


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("shape, axis", [((0,), None), ((0, 3), 0), ((2, 0), None)])
def test_max_and_min_of_nothing_are_named(op, shape, axis):
    with pytest.raises(eo.EveryOError, match=f"{op}: axis . of shape .* is empty"):
        getattr(eo, op)(eo.ones(*shape), axis=axis)


@pytest.mark.torch
@pytest.mark.parametrize("op", ["max", "min", "sum", "mean"])
def test_reductions_over_a_non_empty_axis_of_an_empty_tensor_follow_pytorch(op, torch):
    x = eo.tensor(np.zeros((0, 3)), requires_grad=True)
    reference = getattr(torch, "amax" if op == "max" else "amin" if op == "min" else op)(
        torch.zeros(0, 3, dtype=torch.float64), 1)
    out = getattr(eo, op)(x, axis=1)
    assert out.shape == tuple(reference.shape)
    out.sum().backward()
    assert x.grad.shape == (0, 3)


@pytest.mark.torch
def test_the_mean_of_nothing_is_nan_without_a_warning_as_in_pytorch(torch):
    import warnings

    x = eo.tensor(np.zeros((0, 3)), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = eo.mean(x, axis=0)
        out.sum().backward()
        (g,) = eo.grad(eo.mean(x), x, create_graph=True)
    expected = torch.zeros(0, 3, dtype=torch.float64).mean(0)
    np.testing.assert_array_equal(out.data, expected.numpy())
    assert x.grad.shape == (0, 3) and g.shape == (0, 3)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_of_a_0d_tensor_follows_pytorch(name, axis, torch):
    x = eo.tensor(np.array(0.7), requires_grad=True)
    out = getattr(eo, name)(x, axis=axis)
    xt = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    expected = getattr(torch, name)(xt, axis)
    assert out.shape == () and float(out.data) == float(expected.detach())  # 1 and 0
    out.backward()
    expected.backward()
    assert float(x.grad) == float(xt.grad)
    assert eo.gradgradcheck(lambda t: getattr(eo, name)(t) * t, np.array(0.7))
    with pytest.raises(eo.EveryOError, match=f"{name}: axis 1 is out of range"):
        getattr(eo, name)(x, axis=1)
