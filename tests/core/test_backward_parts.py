"""``Op.backward_parts``: with post-accumulate hooks registered, a parameter is finalised (its
``.grad`` accumulated, its hooks run) as soon as its op has produced its gradient, before the
op computes its other operands' gradients. Gradients, second derivatives and version-counter
checks are exactly what they are without it."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError
from everyo.ops import linalg

RNG = np.random.default_rng(7)


def _array(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _record_matmuls(monkeypatch, events):
    real = linalg.blas_matmul

    def recording(a, b, *args, **kwargs):
        events.append(f"matmul {a.shape}x{b.shape}")
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(linalg, "blas_matmul", recording)


def test_a_weight_is_final_before_its_op_computes_the_input_gradient(monkeypatch):
    x0 = eo.tensor(_array(4, 3), requires_grad=True)
    weight = eo.Parameter(_array(3, 2))
    bias = eo.Parameter(_array(2))
    hidden = eo.tanh(x0)
    out = eo.dispatch("matmul", hidden, weight, bias)
    events: list = []
    _record_matmuls(monkeypatch, events)
    weight.register_post_accumulate_grad_hook(lambda p: events.append("weight final"), early=True)
    bias.register_post_accumulate_grad_hook(lambda p: events.append("bias final"), early=True)
    out.sum().backward()
    # bias (no product), then the weight's product and its hook, then the input's product
    assert events == ["bias final", "matmul (3, 4)x(4, 2)", "weight final",
                      "matmul (4, 2)x(2, 3)"]


def test_without_post_accumulate_hooks_the_order_is_the_plain_backward(monkeypatch):
    weight = eo.Parameter(_array(3, 2))
    x0 = eo.tensor(_array(4, 3), requires_grad=True)
    out = eo.tanh(x0) @ weight
    events: list = []
    _record_matmuls(monkeypatch, events)
    out.sum().backward()
    assert events == ["matmul (4, 2)x(2, 3)", "matmul (3, 4)x(4, 2)"]
    assert weight.grad is not None and x0.grad is not None


def test_conv2d_weight_and_bias_are_final_before_the_input_gradient(monkeypatch):
    from everyo_layers.conv import Conv2DOp

    layers = eo.Sequential(eo.Conv2D(2, 3, 3, padding="same", seed=0), eo.ReLU(),
                           eo.Conv2D(3, 4, 3, padding="same", seed=1))
    second = layers[2]
    events: list = []
    real = Conv2DOp._input_grad

    def recording(self, g2, w2):
        events.append(f"input gradient of {self.w_shape}")
        return real(self, g2, w2)

    monkeypatch.setattr(Conv2DOp, "_input_grad", recording)
    second.weight.register_post_accumulate_grad_hook(lambda p: events.append("weight final"),
                                                     early=True)
    second.bias.register_post_accumulate_grad_hook(lambda p: events.append("bias final"),
                                                   early=True)
    layers(eo.tensor(_array(2, 5, 5, 2))).sum().backward()
    assert events == ["bias final", "weight final", "input gradient of (3, 3, 3, 4)"]


def _model():
    return eo.Sequential(eo.Conv2D(2, 3, 3, padding="same", seed=0), eo.ReLU(),
                         eo.Flatten(), eo.Linear(3 * 4 * 4, 8, seed=1), eo.Tanh(),
                         eo.Linear(8, 5, seed=2))


@pytest.mark.parametrize("early", [False, True])
def test_gradients_are_bit_identical_with_and_without_hooks(early):
    x, y = _array(6, 4, 4, 2), RNG.integers(0, 5, 6)
    grads = []
    for hooked in (False, True):
        model = _model()
        params = list(model.parameters())
        calls: list = []
        handles = [p.register_post_accumulate_grad_hook(calls.append, early=early) for p in params] \
            if hooked else []
        for _ in range(2):  # the second backward accumulates into existing .grad
            eo.cross_entropy(model(eo.tensor(x)), y).backward()
        grads.append([p.grad.copy() for p in params])
        for handle in handles:
            handle.remove()
        assert len(calls) == (2 * len(params) if hooked else 0)
    for plain, hooked in zip(*grads):
        assert plain.dtype == hooked.dtype and plain.tobytes() == hooked.tobytes()


def test_a_leaf_used_twice_by_one_op_gets_the_plain_backward_sum_order():
    values = _array(3, 3)
    results = []
    for hooked in (False, True):
        w = eo.Parameter(values)
        calls: list = []
        if hooked:
            w.register_post_accumulate_grad_hook(lambda p, calls=calls: calls.append(p.grad.copy()))
        # three contributions: the parts' order must not change how they are summed
        ((w @ w).sum() + (w * w).sum()).backward()
        results.append(w.grad)
        if hooked:
            assert len(calls) == 1 and calls[0].tobytes() == w.grad.tobytes()
    assert results[0].tobytes() == results[1].tobytes()


def test_second_derivatives_are_unchanged_by_registered_hooks():
    x = eo.tensor(_array(5, 3).astype(np.float64))
    values = _array(3, 2).astype(np.float64)
    found = []
    for hooked in (False, True):
        w = eo.Parameter(values)
        if hooked:
            w.register_post_accumulate_grad_hook(lambda p: None)
        (gw,) = eo.grad(eo.tanh(x @ w).sum(), w, create_graph=True)
        (hessian_row,) = eo.grad((gw * gw).sum(), w)
        found.append(hessian_row.data)
    assert found[0].tobytes() == found[1].tobytes()
    assert eo.gradgradcheck(lambda a, b: eo.tanh(a @ b), x.data[:2], values)


def test_a_weight_modified_in_place_after_forward_still_raises_and_runs_no_hook():
    weight = eo.Parameter(_array(3, 2))
    x0 = eo.tensor(_array(4, 3), requires_grad=True)
    calls: list = []
    weight.register_post_accumulate_grad_hook(calls.append)
    out = eo.tanh(x0) @ weight
    with eo.no_grad():
        weight.add_(1.0)
    with pytest.raises(EveryOError, match="modified in place"):
        out.sum().backward()
    assert calls == [] and weight.grad is None


def test_hooked_gradients_of_two_leaves_fed_the_same_array_are_independent():
    a, b = eo.Parameter(_array(3)), eo.Parameter(_array(3))
    a.register_post_accumulate_grad_hook(lambda p: None)
    (a + b).sum().backward()  # add's backward passes one array to both operands
    assert a.grad is not b.grad
    a.grad += 1.0
    assert not np.array_equal(a.grad, b.grad)


def test_backward_is_assembled_from_backward_parts():
    from everyo.kernels import gradients_from_parts

    class Swap(eo.Op):
        __slots__ = ()
        saved_inputs = ()
        saves_output = False

        def forward(self, a, b):
            return a * 2 + b * 3

        def backward_parts(self, g):
            yield 1, g * 3
            yield 0, g * 2

        def backward(self, g):
            return gradients_from_parts(self, g)

    a, b = eo.Parameter(_array(2)), eo.Parameter(_array(2))
    order: list = []
    a.register_post_accumulate_grad_hook(lambda p: order.append("a"), early=True)
    b.register_post_accumulate_grad_hook(lambda p: order.append("b"), early=True)
    Swap.apply(a, b).sum().backward()
    assert order == ["b", "a"]
    assert a.grad.tolist() == [2.0, 2.0] and b.grad.tolist() == [3.0, 3.0]


def test_the_lowered_matmul_autocast_uses_gives_the_same_bits_with_hooks():
    x_values, w_values, b_values = _array(4, 3), _array(3, 2), _array(2)
    grads = []
    for hooked in (False, True):
        x = eo.tensor(x_values, requires_grad=True)
        w, b = eo.Parameter(w_values), eo.Parameter(b_values)
        if hooked:
            w.register_post_accumulate_grad_hook(lambda p: None)
        out = eo.dispatch("matmul", eo.tanh(x), w, b, lower="float16")
        out.astype("float32").sum().backward()
        grads.append([t.grad.tobytes() for t in (x, w, b)])
    assert grads[0] == grads[1]


def test_a_gradient_a_leaf_hook_kept_is_not_the_leaf_grad():
    # (a hook that records the gradient it is handed: later in-place updates of .grad, by a
    # second backward, a GradScaler or clipping, must not rewrite what it recorded; PyTorch too)
    w = eo.Parameter(np.ones(3, np.float32))
    seen: list = []
    w.register_hook(lambda g: seen.append(g))
    (w * 2.0).sum().backward()
    (w * 3.0).sum().backward()
    assert np.array_equal(seen[0], [2.0, 2.0, 2.0]) and np.array_equal(w.grad, [5.0, 5.0, 5.0])


def _optimizer_in_backward(params, lr=0.5, early=False):
    """PyTorch's optimizer-in-backward pattern: each parameter steps as soon as it is final."""
    for p in params:
        optimizer = eo.SGD([p], lr=lr)

        def step(p, optimizer=optimizer):
            optimizer.step()
            optimizer.zero_grad()

        p.register_post_accumulate_grad_hook(step, early=early)


