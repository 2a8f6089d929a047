"""eo.grad semantics and what higher-order gradients are used for: gradient penalties,
Hessian-vector products, physics-informed losses (u_xx) and one-step MAML, against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def _mlp(x, w1, b1, w2, b2):
    return eo.tanh(x @ w1 + b1) @ w2 + b2


def _same_grads(ours, theirs, rtol=1e-10, atol=1e-12):
    for a, b in zip(ours, theirs):
        if b.grad is None:  # not reached by the graph: PyTorch leaves None, so must we
            assert a.grad is None
        else:
            np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=rtol, atol=atol)


def _mlp_arrays(rng):
    return [rng.standard_normal((3, 5)) * 0.7, rng.standard_normal(5) * 0.1,
            rng.standard_normal((5, 1)) * 0.7, rng.standard_normal(1) * 0.1]


# -- eo.grad semantics ------------------------------------------------------------------------

def test_grad_leaves_dot_grad_alone_and_returns_tensors():
    x = eo.tensor(np.array([1.0, 2.0]), requires_grad=True)
    (g,) = eo.grad((x * x).sum(), x)
    np.testing.assert_array_equal(g.data, [2.0, 4.0])
    assert x.grad is None and not g.requires_grad


def test_grad_of_an_intermediate_and_several_outputs():
    x = eo.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * 3.0
    y1, y2 = (h * h).sum(), h.sum()
    gh, gx = eo.grad([y1, y2], [h, x], retain_graph=True)
    np.testing.assert_allclose(gh.data, 2 * h.data + 1)
    np.testing.assert_allclose(gx.data, 3 * (2 * h.data + 1))
    (gx_weighted,) = eo.grad([y1, y2], [x], grad_outputs=[eo.tensor(np.float64(2.0)),
                                                          eo.tensor(np.float64(0.0))])
    np.testing.assert_allclose(gx_weighted.data, 2 * 3 * 2 * h.data)


def test_grad_unused_input_raises_unless_allowed():
    x = eo.tensor(np.ones(2), requires_grad=True)
    z = eo.tensor(np.ones(2), requires_grad=True)
    y = (x * 2.0).sum()
    with pytest.raises(eo.EveryOError, match="input 1 .*not used.*allow_unused"):
        eo.grad(y, [x, z], retain_graph=True)
    gx, gz = eo.grad(y, [x, z], allow_unused=True)
    assert gz is None and np.all(gx.data == 2.0)


def test_grad_with_an_input_listed_twice_returns_it_twice():
    # PyTorch's autograd.grad answers every listed input; the second copy was reported unused
    x = eo.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 5.0
    gx1, gy, gx2 = eo.grad((x * y).sum(), [x, y, x])
    np.testing.assert_array_equal(gx1.data, [10.0, 20.0])
    np.testing.assert_array_equal(gx2.data, gx1.data)
    np.testing.assert_array_equal(gy.data, [1.0, 2.0])


def test_grad_of_a_non_tensor_output_is_named():
    x = eo.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(eo.EveryOError, match="output 0 is a ndarray, not a Tensor"):
        eo.grad([np.ones(2)], x)  # was an AttributeError on .requires_grad


def test_gradcheck_takes_bfloat16_inputs_as_floating():
    # bfloat16's NumPy kind is "V": such an input was treated as a constant, and the check
    # then failed with "backward() on a tensor that does not require grad"
    x = eo.tensor([1.5, -2.0]).to("bfloat16").data
    assert eo.gradcheck(lambda a: (a * a * a).sum(), x)
    assert eo.gradgradcheck(lambda a: (a * a * a).sum(), x)


def test_grad_frees_the_graph_unless_retained():
    x = eo.tensor(np.ones(2), requires_grad=True)
    y = (x.exp()).sum()
    eo.grad(y, x)
    with pytest.raises(eo.EveryOError, match="already freed"):
        eo.grad(y, x)


def test_grad_argument_errors():
    x = eo.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(eo.EveryOError, match="input 0 does not require grad"):
        eo.grad((x * 2).sum(), eo.ones(2))
    with pytest.raises(eo.EveryOError, match="one-element"):
        eo.grad(x * 2, x)


def test_backward_create_graph_keeps_values_and_graph():
    x = eo.tensor(np.array([2.0]), requires_grad=True)
    y = (x ** 3).sum()
    y.backward(create_graph=True)
    np.testing.assert_allclose(x.grad, [12.0])
    y.backward()  # create_graph retained the graph
    np.testing.assert_allclose(x.grad, [24.0])


def test_third_derivative():
    x = eo.tensor(np.array([0.3, -1.2]), requires_grad=True)
    y = eo.sin(x).sum() if hasattr(eo, "sin") else (eo.exp(x * 2.0)).sum()
    (g1,) = eo.grad(y, x, create_graph=True)
    (g2,) = eo.grad(g1.sum(), x, create_graph=True)
    (g3,) = eo.grad(g2.sum(), x)
    np.testing.assert_allclose(g3.data, 8 * np.exp(2 * x.data))


# -- an op without a second derivative is refused, never wrong -------------------------------

class _Cube(eo.Op):
    __slots__ = ()
    name = "test_cube"

    def forward(self, x):
        self.saved = x
        return x ** 3

    def backward(self, g):
        return (3 * self.saved ** 2 * g,)


def test_an_op_without_backward_graph_gives_values_then_refuses():
    x = eo.tensor(np.array([2.0]), requires_grad=True)
    (g,) = eo.grad(_Cube.apply(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.data, [12.0])  # the first derivative is right
    with pytest.raises(eo.EveryOError, match="'test_cube'.*neither backward_graph nor composite"):
        eo.grad(g.sum(), x)


class _CubeComposite(_Cube):
    __slots__ = ()

    def composite(self, x):
        return x * x * x


class _CubeWrongGraph(_Cube):
    __slots__ = ()

    def backward_graph(self, g, out):
        (x,) = self.parents
        return (g * x * x * 2.0,)  # wrong: should be 3 x**2


def test_composite_gives_the_second_derivative():
    assert eo.gradgradcheck(lambda x: _CubeComposite.apply(x), np.array([0.5, -1.5]))


def test_gradgradcheck_catches_a_wrong_backward_graph():
    with pytest.raises(eo.GradcheckError, match="backward_graph"):
        eo.gradgradcheck(lambda x: _CubeWrongGraph.apply(x), np.array([0.5, -1.5]))


def test_every_core_op_has_a_second_derivative():
    from everyo.ops import core_ops

    missing = [name for name, cls in core_ops().items() if cls.differentiable
               and cls.backward_graph is None and cls.composite is None]
    assert missing == []


def test_an_op_without_slots_works_as_a_notebook_would_write_it():
    class Cube(eo.Op):  # (no __slots__, stores an attribute of its own)
        def forward(self, x):
            self.x = x
            return x ** 3

        def backward(self, g):
            return (3 * self.x ** 2 * g,)

        def backward_graph(self, g, out):
            (x,) = self.parents
            return (g * x * x * 3.0,)

    assert eo.gradcheck(lambda x: Cube.apply(x), np.array([0.5, -1.5]))
    assert eo.gradgradcheck(lambda x: Cube.apply(x), np.array([0.5, -1.5]))
    x = eo.tensor([2.0], requires_grad=True)
    x.register_hook(lambda g: g)  # (the general engine too)
    Cube.apply(x).sum().backward()
    assert x.grad.tolist() == [12.0]


def test_every_first_party_op_declares_slots():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    first_party = ("everyo", "everyo_layers", "everyo_amp", "everyo_onnx", "everyo_dist",
                   "everyo_numba")
    ops = {cls for cls in subclasses(eo.Op) if cls.__module__.split(".")[0] in first_party}
    assert len(ops) > 60  # (the core's and every first-party plugin's, registered or not)
    # NOTE: one class in the chain without __slots__ gives every instance a __dict__
    with_dict = sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in ops
                       if hasattr(object.__new__(cls), "__dict__"))
    assert with_dict == []


# -- what higher-order gradients are for, against PyTorch --------------------------------------

@pytest.mark.torch
def test_gradient_penalty_matches_pytorch(torch):
    rng = np.random.default_rng(0)
    params = _mlp_arrays(rng)
    x = rng.standard_normal((4, 3))
    ours = [eo.tensor(p, requires_grad=True) for p in params]
    xo = eo.tensor(x, requires_grad=True)
    (gx,) = eo.grad(_mlp(xo, *ours).sum(), xo, create_graph=True)
    penalty = ((gx ** 2).sum(axis=1) - 1.0) ** 2
    penalty.mean().backward()

    theirs = [torch.tensor(p, requires_grad=True) for p in params]
    xt = torch.tensor(x, requires_grad=True)
    out = torch.tanh(xt @ theirs[0] + theirs[1]) @ theirs[2] + theirs[3]
    (gxt,) = torch.autograd.grad(out.sum(), xt, create_graph=True)
    (((gxt ** 2).sum(dim=1) - 1.0) ** 2).mean().backward()
    _same_grads(ours, theirs)


@pytest.mark.torch
def test_hessian_vector_product_matches_pytorch(torch):
    rng = np.random.default_rng(1)
    params = _mlp_arrays(rng)
    x, y = rng.standard_normal((6, 3)), rng.standard_normal((6, 1))
    vs = [rng.standard_normal(p.shape) for p in params]
    ours = [eo.tensor(p, requires_grad=True) for p in params]
    loss = ((_mlp(eo.tensor(x), *ours) - y) ** 2).mean()
    grads = eo.grad(loss, ours, create_graph=True)
    dot = sum(((g * v).sum() for g, v in zip(grads, vs)), eo.tensor(np.float64(0.0)))
    hvp = eo.grad(dot, ours)

    theirs = [torch.tensor(p, requires_grad=True) for p in params]
    out = torch.tanh(torch.tensor(x) @ theirs[0] + theirs[1]) @ theirs[2] + theirs[3]
    loss_t = ((out - torch.tensor(y)) ** 2).mean()
    grads_t = torch.autograd.grad(loss_t, theirs, create_graph=True)
    hvp_t = torch.autograd.grad(sum((g * torch.tensor(v)).sum() for g, v in zip(grads_t, vs)),
                                theirs)
    for a, b in zip(hvp, hvp_t):
        np.testing.assert_allclose(a.data, b.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.torch
def test_physics_informed_u_xx_matches_pytorch(torch):
    """Loss of u'' + sin-like forcing for u(x) = MLP(x) on a batch of collocation points."""
    rng = np.random.default_rng(2)
    params = [rng.standard_normal((1, 8)), rng.standard_normal(8) * 0.1,
              rng.standard_normal((8, 1)), rng.standard_normal(1) * 0.1]
    xs = rng.uniform(-1, 1, (5, 1))
    ours = [eo.tensor(p, requires_grad=True) for p in params]
    x = eo.tensor(xs, requires_grad=True)
    u = _mlp(x, *ours)
    (u_x,) = eo.grad(u.sum(), x, create_graph=True)
    (u_xx,) = eo.grad(u_x.sum(), x, create_graph=True)
    residual = ((u_xx + x * x) ** 2).mean()
    residual.backward()

    theirs = [torch.tensor(p, requires_grad=True) for p in params]
    xt = torch.tensor(xs, requires_grad=True)
    ut = torch.tanh(xt @ theirs[0] + theirs[1]) @ theirs[2] + theirs[3]
    (ut_x,) = torch.autograd.grad(ut.sum(), xt, create_graph=True)
    (ut_xx,) = torch.autograd.grad(ut_x.sum(), xt, create_graph=True)
    ((ut_xx + xt * xt) ** 2).mean().backward()
    np.testing.assert_allclose(u_xx.data, ut_xx.detach().numpy(), rtol=1e-10, atol=1e-12)
    _same_grads(ours, theirs, rtol=1e-9, atol=1e-11)


@pytest.mark.torch
def test_one_step_maml_matches_pytorch(torch):
    rng = np.random.default_rng(3)
    params = _mlp_arrays(rng)
    xs, ys = rng.standard_normal((5, 3)), rng.standard_normal((5, 1))
    xq, yq = rng.standard_normal((5, 3)), rng.standard_normal((5, 1))
    inner_lr = 0.1

    ours = [eo.tensor(p, requires_grad=True) for p in params]
    inner = ((_mlp(eo.tensor(xs), *ours) - ys) ** 2).mean()
    grads = eo.grad(inner, ours, create_graph=True)
    adapted = [p - g * inner_lr for p, g in zip(ours, grads)]
    outer = ((_mlp(eo.tensor(xq), *adapted) - yq) ** 2).mean()
    outer.backward()

    theirs = [torch.tensor(p, requires_grad=True) for p in params]

    def mlp_t(x, w1, b1, w2, b2):
        return torch.tanh(x @ w1 + b1) @ w2 + b2

    inner_t = ((mlp_t(torch.tensor(xs), *theirs) - torch.tensor(ys)) ** 2).mean()
    grads_t = torch.autograd.grad(inner_t, theirs, create_graph=True)
    adapted_t = [p - g * inner_lr for p, g in zip(theirs, grads_t)]
    ((mlp_t(torch.tensor(xq), *adapted_t) - torch.tensor(yq)) ** 2).mean().backward()
    _same_grads(ours, theirs)
