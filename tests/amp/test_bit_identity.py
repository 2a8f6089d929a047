"""The fast paths of an autocast training step change no bit: weight casts folded into their
products (``matmul(lower=...)``, ``rounded_float32``), the fast conversions and GradScaler's
one-pass unscale give exactly the gradients and weights of the same steps computed through
cast nodes with plain ``astype`` conversions everywhere."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import everyo as eo
import everyo_amp.autocast_mode as autocast_mode
from everyo import EveryOError, half_precision
from everyo.dtypes import FLOAT32, HALF_DTYPES
from everyo.kernels import kernel
from everyo.ops import linalg


def plain_narrow(x, dtype):
    return x.astype(dtype, copy=False)


def plain_widen(x):
    return x.astype(FLOAT32) if x.dtype in HALF_DTYPES else x


def plain_rounded_float32(x, dtype, out=None):
    rounded = x.astype(dtype).astype(FLOAT32)
    if out is None:
        return rounded
    out[...] = rounded
    return out


def plain_unscale_all_finite(grads, inverse):
    with np.errstate(over="ignore", invalid="ignore"):
        for g in grads:
            g *= np.asarray(inverse, dtype=np.promote_types(g.dtype, np.float32))
    return all(np.isfinite(g).all() for g in grads)


@pytest.fixture
def plain_conversions(monkeypatch):
    """Every module that imported the conversions on the plain versions, no folded casts."""
    plain = {"narrow": (half_precision.narrow, plain_narrow),
             "widen": (half_precision.widen, plain_widen),
             "rounded_float32": (half_precision.rounded_float32, plain_rounded_float32)}

    def patch():
        for module in list(sys.modules.values()):
            if not getattr(module, "__name__", "").startswith("everyo"):
                continue
            for name, (fast, slow) in plain.items():
                if getattr(module, name, None) is fast:
                    monkeypatch.setattr(module, name, slow)
        # (the kernel table's entry: the selected provider's implementation, or the reference)
        monkeypatch.setitem(kernel.__dict__, "unscale_all_finite", plain_unscale_all_finite)
        monkeypatch.setattr(autocast_mode, "FOLD_WEIGHT_CASTS", False)
    return patch


def model_and_data():
    # NOTE: weights of more than 2 * BLOCK elements, so the block-wise fast paths run; a
    # convolution (cast nodes) and hidden Linear layers (folded casts), so that a folded
    # weight meets an activation that needs a gradient.
    model = eo.Sequential(
        eo.Conv2D(128, 128, 3, padding="same", seed=0), eo.ReLU(), eo.Flatten(),
        eo.Linear(4 * 4 * 128, 512, seed=1), eo.ReLU(), eo.Linear(512, 512, seed=2), eo.ReLU(),
        eo.Linear(512, 10, seed=3))
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.standard_normal((8, 4, 4, 128)).astype(np.float32))
    y = eo.tensor(rng.integers(0, 10, 8))
    return model, x, y


def train(dtype: str, scaled: bool, steps: int = 3, hook: bool = False,
          init_scale: float = 2.0**12) -> list:
    """Every parameter gradient and value after each step, as raw bits."""
    model, x, y = model_and_data()
    params = list(model.parameters())
    if hook:  # (any hook sends backward through the general engine)
        params[2].register_hook(lambda g: None)
    optimizer = eo.SGD(params, lr=0.05, momentum=0.9)
    scaler = eo.GradScaler(init_scale=init_scale) if scaled else None
    record = []
    for _ in range(steps):
        optimizer.zero_grad()
        with eo.autocast(dtype=dtype):
            loss = eo.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.backward(loss)
            scaler.unscale_(optimizer)
            record.append(scaler.step(optimizer))
            scaler.update()
        record += [p.grad.view(np.uint32).copy() for p in params]
        record += [p.data.view(np.uint32).copy() for p in params]
    return record


def assert_same_bits(fast: list, plain: list) -> None:
    assert len(fast) == len(plain)
    for got, expected in zip(fast, plain):
        assert np.array_equal(got, expected)


@pytest.mark.parametrize(("dtype", "scaled"), [("bfloat16", False), ("float16", True)])
@pytest.mark.parametrize("keeps", ["default", "every format", "none"])
def test_training_steps_are_bit_identical_to_cast_nodes_with_plain_conversions(
        dtype, scaled, keeps, plain_conversions, monkeypatch):
    # (the folded product keeps its rounded weight for backward, or rounds it again there)
    kept = {"default": linalg.KEEPS_ROUNDED_WEIGHT, "every format": HALF_DTYPES,
            "none": frozenset()}[keeps]
    monkeypatch.setattr(linalg, "KEEPS_ROUNDED_WEIGHT", kept)
    fast, through_hooks = train(dtype, scaled), train(dtype, scaled, hook=True)
    plain_conversions()
    plain = train(dtype, scaled)
    assert_same_bits(fast, plain)
    assert_same_bits(through_hooks, plain)


def test_overflowing_loss_scales_take_the_same_steps(plain_conversions):
    # (gradients scaled into float16's top binade and beyond it: inf, skipped steps)
    fast = [train("float16", True, steps=4, init_scale=2.0**s) for s in (20, 26)]
    plain_conversions()
    plain = [train("float16", True, steps=4, init_scale=2.0**s) for s in (20, 26)]
    for got, expected in zip(fast, plain):
        assert_same_bits(got, expected)
    assert False in fast[1][::len(fast[1]) // 4]  # (the guard: some step was skipped)


def test_the_plain_reference_differs_from_float32_training():
    """Guard: the comparison above is between 16-bit runs, not two float32 runs."""
    model, x, y = model_and_data()
    with eo.autocast(dtype="float16"):
        half = eo.cross_entropy(model(x), y).item()
    assert half != eo.cross_entropy(model(x), y).item()


# -- what the folded weight cast looks like, and where it is not taken --------------------------


def linear(dtype="float32", bias=True):
    layer = eo.Linear(600, 300, bias=bias, seed=0)  # (180,000 weights: the block-wise path)
    x = eo.tensor(np.random.default_rng(1).standard_normal((4, 600)).astype(dtype))
    return layer, x


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_product_takes_the_float32_weight_and_no_cast_node_is_made(dtype):
    layer, x = linear()
    x.requires_grad = True
    with eo.autocast(dtype=dtype):
        y = layer(x)
    op = y._ctx
    assert y.dtype == dtype and type(op).name == "matmul" and op.attrs["lower"] == np.dtype(dtype)
    assert op.parents[1] is layer.weight and op.parents[2] is layer.bias
    assert op.parents[0].dtype == dtype  # the activation still goes through its cast node
    assert type(op.parents[0]._ctx).name == "cast"


def test_another_interceptor_sees_cast_nodes_not_a_folded_weight():
    from everyo.dispatch import intercepting

    seen = []

    def record(name, operands, attrs, proceed):
        seen.append((name, [getattr(o, "dtype", None) for o in operands], sorted(attrs)))
        return proceed(operands, attrs)

    layer, x = linear()
    with intercepting(record), eo.autocast():
        layer(x)
    assert ("matmul", ["float16"] * 3, []) in seen


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_second_derivatives_through_a_folded_product_match_cast_nodes(dtype, monkeypatch):
    def grads(fold: bool):
        monkeypatch.setattr(autocast_mode, "FOLD_WEIGHT_CASTS", fold)
        layer, x = linear()
        x.requires_grad = True
        with eo.autocast(dtype=dtype):
            y = layer(x).astype("float32")
        (gx,) = eo.grad((y * y).sum(), [x], create_graph=True)
        (gx * gx).sum().backward()
        return gx.data, layer.weight.grad, layer.bias.grad

    (gx, gw, gb), (gx_cast, gw_cast, gb_cast) = grads(True), grads(False)
    assert np.array_equal(gx.view(np.uint32), gx_cast.view(np.uint32))  # first derivative
    assert gw.dtype == gb.dtype == np.float32
    # NOTE: the weight meets the second backward twice (in the product and in its gradient).
    # Through one shared cast node the two 16-bit contributions are summed in 16 bits, then
    # widened; folded, each is widened on its own and they are summed in float32 (as for a
    # weight used twice, which gets two cast nodes): one 16-bit rounding apart.
    spacing = {"float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    np.testing.assert_allclose(gw, gw_cast, rtol=spacing, atol=0)
    np.testing.assert_allclose(gb, gb_cast, rtol=spacing, atol=0)


def test_a_weight_changed_in_place_before_backward_is_refused():
    layer, x = linear()
    with eo.autocast():
        y = layer(eo.tensor(x.data, requires_grad=True))  # (backward reads the weight)
    with eo.no_grad():
        layer.weight.mul_(2.0)
    with pytest.raises(EveryOError, match="modified in place"):
        y.astype("float32").sum().backward()


def test_float64_inputs_small_and_tensor_weights_keep_cast_nodes():
    small = eo.Linear(8, 3, seed=0)  # below FOLD_MIN_ELEMENTS
    with eo.autocast():
        y = small(eo.ones(2, 8, requires_grad=True))
    assert "lower" not in y._ctx.attrs and type(y._ctx.parents[1]._ctx).name == "cast"
    layer, x = linear("float64")
    with eo.autocast():
        y = layer(x)
    assert y.dtype == "float64" and "lower" not in y._ctx.attrs
    w = eo.randn(600, 300, seed=2)  # no gradient: not a master weight
    with eo.autocast():
        y = eo.ones(4, 600, requires_grad=True) @ w
    assert y.dtype == "float16" and "lower" not in y._ctx.attrs


def test_matmul_lower_refuses_what_it_cannot_compute():
    w = eo.Parameter(np.ones((3, 2), np.float32))
    for a, lower in [(eo.ones(3), "float16"), (eo.ones(4, 3, dtype="float64"), "float16"),
                     (eo.ones(4, 3), "float32"), (eo.ones(4, 3, dtype="bfloat16"), "float16")]:
        with pytest.raises(EveryOError, match="lower"):
            eo.dispatch("matmul", a, w, lower=np.dtype(lower) if lower != "bfloat16" else lower)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_batched_input_folds_to_the_same_bits(dtype, monkeypatch):
    def run(fold: bool):
        monkeypatch.setattr(autocast_mode, "FOLD_WEIGHT_CASTS", fold)
        layer, _ = linear()
        x = eo.tensor(np.random.default_rng(4).standard_normal((3, 5, 600)).astype(np.float32),
                      requires_grad=True)
        with eo.autocast(dtype=dtype):
            y = layer(x)
        y.astype("float32").sum().backward()
        return [y.data.view(np.uint16), x.grad.view(np.uint32),
                layer.weight.grad.view(np.uint32), layer.bias.grad.view(np.uint32)]

    for got, expected in zip(run(True), run(False)):
        assert np.array_equal(got, expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_weight_used_three_times_sums_its_contributions_in_another_order(dtype, monkeypatch):
    # NOTE: what docs/mixed_precision.md states: folded, the products reach the weight directly,
    # so with three or more uses its float32 contributions are summed in another order than
    # through cast nodes: last-bit differences in its gradient only; hooks change nothing.
    rng = np.random.default_rng(5)
    weight = (rng.standard_normal((600, 600)) * 0.05).astype(np.float32)
    start = rng.standard_normal((4, 600)).astype(np.float32)

    def run(fold: bool, steps: int, hook: bool = False):
        monkeypatch.setattr(autocast_mode, "FOLD_WEIGHT_CASTS", fold)
        w = eo.Parameter(weight.copy())
        if hook:
            w.register_post_accumulate_grad_hook(lambda p: None)
        x = eo.tensor(start.copy(), requires_grad=True)
        h = x
        with eo.autocast(dtype=dtype):
            for _ in range(steps):  # (an unrolled recurrence: one weight, `steps` products)
                h = eo.tanh(h @ w)
        (h.astype("float32") ** 2).sum().backward()
        return x.grad, w.grad

    for steps in (2, 4):
        (gx, gw), (gx_cast, gw_cast) = run(True, steps), run(False, steps)
        assert np.array_equal(gx, gx_cast)
        assert np.array_equal(gw, run(True, steps, hook=True)[1])
        if steps == 2:
            assert np.array_equal(gw, gw_cast)
        else:  # (a float32 sum of 4 terms in another order: a few ulps of the largest term;
            # bfloat16's 8-bit terms mostly sum exactly in either order)
            assert (dtype == "float16") <= np.count_nonzero(gw != gw_cast) < gw.size // 1000
            np.testing.assert_allclose(gw, gw_cast, rtol=0, atol=8 * np.spacing(
                np.abs(gw_cast).max()))
