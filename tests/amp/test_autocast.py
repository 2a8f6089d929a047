"""eo.autocast: which ops change dtype, where the block ends, and what the gradients look like."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import everyo as eo
import everyo_amp
from everyo.dispatch import active_interceptors
from everyo_amp import AutocastPolicy


def mlp(seed=0):
    return eo.Sequential(eo.Linear(8, 4, seed=seed), eo.ReLU(), eo.Linear(4, 1, seed=seed + 1))


# -- where a block starts and ends ---------------------------------------------------------------

def test_an_mlp_under_autocast_has_the_documented_dtypes():
    model = mlp()
    with eo.autocast():
        output = model(eo.ones(3, 8))
    assert output.dtype == "float16"
    assert model[0].weight.dtype == "float32"
    assert model(eo.ones(3, 8)).dtype == "float32"  # nothing leaks out of the block


def test_nested_blocks_and_float32_island():
    x, w = eo.randn(2, 3, seed=0), eo.randn(3, 3, seed=1, requires_grad=True)
    with eo.autocast():
        assert (x @ w).dtype == "float16"
        with eo.autocast(False):
            assert (x @ w).dtype == "float32"
            assert not everyo_amp.is_autocast_enabled()
            with eo.autocast():
                assert (x @ w).dtype == "float16"
            assert (x @ w).dtype == "float32"
        assert (x @ w).dtype == "float16"
    assert (x @ w).dtype == "float32"
    assert active_interceptors() == ()


def test_decorator_applies_per_call_only():
    w = eo.randn(3, 2, seed=0, requires_grad=True)

    @eo.autocast()
    def forward(x):
        return x @ w

    @eo.autocast(False)
    def island(x):
        return x @ w

    assert forward(eo.ones(1, 3)).dtype == "float16"
    assert (eo.ones(1, 3) @ w).dtype == "float32"
    with eo.autocast():
        assert island(eo.ones(1, 3)).dtype == "float32"
    assert forward.__name__ == "forward"


def test_exception_inside_a_block_leaks_nothing():
    with pytest.raises(ValueError, match="boom"):
        with eo.autocast():
            assert everyo_amp.is_autocast_enabled()
            raise ValueError("boom")
    assert active_interceptors() == ()
    assert (eo.ones(2, 2) @ eo.ones(2, 2)).dtype == "float32"

    @eo.autocast()
    def failing():
        raise KeyError("inside")

    with pytest.raises(KeyError):
        failing()
    assert active_interceptors() == ()


def test_other_threads_do_not_see_the_block():
    seen = {}
    inside = threading.Event()
    release = threading.Event()

    def worker():
        inside.wait(10)
        seen["dtype"] = (eo.ones(2, 2) @ eo.ones(2, 2)).dtype
        seen["enabled"] = everyo_amp.is_autocast_enabled()
        release.set()

    thread = threading.Thread(target=worker)
    thread.start()
    with eo.autocast():
        inside.set()
        assert release.wait(10)
        assert (eo.ones(2, 2) @ eo.ones(2, 2)).dtype == "float16"
    thread.join(10)
    assert seen == {"dtype": "float32", "enabled": False}


def test_another_interceptor_keeps_running_inside_and_around_blocks():
    from everyo.dispatch import pop_interceptor, push_interceptor

    seen = []

    def record(name, operands, attrs, proceed):
        seen.append((name, [getattr(o, "dtype", None) for o in operands]))
        return proceed(operands, attrs)

    token = push_interceptor(record)
    try:
        x = eo.ones(1, 2)
        with eo.autocast():
            x @ eo.ones(2, 1)
            with eo.autocast(False):
                x @ eo.ones(2, 1)
        assert active_interceptors() == (record,)
    finally:
        pop_interceptor(token)
    matmuls = [dtypes for name, dtypes in seen if name == "matmul"]
    assert matmuls == [["float16", "float16"], ["float32", "float32"]]


def test_one_instance_shared_by_threads_and_reentered():
    block = eo.autocast()
    results, errors = [], []

    def worker():
        try:
            for _ in range(200):
                with block:
                    with block:
                        results.append((eo.ones(1, 2) @ eo.ones(2, 1)).dtype)
                assert active_interceptors() == ()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert results == ["float16"] * 800


# -- exactly the policy's ops change precision ---------------------------------------------------

def test_only_allowlisted_ops_are_cast_down():
    x, y = eo.randn(4, 4, seed=0), eo.randn(4, 4, seed=1)
    with eo.autocast():
        assert eo.matmul(x, y).dtype == "float16"
        for result in (x * y, x + y, x - y, x / y, eo.relu(x), eo.tanh(x), eo.mean(x), eo.sum(x),
                       eo.exp(x), eo.softmax(x), eo.maximum(x, y), x.reshape(16), x.T):
            assert result.dtype == "float32"


def test_no_registered_op_outside_the_allowlist_is_cast_down():
    # The test above samples a dozen ops; this one asks the interceptor about every op any
    # installed plugin registered, so a new op can never be cast down by accident.
    from everyo_amp import DEFAULT_POLICY, make_interceptor

    intercept = make_interceptor(DEFAULT_POLICY)
    operands = (eo.randn(2, 2, seed=0), eo.randn(2, 2, seed=1), np.ones(2, np.float32), 3.0)
    names = set(eo.registry("ops").items)
    lowered = {name for name in names if getattr(eo.registry("ops")[name], "precision", None)
               == "lower"}
    assert lowered == {"matmul", "conv2d"} and len(names) > 30
    for name in sorted(names):
        result = intercept(name, operands, {}, lambda operands, attrs: operands)
        if name in lowered:
            assert [getattr(o, "dtype", None) for o in result[:3]] == ["float16"] * 2 + [np.float16]
        else:
            assert all(a is b for a, b in zip(result, operands)), name


def test_the_default_policy_is_what_the_ops_declare():
    # The precision classes are declared on each op class; these are the sets the first-party
    # distributions declare (the same lists everyo-amp used to keep by hand).
    from everyo_amp import DEFAULT_POLICY

    ops = eo.registry("ops").items
    assert DEFAULT_POLICY.ops == {"matmul", "conv2d"}
    assert DEFAULT_POLICY.upcast == {name for name, op in ops.items()
                                     if getattr(op, "precision", None) == "float32"}
    # at least everything everyo-amp used to list by hand (new losses join through their base)
    assert DEFAULT_POLICY.upcast >= {
        "sum", "mean", "var", "exp", "log", "pow", "softmax", "log_softmax", "mse_loss",
        "l1_loss", "cross_entropy", "nll_loss", "bce_with_logits", "layer_norm", "batch_norm",
        "attention_weights"}


def test_an_op_registered_later_is_covered_by_its_own_declaration():
    class HalfSquare(eo.Op):
        precision = "float32"
        __slots__ = ()

        def forward(self, x):
            return x * x / 2

        def backward(self, g):
            return (g,)

    class LatePlugin:
        @eo.hookimpl
        def everyo_register_ops(self, register):
            register("late_half_square", HalfSquare)

    eo.register_plugin(LatePlugin(), name="late_precision_plugin")
    try:
        h = eo.ones(3, dtype="float16")
        with eo.autocast():
            assert eo.dispatch("late_half_square", h).dtype == "float32"
        assert eo.dispatch("late_half_square", h).dtype == "float16"
    finally:
        eo.unregister_plugin("late_precision_plugin")
    assert "late_half_square" not in eo.registry("ops")


def test_float32_ops_upcast_float16_activations():
    h = eo.randn(4, 4, seed=0).astype("float16")
    with eo.autocast():
        assert eo.mean(h).dtype == "float32"
        assert eo.sum(h).dtype == "float32"
        assert eo.exp(h).dtype == "float32"
        assert eo.log_softmax(h).dtype == "float32"
        assert eo.relu(h).dtype == "float16"  # not in either list: untouched
    assert eo.mean(h).dtype == "float16"  # outside a block nothing is upcast


def test_upcast_mean_is_computed_in_float32():
    # 4096 float16 values of 30: a float16 running sum overflows 65504; float32 does not.
    h = eo.full(4096, fill_value=30.0, dtype="float16")
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.sum(h.data))  # the failure the upcast avoids
    with eo.autocast():
        total = eo.sum(h)
    assert total.dtype == "float32" and total.item() == pytest.approx(4096 * 30.0)


def test_losses_and_normalisation_of_everyo_layers_run_in_float32():
    prediction = eo.randn(8, 1, seed=0).astype("float16")
    logits = eo.Tensor(np.random.default_rng(0).standard_normal((8, 5)).astype(np.float16),
                       requires_grad=True)
    with eo.autocast():
        assert eo.mse_loss(prediction, eo.randn(8, 1, seed=1)).dtype == "float32"
        loss = eo.cross_entropy(logits, eo.tensor(np.arange(8) % 5))
        assert eo.LayerNorm(5)(logits).dtype == "float32"
        assert eo.BatchNorm1D(5)(logits).dtype == "float32"
    assert loss.dtype == "float32"
    loss.backward()
    assert logits.grad.dtype == np.float16  # the gradient goes back in the activation's dtype


def test_conv2d_is_cast_down():
    conv = eo.Conv2D(3, 4, 3, seed=0)
    x = eo.randn(2, 6, 6, 3, seed=1)
    with eo.autocast():
        out = conv(x)
    assert out.dtype == "float16" and conv.weight.dtype == "float32"
    reference = conv(x)
    np.testing.assert_allclose(out.data.astype(np.float32), reference.data, rtol=1e-2, atol=1e-2)


def test_float64_and_integer_operands_are_left_alone():
    a64 = eo.tensor(np.ones((2, 2)))
    with eo.autocast():
        assert eo.matmul(a64, a64).dtype == "float64"
        assert eo.matmul(eo.tensor([[1, 2]]), eo.tensor([[3], [4]])).dtype.startswith("int")
        assert eo.matmul(np.ones((2, 2), np.float32), eo.ones(2, 2)).dtype == "float16"


def test_custom_dtype_and_bad_dtype():
    with eo.autocast(dtype="float32"):
        assert (eo.ones(2, 2, dtype="float16") @ eo.ones(2, 2)).dtype == "float32"
    with pytest.raises(eo.EveryOError, match="unknown dtype 'bfloat17'"):
        eo.autocast(dtype="bfloat17")
    with pytest.raises(eo.EveryOError, match="floating"):
        eo.autocast(dtype="int8")
    with pytest.raises(eo.EveryOError, match="takes a bool.*'cpu'"):
        eo.autocast("cpu")


def test_default_policy_is_registered_through_the_hook():
    policies = eo.registry("autocast_policies")
    assert policies.owners["default"] == "everyo_amp"
    default = policies["default"]
    assert default.ops == {"matmul", "conv2d"} and default.dtype == "float16"
    assert {"mean", "sum", "exp", "log", "softmax", "mse_loss", "cross_entropy"} <= default.upcast
    assert eo.registry("api").owners["autocast"] == "everyo_amp"
    assert eo.registry("api").owners["GradScaler"] == "everyo_amp"


def test_third_party_policy_through_the_hook():
    class AddInHalf:
        @eo.hookimpl
        def everyo_register_autocast_policies(self, register):
            # only the hook's contract: .ops and .dtype
            register("add_in_half", type("P", (), {"ops": {"add"}, "dtype": "float16"})())

    eo.register_plugin(AddInHalf(), name="test-amp-add-in-half")
    try:
        x = eo.ones(2)
        with eo.autocast(policy="add_in_half"):
            assert (x + x).dtype == "float16"
            assert (eo.ones(1, 2) @ eo.ones(2, 1)).dtype == "float32"
        with pytest.raises(eo.EveryOError, match="no autocast policy named 'nope'.*default"):
            eo.autocast(policy="nope")
    finally:
        eo.unregister_plugin("test-amp-add-in-half")
    assert "add_in_half" not in eo.registry("autocast_policies")


def test_policy_refuses_an_op_in_both_lists():
    with pytest.raises(eo.EveryOError, match="matmul"):
        AutocastPolicy(ops={"matmul"}, upcast={"matmul", "sum"})


# -- gradients -------------------------------------------------------------------------------

def test_parameter_grads_float32_activation_grads_float16():
    model = mlp()
    # a float16 activation entering the model, as the output of an earlier autocast layer is
    activation = eo.Tensor(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float16),
                           requires_grad=True)
    with eo.autocast():
        hidden = model[1](model[0](activation))
        output = model[2](hidden)
    assert hidden.dtype == output.dtype == "float16"
    output.astype("float32").sum().backward()
    assert activation.grad.dtype == np.float16
    for p in model.parameters():
        assert p.dtype == "float32" and p.grad.dtype == np.float32


def test_gradients_through_activations_really_are_float16():
    # An upstream gradient of 2e-8 is below half of float16's smallest subnormal (6e-8): if the
    # backward pass quietly ran in float32 the weights would still get non-zero gradients.
    model = mlp()
    x = eo.randn(5, 8, seed=1)
    with eo.autocast():
        output = model(x)
    output.backward(np.full(output.shape, 2e-8))
    assert all(not np.any(p.grad) for p in model.parameters())
    model.zero_grad()
    model(x).backward(np.full(output.shape, 2e-8, np.float32))
    assert all(np.any(p.grad) for p in model.parameters())


def test_gradients_match_a_hand_written_float16_computation():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w = eo.Parameter(rng.standard_normal((5, 3)).astype(np.float32))
    b = eo.Parameter(rng.standard_normal(3).astype(np.float32))
    upstream = rng.standard_normal((6, 3)).astype(np.float16)
    with eo.autocast():
        y = eo.matmul(eo.tensor(x), w, bias=b)
    y.backward(upstream)

    f16, f32 = np.float16, np.float32
    x16, w16, b16 = x.astype(f16), w.data.astype(f16), b.data.astype(f16)
    # one rounding: the bias joins the float32 accumulator, as on a tensor core
    expected_y = (x16.astype(f32) @ w16.astype(f32) + b16.astype(f32)).astype(f16)
    expected_gw = (x16.astype(f32).T @ upstream.astype(f32)).astype(f16).astype(f32)
    expected_gb = upstream.astype(f32).sum(0).astype(f16).astype(f32)
    np.testing.assert_array_equal(y.data, expected_y)
    np.testing.assert_array_equal(w.grad, expected_gw)
    np.testing.assert_array_equal(b.grad, expected_gb)


def test_gradcheck_of_the_cast_node():
    # NOTE: values on a 1/8 grid and eps = 2**-8 are exact in float16 and float32, so the
    # forward round trip float64 -> float16 -> float64 loses nothing and the central differences
    # are exact. The analytic gradient of the float16 path is itself computed in float16 (that
    # is the point), so it carries float16 rounding: two roundings of relative size 2**-11
    # each, hence rtol = 2**-9 there; the float32 path is checked at the default tolerances.
    grid = np.arange(-12, 12).reshape(4, 6) / 8.0
    weights = np.arange(1, 7) / 4.0

    def through_float16(x):
        return (x.astype("float16") * weights.astype(np.float16)).astype("float64")

    def through_float32(x):
        return (x.astype("float32") * weights.astype(np.float32)).astype("float64")

    assert eo.gradcheck(through_float16, grid, eps=2.0**-8, atol=1e-6, rtol=2.0**-9)
    assert eo.gradcheck(through_float32, grid, eps=2.0**-8)


def test_cast_backward_returns_the_source_dtype():
    for source in ("float16", "float32", "float64"):
        for target in ("float16", "float32", "float64"):
            x = eo.ones(3, dtype=source, requires_grad=True)
            y = eo.dispatch("cast", x, dtype=np.dtype(target))
            assert y.dtype == target
            y.backward(np.array([1.0, 2.0, 3.0], dtype=target))
            assert x.grad.dtype == np.dtype(source)
            np.testing.assert_array_equal(x.grad, [1.0, 2.0, 3.0])


def test_grad_of_cast_keeps_the_operand_dtype():
    w = eo.Parameter(np.ones((3, 2), np.float32))
    with eo.autocast():
        y = eo.ones(4, 3) @ w
    y.backward(np.ones((4, 2), np.float16))
    assert w.grad.dtype == np.float32
    np.testing.assert_array_equal(w.grad, np.full((3, 2), 4.0, np.float32))


def test_weights_are_never_stale_after_an_optimizer_step():
    # The whole loop inside one block: a cached float16 copy would keep the old weights.
    w = eo.Parameter(np.ones((2, 1), np.float32))
    optimizer = eo.SGD([w], lr=0.5)
    with eo.autocast():
        for _ in range(3):
            optimizer.zero_grad()
            y = eo.ones(1, 2) @ w
            np.testing.assert_array_equal(y.data, (np.ones((1, 2)) @ w.data).astype(np.float16))
            y.astype("float32").sum().backward()
            optimizer.step()


def test_matches_pytorch_autocast(torch):
    model = mlp(seed=3)
    x = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    target = np.random.default_rng(2).standard_normal((16, 1)).astype(np.float32)
    with eo.autocast():
        out = model(eo.tensor(x))
    loss = ((out - eo.tensor(target)) ** 2).mean()
    loss.backward()

    tm = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        for t_layer, e_layer in ((tm[0], model[0]), (tm[2], model[2])):
            t_layer.weight.copy_(torch.from_numpy(e_layer.weight.data.T.copy()))
            t_layer.bias.copy_(torch.from_numpy(e_layer.bias.data))
    with torch.autocast("cpu", dtype=torch.float16):
        t_out = tm(torch.from_numpy(x))
    assert t_out.dtype == torch.float16 and out.dtype == "float16"
    t_loss = ((t_out - torch.from_numpy(target)) ** 2).mean()
    t_loss.backward()
    np.testing.assert_allclose(out.data, t_out.detach().numpy(), rtol=2e-3, atol=2e-3)
    for t_layer, e_layer in ((tm[0], model[0]), (tm[2], model[2])):
        assert t_layer.weight.grad.dtype == torch.float32
        np.testing.assert_allclose(e_layer.weight.grad, t_layer.weight.grad.numpy().T,
                                   rtol=5e-3, atol=5e-4)
        np.testing.assert_allclose(e_layer.bias.grad, t_layer.bias.grad.numpy(),
                                   rtol=5e-3, atol=5e-4)