def _linear_in_backward(in_backward: bool, early: bool = False):
    x = eo.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), requires_grad=True)
    weight = eo.Parameter(np.linspace(0.5, -0.5, 6, dtype=np.float32).reshape(3, 2))
    bias = eo.Parameter(np.float32([0.1, -0.2]))
    if in_backward:
        _optimizer_in_backward([weight, bias], early=early)
    out = eo.dispatch("matmul", eo.tanh(x), weight, bias)
    (out * out).sum().backward()
    if not in_backward:
        _step_each([weight, bias])
    return x, weight, bias


def test_optimizer_in_backward_is_exact_with_hooks_registered_as_in_pytorch():
    # (a hook registered without early=True runs after the op's whole backward, as in
    # PyTorch: the input's gradient is computed from the weight the forward used)
    got, expected = _linear_in_backward(True), _linear_in_backward(False)
    assert np.array_equal(got[0].grad, expected[0].grad)
    for p, q in zip(got[1:], expected[1:]):
        assert np.array_equal(p.data, q.data)


def test_an_early_hook_writing_a_weight_its_op_still_reads_raises_not_a_stale_gradient():
    # (early=True promises no in-place writes; a hook breaking it on a weight the input's
    # gradient still reads would silently change that gradient)
    with pytest.raises(EveryOError, match="post-accumulate-grad or rows-ready hook"):
        _linear_in_backward(True, early=True)


