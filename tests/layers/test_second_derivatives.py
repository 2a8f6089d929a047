"""Second derivatives of the layers' fused ops (through their ``composite``): eo.gradgradcheck in
float64, and torch.autograd.grad(create_graph=True) as the oracle."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def _distinct(*shape):  # no ties: max pooling's winner is unique
    return lambda rng: (rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0
                        + rng.uniform(0, 0.05, shape))


def _away_from_zero(*shape):
    def build(rng):
        x = rng.standard_normal(shape)
        return np.where(np.abs(x) < 0.1, 0.3 * np.sign(x + 1e-12), x)
    return build


def _nchw(t):
    return t.permute(0, 3, 1, 2)


def _nhwc(t):
    return t.permute(0, 2, 3, 1)


def _F():
    import torch.nn.functional as F

    return F


def _torch():
    import torch

    return torch


SAME = ((1, 1), (1, 1))
MASK = np.where(np.triu(np.ones((3, 4)), 2) > 0, -np.inf, 0.0)
TOKENS = np.array([[0, 2, 1], [3, 1, 1]])
CLASSES = np.array([2, 0, 1, 2])
IGNORED = np.array([2, -100, 1, 0])
PROBS = np.random.default_rng(9).dirichlet(np.ones(3), size=4)
RUNNING = (np.array([0.1, -0.2, 0.3]), np.array([0.9, 1.3, 0.7]))

CASES = [
    ("conv2d_same_bias",
     lambda x, w, b: eo.dispatch("conv2d", x, w, b, stride=(1, 1), padding=SAME),
     lambda x, w, b: _nhwc(_F().conv2d(_nchw(x), w.permute(3, 2, 0, 1), b, padding=1)),
     [_normal(2, 4, 4, 2), _normal(3, 3, 2, 3), _normal(3)]),
    ("conv2d_stride2_dilation",
     lambda x, w: eo.dispatch("conv2d", x, w, stride=(2, 2), dilation=(2, 1)),
     lambda x, w: _nhwc(_F().conv2d(_nchw(x), w.permute(3, 2, 0, 1), stride=2, dilation=(2, 1))),
     [_normal(1, 7, 6, 2), _normal(2, 2, 2, 2)]),
    ("max_pool2d",
     lambda x: eo.dispatch("max_pool2d", x, pool_size=(2, 2)),
     lambda x: _nhwc(_F().max_pool2d(_nchw(x), 2)), [_distinct(2, 4, 4, 2)]),
    ("max_pool2d_overlapping",
     lambda x: eo.dispatch("max_pool2d", x, pool_size=(3, 3), stride=(1, 1)),
     lambda x: _nhwc(_F().max_pool2d(_nchw(x), 3, stride=1)), [_distinct(1, 5, 4, 2)]),
    ("avg_pool2d",
     lambda x: eo.dispatch("avg_pool2d", x, pool_size=(2, 2)),
     lambda x: _nhwc(_F().avg_pool2d(_nchw(x), 2)), [_normal(2, 4, 4, 2)]),
    ("avg_pool2d_padded",
     lambda x: eo.dispatch("avg_pool2d", x, pool_size=(3, 3), stride=(1, 1), padding=SAME),
     lambda x: _nhwc(_F().avg_pool2d(_nchw(x), 3, stride=1, padding=1, count_include_pad=False)),
     [_normal(1, 4, 3, 2)]),
    ("gelu", lambda x: eo.dispatch("gelu", x), lambda x: _F().gelu(x), [_normal(3, 4)]),
    ("gelu_tanh", lambda x: eo.dispatch("gelu", x, approximate="tanh"),
     lambda x: _F().gelu(x, approximate="tanh"), [_normal(3, 4)]),
    ("leaky_relu", lambda x: eo.dispatch("leaky_relu", x, negative_slope=0.2),
     lambda x: _F().leaky_relu(x, 0.2), [_away_from_zero(3, 4)]),
    ("layer_norm",
     lambda x, w, b: eo.dispatch("layer_norm", x, w, b, ndims=1, eps=1e-5),
     lambda x, w, b: _F().layer_norm(x, (4,), w, b, eps=1e-5),
     [_normal(3, 4), _normal(4), _normal(4)]),
    ("batch_norm_training",
     lambda x, w, b: eo.dispatch("batch_norm", x, w, b, training=True, eps=1e-5),
     lambda x, w, b: _F().batch_norm(x, None, None, w, b, training=True, eps=1e-5),
     [_normal(5, 3), _normal(3), _normal(3)]),
    ("batch_norm_eval",
     lambda x, w, b: eo.dispatch("batch_norm", x, w, b, running_mean=RUNNING[0],
                                 running_var=RUNNING[1], training=False, eps=1e-5),
     lambda x, w, b: _F().batch_norm(x, _torch().tensor(RUNNING[0]),
                                     _torch().tensor(RUNNING[1]), w, b, training=False,
                                     eps=1e-5),
     [_normal(5, 3), _normal(3), _normal(3)]),
    ("attention_weights_masked",
     lambda q, k: eo.dispatch("attention_weights", q, k, scale=0.5, mask=MASK),
     lambda q, k: (q @ k.transpose(-1, -2) * 0.5 + _torch().tensor(MASK)).softmax(-1),
     [_normal(2, 3, 5), _normal(2, 4, 5)]),
    ("embedding",
     lambda w: eo.dispatch("embedding", w, indices=TOKENS) ** 2,
     lambda w: _F().embedding(_torch().tensor(TOKENS), w) ** 2, [_normal(4, 3)]),
    ("cross_entropy_smoothing",
     lambda x: eo.cross_entropy(x, CLASSES, label_smoothing=0.1),
     lambda x: _F().cross_entropy(x, _torch().tensor(CLASSES), label_smoothing=0.1),
     [_normal(4, 3)]),
    ("cross_entropy_ignore_sum",
     lambda x: eo.cross_entropy(x, IGNORED, reduction="sum"),
     lambda x: _F().cross_entropy(x, _torch().tensor(IGNORED), reduction="sum"),
     [_normal(4, 3)]),
    ("cross_entropy_probabilities",
     lambda x: eo.cross_entropy(x, PROBS),
     lambda x: _F().cross_entropy(x, _torch().tensor(PROBS)), [_normal(4, 3)]),
    ("nll_loss_ignore",
     lambda x: eo.nll_loss(eo.log_softmax(x), IGNORED),
     lambda x: _F().nll_loss(x.log_softmax(-1), _torch().tensor(IGNORED)), [_normal(4, 3)]),
    ("mse_loss", lambda x, y: eo.mse_loss(x, y), lambda x, y: _F().mse_loss(x, y),
     [_normal(3, 4), _normal(3, 4)]),
    ("l1_loss_none", lambda x, y: eo.l1_loss(x, y, reduction="none") ** 2,
     lambda x, y: _F().l1_loss(x, y, reduction="none") ** 2,
     [_normal(3, 4), lambda rng: np.zeros((3, 4)) + 5.0]),
    ("bce_with_logits_pos_weight",
     lambda x, y: eo.binary_cross_entropy_with_logits(x, y, pos_weight=np.array([0.5, 2.0])),
     lambda x, y: _F().binary_cross_entropy_with_logits(
         x, y, pos_weight=_torch().tensor([0.5, 2.0])),
     [_normal(3, 2), lambda rng: rng.uniform(0, 1, (3, 2))]),
    ("bce_with_logits_at_zero",
     lambda x, y: eo.binary_cross_entropy_with_logits(x, y, reduction="sum"),
     lambda x, y: _F().binary_cross_entropy_with_logits(x, y, reduction="sum"),
     [lambda rng: np.array([0.0, 1.0, -2.0]), lambda rng: np.array([0.2, 0.5, 1.0])]),
    ("dropout_same_mask",
     lambda x: eo.dispatch("dropout", x, p=0.4, rng=np.random.default_rng(0)) ** 2,
     None, [_normal(3, 4)]),
]
IDS = [case[0] for case in CASES]


def _inputs(builders, seed):
    rng = np.random.default_rng(seed)
    return [build(rng) for build in builders]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradgradcheck(case):
    _, fn, _, builders = case
    assert eo.gradgradcheck(fn, *_inputs(builders, 1))


@pytest.mark.torch
@pytest.mark.parametrize("case", [c for c in CASES if c[2] is not None],
                         ids=[c[0] for c in CASES if c[2] is not None])
def test_second_derivative_against_pytorch(case, torch):
    _, fn, torch_fn, builders = case
    arrays = _inputs(builders, seed=4)
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


@pytest.mark.torch
def test_embedding_padding_row_gets_no_second_order_gradient_either(torch):
    w = eo.tensor(np.random.default_rng(0).standard_normal((4, 3)), requires_grad=True)
    out = eo.dispatch("embedding", w, indices=TOKENS, padding_idx=1)
    (g,) = eo.grad((out ** 2).sum(), w, create_graph=True)
    (gg,) = eo.grad((g ** 2).sum(), w)
    wt = torch.tensor(w.data, requires_grad=True)
    out_t = torch.nn.functional.embedding(torch.tensor(TOKENS), wt, padding_idx=1)
    (g_t,) = torch.autograd.grad((out_t ** 2).sum(), wt, create_graph=True)
    (gg_t,) = torch.autograd.grad((g_t ** 2).sum(), wt)
    np.testing.assert_allclose(g.data, g_t.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(gg.data, gg_t.numpy(), rtol=1e-12)
    assert not gg.data[1].any()


def test_fused_recurrent_ops_refuse_a_second_derivative_by_name():
    lstm = eo.LSTM(3, 4).to("float64")
    x = eo.tensor(np.random.default_rng(0).standard_normal((2, 5, 3)), requires_grad=True)
    out = lstm(x)
    out = out[0] if isinstance(out, tuple) else out
    (g,) = eo.grad(out.sum(), x, create_graph=True)
    (plain,) = eo.grad(lstm(x)[0].sum() if isinstance(lstm(x), tuple) else lstm(x).sum(), x)
    np.testing.assert_allclose(g.data, plain.data)  # first derivative values are right
    with pytest.raises(eo.EveryOError, match="'lstm'.*neither backward_graph nor composite"):
        eo.grad(g.sum(), x)


def test_every_layers_op_but_the_recurrent_ones_has_a_second_derivative():
    from everyo_layers import recurrent

    ops = eo.registry("ops").items
    recurrent_names = set(recurrent.OPS)
    missing = [name for name, cls in ops.items() if name not in recurrent_names
               and cls.backward_graph is None and cls.composite is None]
    assert missing == []


@pytest.mark.torch
def test_third_order_through_conv2d_and_max_pool_matches_pytorch(torch):
    """The gradient ops of conv2d and max_pool2d are differentiable themselves."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 6, 6, 2)), rng.standard_normal((3, 3, 2, 3)) * 0.5

    def chain(lib, conv, pool, x, w):
        out = lib.tanh(pool(conv(x, w)))
        (gx,) = grad(lib)(out.sum(), [x])
        (gw,) = grad(lib)((gx * gx).sum(), [w])
        return grad(lib, last=True)((gw * gw).sum(), [x])[0]

    def grad(lib, last=False):
        if lib is eo:
            return lambda y, xs: eo.grad(y, xs, create_graph=not last)
        return lambda y, xs: torch.autograd.grad(y, xs, create_graph=not last)

    ours = chain(eo, lambda a, b: eo.dispatch("conv2d", a, b, stride=(1, 1), padding=SAME),
                 lambda a: eo.dispatch("max_pool2d", a, pool_size=(2, 2)),
                 eo.tensor(x, requires_grad=True), eo.tensor(w, requires_grad=True))
    theirs = chain(torch, lambda a, b: _nhwc(_F().conv2d(_nchw(a), b.permute(3, 2, 0, 1),
                                                         padding=1)),
                   lambda a: _nhwc(_F().max_pool2d(_nchw(a), 2)),
                   torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True))
    np.testing.assert_allclose(ours.data, theirs.numpy(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name, attrs, operands", [
    ("conv2d", {"stride": (2, 1), "padding": SAME, "dilation": (1, 2)}, 3),
    ("max_pool2d", {"pool_size": (2, 2), "stride": (1, 1), "padding": ((0, 1), (1, 0))}, 1),
    ("avg_pool2d", {"pool_size": (3, 2), "padding": SAME}, 1),
])
def test_composites_reproduce_the_fused_forward(name, attrs, operands):
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((2, 5, 6, 2)), rng.standard_normal((3, 3, 2, 4)),
              rng.standard_normal(4)][:operands]
    tensors = [eo.tensor(a, requires_grad=True) for a in arrays]
    out = eo.dispatch(name, *tensors, **attrs)
    np.testing.assert_allclose(out._ctx.composite(*tensors).data, out.data, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("target", [CLASSES, IGNORED, PROBS], ids=["classes", "ignored", "probs"])
def test_cross_entropy_composite_reproduces_the_fused_loss(target):
    x = eo.tensor(np.random.default_rng(8).standard_normal((4, 3)), requires_grad=True)
    out = eo.cross_entropy(x, target, label_smoothing=0.2)
    np.testing.assert_allclose(out._ctx.composite(x).data, out.data, rtol=1e-12)
