"""Version counters: backward through a value modified in place after the forward pass raises
an EveryOError naming the op, instead of computing a wrong gradient."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def test_optimizer_step_between_forward_and_backward_raises():
    w = eo.Parameter(np.array([2., 3.], np.float32))
    x = eo.tensor([1., 1.], requires_grad=True)
    opt = eo.SGD([w], lr=1.0)
    w.grad = np.ones(2, np.float32)
    y = (x * w).sum()
    opt.step()
    with pytest.raises(eo.EveryOError, match=r"'mul'.*operand 1 \(shape \(2,\).*version is now 1"):
        y.backward()


def test_step_before_forward_is_fine_and_uses_the_new_values():
    w = eo.Parameter(np.array([2., 3.], np.float32))
    x = eo.tensor([1., 1.], requires_grad=True)
    opt = eo.SGD([w], lr=1.0)
    w.grad = np.ones(2, np.float32)
    opt.step()
    (x * w).sum().backward()
    np.testing.assert_array_equal(x.grad, [1., 2.])


def test_a_saved_output_modified_in_place_raises():
    x = eo.tensor([0.5, 1.0], requires_grad=True)
    y = x.exp()
    z = y + 1.0  # add saves nothing: only exp's saved output is at stake
    with eo.no_grad():
        y.add_(1.0)
    with pytest.raises(eo.EveryOError, match=r"'exp'.*its output \(shape \(2,\)"):
        z.sum().backward()


def test_an_op_that_saved_nothing_ignores_the_write():
    w = eo.Parameter(np.array([2., 3.]))
    x = eo.tensor(np.array([1., 1.]), requires_grad=True)
    y = (x + w).sum()  # add needs neither operand's values in backward
    with eo.no_grad():
        w.mul_(10.0)
    y.backward()
    np.testing.assert_array_equal(x.grad, [1., 1.])


READ_ONLY_FOR_THE_OTHER = {  # (forward of a leaf x and a constant c, what is written after it)
    "x * c, x written": (lambda x, c: x * c, "x"),
    "x / c, x written": (lambda x, c: x / c, "x"),
    "c / x, the output written": (lambda x, c: c / x, "out"),
    "x @ c, x written": (lambda x, c: x @ c, "x"),
    "einsum of x and c, x written": (lambda x, c: eo.einsum("ij,jk->ik", x, c), "x"),
    "x ** c, the output written": (lambda x, c: x ** c, "out"),
}


@pytest.mark.parametrize("case", READ_ONLY_FOR_THE_OTHER)
def test_a_value_read_only_for_a_gradient_nobody_wants_may_be_written(case):
    # As PyTorch saves the ``a`` of ``a * b`` only when ``b`` needs a gradient: before, these
    # backward passes were refused although no gradient they compute reads the written value.
    forward, written = READ_ONLY_FOR_THE_OTHER[case]
    rng = np.random.default_rng(0)
    x0, c = rng.uniform(0.5, 1.5, (2, 2)), eo.tensor(rng.uniform(0.5, 1.5, (2, 2)))
    reference = eo.tensor(x0.copy(), requires_grad=True)
    forward(reference, c).sum().backward()
    x = eo.tensor(x0.copy(), requires_grad=True)
    out = forward(x, c)
    loss = out.sum()
    with eo.no_grad():
        (x if written == "x" else out).add_(1.0)
    loss.backward()
    np.testing.assert_array_equal(x.grad, reference.grad)


def test_a_value_read_for_a_wanted_gradient_is_still_checked():
    x, c = eo.tensor([1.0, 2.0], requires_grad=True), eo.tensor([3.0, 4.0])
    loss = (x * c).sum()
    with eo.no_grad():
        c.add_(1.0)
    with pytest.raises(eo.EveryOError, match=r"'mul'.*operand 1"):
        loss.backward()
    out = c / x
    loss = out.sum()
    with eo.no_grad():
        c.add_(1.0)  # (x's gradient, -c / x**2, reads c)
    with pytest.raises(eo.EveryOError, match=r"'div'.*operand 0"):
        loss.backward()


@pytest.mark.parametrize("make_view", [
    lambda base: base.reshape(4).reshape(2, 2),
    lambda base: base.T,
    lambda base: base[::-1],
    lambda base: base.detach(),
], ids=["reshape", "transpose", "slice", "detach"])
def test_views_share_the_counter_of_their_storage(make_view):
    base = eo.tensor(np.arange(4.0).reshape(2, 2))
    x = eo.tensor(np.ones((2, 2)), requires_grad=True)
    y = (x * make_view(base)).sum()
    base.add_(1.0)
    with pytest.raises(eo.EveryOError, match="'mul'"):
        y.backward()


def test_a_copy_is_not_a_view():
    base = eo.tensor(np.arange(4.0).reshape(2, 2))
    x = eo.tensor(np.ones(4), requires_grad=True)
    y = (x * base.T.reshape(4)).sum()  # a transposed reshape copies: the write cannot reach it
    base.add_(1.0)
    y.backward()
    np.testing.assert_array_equal(x.grad, [0.0, 2.0, 1.0, 3.0])


def test_writing_through_a_view_marks_the_base():
    base = eo.tensor(np.arange(6.0))
    x = eo.tensor(np.ones(6), requires_grad=True)
    y = (x * base).sum()
    view = base[1:3]
    view[0] = 100.0
    assert base._version == 1 and view._version == 1
    with pytest.raises(eo.EveryOError, match="'mul'"):
        y.backward()


def test_load_state_dict_bumps_parameters():
    model = eo.Linear(3, 2)
    state = {k: v * 2 for k, v in model.state_dict().items()}
    x = eo.ones(4, 3, requires_grad=True)
    loss = model(x).sum()
    model.load_state_dict(state)
    with pytest.raises(eo.EveryOError, match="modified in place"):
        loss.backward()


def test_bump_version_is_public_for_code_writing_data_itself():
    w = eo.Parameter(np.ones(3))
    x = eo.tensor(np.ones(3), requires_grad=True)
    y = (w * x).sum()
    w.data *= 3  # a raw write: not seen ...
    eo.bump_version(w)  # ... until the writer says so
    with pytest.raises(eo.EveryOError, match="'mul'"):
        y.backward()


def test_raw_data_writes_are_not_tracked():
    w = eo.Parameter(np.ones(3))
    x = eo.tensor(np.ones(3), requires_grad=True)
    y = (w * x).sum()
    w.data[0] = 5.0  # documented: the user's responsibility, as with PyTorch's .data
    y.backward()
    assert w._version == 0


def test_retained_graph_checks_again_on_the_second_backward():
    w = eo.Parameter(np.ones(2))
    x = eo.tensor(np.ones(2), requires_grad=True)
    y = (w * x).sum()
    y.backward(retain_graph=True)
    with eo.no_grad():
        w.zero_()
    with pytest.raises(eo.EveryOError, match="'mul'"):
        y.backward()


def test_eo_grad_checks_versions_too():
    w = eo.Parameter(np.ones(2))
    y = (w * w).sum()
    with eo.no_grad():
        w.fill_(2.0)
    with pytest.raises(eo.EveryOError, match="'mul'"):
        eo.grad(y, w)


# -- in-place methods -------------------------------------------------------------------------

def test_in_place_methods_compute_and_count():
    t = eo.tensor(np.array([1.0, 2.0]))
    t.add_(1.0).mul_(eo.tensor(np.array([2.0, 3.0]))).sub_(1.0).div_(2.0)
    np.testing.assert_allclose(t.data, [1.5, 4.0])
    t.clamp_(max=2.0)
    np.testing.assert_allclose(t.data, [1.5, 2.0])
    t.copy_(np.array([7.0, 8.0]))
    t[0] = 0.0
    np.testing.assert_allclose(t.data, [0.0, 8.0])
    t.zero_()
    assert t._version == 8 and not t.data.any()


def test_in_place_refuses_a_tensor_that_records_gradients():
    w = eo.Parameter(np.ones(2))
    with pytest.raises(eo.EveryOError, match="add_ on a tensor of shape \\(2,\\).*no_grad"):
        w.add_(1.0)
    plain = eo.zeros(2)
    with pytest.raises(eo.EveryOError, match="copy_"):
        plain.copy_(w)
    with eo.no_grad():
        w.add_(1.0)
    np.testing.assert_array_equal(w.data, [2.0, 2.0])


def test_in_place_bad_values_are_everyo_errors():
    t = eo.zeros(2, 3)
    with pytest.raises(eo.EveryOError, match="shape \\(4,\\)"):
        t.add_(np.ones(4))
    with pytest.raises(eo.EveryOError, match="shape \\(5,\\)"):
        t.copy_(np.ones(5))
    with pytest.raises(eo.EveryOIndexError, match="invalid index"):
        t[7] = 1.0
    with pytest.raises(eo.EveryOError, match="does not fit"):
        t[0] = np.ones(4)
    ints = eo.tensor(np.array([1, 2]))
    with pytest.raises(eo.EveryOError, match="int64"):
        ints.add_(0.5)


def test_var_operand_modified_in_place_raises_for_a_differentiable_gradient():
    # var's create_graph backward recomputes the centred values from its operand: a write
    # after the forward pass gave a silently wrong gradient (the new values' centring).
    x = eo.tensor(np.array([1., 2., 4.]), requires_grad=True)
    v = x.var()
    with eo.no_grad():
        x.add_(np.array([0., 0., 10.]))
    with pytest.raises(eo.EveryOError, match=r"'var'.*operand 0"):
        eo.grad(v, x, create_graph=True)


def test_clamp_in_place_bad_bounds_are_everyo_errors():
    # np.clip's broadcast ValueError and casting UFuncTypeError leaked out of clamp_
    with pytest.raises(eo.EveryOError, match=r"clamp_: .*shape \(3,\)"):
        eo.zeros(3).clamp_(np.zeros(2), None)
    ints = eo.tensor(np.array([1, 2, 3]))
    with pytest.raises(eo.EveryOError, match="clamp_: cannot clamp a int64"):
        ints.clamp_(0.5, 2.5)
    np.testing.assert_array_equal(eo.tensor(np.array([1., 5.])).clamp_(eo.tensor(2.0)).data,
                                  [2., 5.])


@pytest.mark.parametrize("make", [lambda x: x.sum(), lambda x: x.mean(), lambda x: x[0] * 3,
                                  lambda x: eo.exp(x[1]), lambda x: x.max()])
def test_in_place_writes_into_an_op_s_0d_result(make):
    # an op's 0-d result wrapped NumPy's scalar (np.float32), not a 0-d array: mul_ on it was
    # refused ("return arrays must be of ArrayType") and t[()] = v a raw TypeError
    x = eo.tensor(np.array([1.0, 2.0]), requires_grad=True)
    with eo.no_grad():
        s = make(x)
        assert isinstance(s.numpy(), np.ndarray)
        expected = float(s) * 2 + 1
        s.mul_(2.0)
        s[()] = s + 1.0
    assert float(s) == expected and s._version == 2
    y = make(x)
    z = eo.exp(y)  # exp saves its output: writing it after the forward is refused
    with eo.no_grad():
        z.add_(1.0)
    with pytest.raises(eo.EveryOError, match=r"'exp'.*its output"):
        z.backward()


def test_a_composite_second_derivative_refuses_an_operand_written_after_the_forward():
    # create_graph=True differentiates op.composite(*operands), which reads every operand:
    # an op whose first-order backward reads only a private array (saved_inputs=()) gave the
    # gradient of the new values, silently (HuberLoss, SmoothL1Loss, Conv2DTranspose,
    # InstanceNorm2D, GroupNorm)
    from everyo.autograd import Op

    class Cube(Op):
        __slots__ = ()
        saved_inputs = ()
        saves_output = False

        def forward(self, x):
            self.saved = 3 * x * x
            return x ** 3

        def backward(self, g):
            return (g * self.saved,)

        def composite(self, x):
            return x * x * x

    x = eo.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = Cube.apply(x)
    np.testing.assert_array_equal(eo.grad(y.sum(), x, create_graph=True)[0].data, [3.0, 12.0])
    y = Cube.apply(x)
    with eo.no_grad():
        x.add_(1.0)
    np.testing.assert_array_equal(eo.grad(y.sum(), x, retain_graph=True)[0].data, [3.0, 12.0])
    with pytest.raises(eo.EveryOError, match=r"'Cube'.*operand 0.*modified in place"):
        eo.grad(y.sum(), x, create_graph=True)


def test_augmented_assignment_under_no_grad_writes_the_parameter_in_place():
    # PyTorch's manual SGD step; before, `p -= ...` rebound the loop variable and the model's
    # parameters never changed
    model = eo.Linear(3, 2, seed=0)
    params = list(model.parameters())
    before = [p.data.copy() for p in params]
    eo.mean(model(eo.ones((4, 3))) ** 2).backward()
    with eo.no_grad():
        for p in params:
            p -= 0.1 * p.grad
    for p, old in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, old - np.float32(0.1) * p.grad)
        assert p._version == 1


@pytest.mark.parametrize("operator, expected", [("+=", [3.0, 4.0]), ("-=", [-1.0, 0.0]),
                                                ("*=", [2.0, 4.0]), ("/=", [0.5, 1.0])])
def test_augmented_assignment_of_plain_tensors_writes_in_place_as_pytorch(operator, expected):
    a = eo.tensor([1.0, 2.0])
    alias = a
    exec(f"alias {operator} 2.0")
    assert alias is a
    np.testing.assert_array_equal(a.data, np.float32(expected))


def test_augmented_assignment_that_records_gradients_computes_out_of_place():
    # a training forward's residual `out += identity`: the in-place write would be refused, so
    # the name is rebound to the recorded sum and the gradient flows through both terms
    x = eo.tensor([1.0, 2.0], requires_grad=True)
    out = x * 2.0
    first = out
    out += x
    assert out is not first
    out.sum().backward()
    np.testing.assert_array_equal(x.grad, np.float32([3.0, 3.0]))