def test_hooks_writing_parameters_no_later_part_reads_give_the_plain_gradients():
    # (optimizer in backward where nothing stale can be read: the first layer's input needs
    # no gradient, and a bias is read by no other operand's gradient)
    def run(in_backward: bool):
        model = eo.Sequential(eo.Conv2D(2, 3, 3, padding="same", seed=0), eo.ReLU(),
                              eo.Flatten(), eo.Linear(3 * 4 * 4, 5, seed=1))
        conv, linear = model[0], model[3]
        if in_backward:
            _optimizer_in_backward([conv.weight, conv.bias, linear.bias], early=True)
        loss = (model(eo.tensor(RNG_FIXED)) ** 2).sum()
        loss.backward()
        if not in_backward:
            _step_each([conv.weight, conv.bias, linear.bias])
        return [p.data for p in model.parameters()] + [linear.weight.grad]

    for got, expected in zip(run(True), run(False)):
        assert np.array_equal(got, expected)


RNG_FIXED = np.random.default_rng(11).standard_normal((2, 4, 4, 2)).astype(np.float32)


def test_optimizer_in_backward_on_a_folded_autocast_product_is_exact():
    # (the 16-bit product of a float32 weight computes its parts together before yielding
    # them: a weight updated by its hook cannot make another part stale, so nothing raises)
    rng = np.random.default_rng(3)
    start = rng.standard_normal((4, 600)).astype(np.float32)

    def run(in_backward: bool):
        layer = eo.Linear(600, 300, seed=0)  # (large enough for autocast to fold its cast)
        x = eo.tensor(start, requires_grad=True)
        if in_backward:
            _optimizer_in_backward(list(layer.parameters()), early=True)
        with eo.autocast():
            out = layer(eo.tanh(x))
        assert "lower" in out._ctx.attrs
        out.astype("float32").sum().backward()
        if not in_backward:
            _step_each(layer.parameters())
        return [x.grad] + [p.data for p in layer.parameters()]

    for got, expected in zip(run(True), run(False)):
        assert np.array_equal(got, expected)


def _step_each(params, lr=0.5):
    for p in params:
        eo.SGD([p], lr=lr).step()
