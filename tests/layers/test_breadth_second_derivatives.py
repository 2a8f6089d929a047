"""Second derivatives (eo.gradgradcheck, float64) of the ops added for layer breadth."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


@pytest.mark.parametrize("layer", [eo.SiLU(), eo.Softplus(beta=1.5, threshold=2.0),
                                   eo.ELU(alpha=0.5), eo.Hardswish(), eo.Mish()],
                         ids=lambda layer: type(layer).__name__)
def test_activations(rng, layer):
    x = rng.uniform(-5, 5, (3, 4))
    x = np.where(np.abs(np.abs(x) - 3) < 0.1, x + 0.3, x)  # off the kinks
    x = np.where(np.abs(x) < 0.1, x + 0.3, x)
    assert eo.gradgradcheck(lambda t: layer(t), x)


def test_group_and_rms_norm(rng):
    gn = eo.GroupNorm(2, 4).to("float64")
    rms = eo.RMSNorm(4).to("float64")
    gn.weight.data[...] = rng.standard_normal(4)
    rms.weight.data[...] = rng.standard_normal(4)
    assert eo.gradgradcheck(lambda x, w, b: eo.group_norm(x, w, b, groups=2, eps=1e-5),
                            rng.standard_normal((2, 3, 4)), rng.standard_normal(4),
                            rng.standard_normal(4))
    assert eo.gradgradcheck(lambda x, w: eo.rms_norm(x, w, ndims=1, eps=1e-6),
                            rng.standard_normal((3, 4)), rng.standard_normal(4))


def test_resample_and_pad(rng):
    up = eo.UpSampling2D((2, 3), "bilinear")
    assert eo.gradgradcheck(lambda x: up(x) * up(x), rng.standard_normal((1, 3, 2, 2)))
    for mode in ("reflect", "replicate", "circular", "constant"):
        assert eo.gradgradcheck(lambda x, m=mode: eo.pad(x, ((0, 0), (2, -1), (1, 1)),
                                                         mode=m) ** 2,
                                rng.standard_normal((1, 4, 3)))


def test_robust_losses(rng):
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    x = np.where(np.abs(np.abs(x - y) - 0.5) < 0.05, x + 0.2, x)
    assert eo.gradgradcheck(lambda a, b: eo.smooth_l1_loss(a, b, beta=0.5), x, y)
    assert eo.gradgradcheck(lambda a, b: eo.huber_loss(a, b, delta=0.5), x, y)
    p = rng.dirichlet(np.ones(4), 3)
    assert eo.gradgradcheck(lambda a, b: eo.kl_div(a, b, reduction="batchmean"),
                            np.log(rng.dirichlet(np.ones(4), 3)), p)


def test_grouped_conv2d(rng):
    assert eo.gradgradcheck(
        lambda x, w, b: eo.grouped_conv2d(x, w, b, stride=(1, 2), padding=((1, 1), (1, 0)),
                                          dilation=(1, 1), groups=2),
        rng.standard_normal((1, 4, 4, 4)), rng.standard_normal((2, 2, 2, 4)),
        rng.standard_normal(4))


def test_conv2d_transpose(rng):
    assert eo.gradgradcheck(
        lambda x, w, b: eo.conv2d_transpose(x, w, b, stride=(2, 1), out_hw=(6, 4), crop=(1, 0)),
        rng.standard_normal((1, 3, 3, 2)), rng.standard_normal((3, 2, 2, 2)),
        rng.standard_normal(2))


def test_weighted_losses(rng):
    weight = rng.uniform(0.5, 2.0, 3)
    target = np.array([0, 2, 1, -100])
    assert eo.gradgradcheck(lambda z: eo.cross_entropy(z, target, weight=weight,
                                                       label_smoothing=0.1),
                            rng.standard_normal((4, 3)))
    assert eo.gradgradcheck(lambda z: eo.nll_loss(eo.log_softmax(z), target, weight=weight),
                            rng.standard_normal((4, 3)))
    y = rng.uniform(0, 1, (4, 3))
    assert eo.gradgradcheck(lambda z: eo.binary_cross_entropy_with_logits(
        z, y, weight=weight, pos_weight=weight[::-1].copy()), rng.standard_normal((4, 3)))


@pytest.mark.parametrize("kind, op", [(eo.LSTM, "lstm"), (eo.GRU, "gru")])
def test_recurrent_lengths_and_bidirectional_refuse_a_second_derivative(rng, kind, op):
    """The fused recurrent ops have no second derivative: asking for one names the op."""
    layer = kind(2, 2, bidirectional=True, seed=0).to("float64")
    x = eo.tensor(rng.standard_normal((2, 3, 2)), requires_grad=True)
    out = layer(x, lengths=np.array([3, 1]))
    out = out[0] if isinstance(out, tuple) else out
    (g,) = eo.grad((out ** 2).sum(), x, create_graph=True)
    with pytest.raises(eo.EveryOError, match=f"'{op}'"):
        eo.grad(g.sum(), x)
