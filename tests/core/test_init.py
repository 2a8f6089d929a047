"""eo.init: PyTorch's initialisers on EveryO's layouts give PyTorch's statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

import everyo as eo

# (EveryO layout, the same layer's PyTorch layout)
LAYOUTS = {
    "linear": ((300, 200), (200, 300)),
    "conv2d": ((3, 3, 40, 96), (96, 40, 3, 3)),
}

INITS = [
    ("xavier_uniform_", {"gain": 1.3}),
    ("xavier_normal_", {}),
    ("kaiming_uniform_", {"a": math.sqrt(5)}),  # what PyTorch's Linear/Conv use by default
    ("kaiming_uniform_", {"mode": "fan_out", "nonlinearity": "relu"}),
    ("kaiming_normal_", {"nonlinearity": "relu"}),
    ("kaiming_normal_", {"a": 0.2, "mode": "fan_out"}),
    ("trunc_normal_", {"std": 0.5, "a": -0.4, "b": 0.9}),
    ("orthogonal_", {"gain": 2.0}),
    ("uniform_", {"a": -0.3, "b": 0.1}),
    ("normal_", {"mean": 0.2, "std": 0.7}),
]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name,options", INITS, ids=[f"{n}{o}" for n, o in INITS])
def test_statistics_match_pytorch_for_the_same_layer(layout, name, options, torch):
    ours_shape, torch_shape = LAYOUTS[layout]
    ours = eo.Parameter(np.zeros(ours_shape))
    returned = getattr(eo.init, name)(ours, generator=np.random.default_rng(0), **options)
    assert returned is ours
    theirs = torch.empty(torch_shape, dtype=torch.float64)
    torch.manual_seed(0)
    getattr(torch.nn.init, name)(theirs, **options)
    theirs = theirs.numpy()
    # NOTE: about 6e4 samples: the standard deviation's sampling error is ~0.3 %.
    assert np.std(ours.data) == pytest.approx(np.std(theirs), rel=0.03)
    assert np.mean(ours.data) == pytest.approx(np.mean(theirs), abs=0.03 * np.std(theirs))
    if name in ("xavier_uniform_", "kaiming_uniform_", "uniform_", "trunc_normal_"):
        # bounded: the samples reach (nearly) the same ends, never beyond
        slack = 0.01 * np.std(theirs)
        assert theirs.min() - slack <= ours.data.min() <= theirs.min() + 5 * slack
        assert theirs.max() - 5 * slack <= ours.data.max() <= theirs.max() + slack


def test_fans_read_everyo_layouts(torch):
    for ours_shape, torch_shape in LAYOUTS.values():
        expected = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(torch_shape))
        assert eo.init.calculate_fan_in_and_fan_out(eo.zeros(ours_shape)) == expected


def test_calculate_gain_matches_pytorch(torch):
    for args in [("linear",), ("relu",), ("tanh",), ("sigmoid",), ("selu",), ("conv2d",),
                 ("leaky_relu",), ("leaky_relu", 0.2)]:
        assert eo.init.calculate_gain(*args) == torch.nn.init.calculate_gain(*args)


def test_orthogonal_in_pytorchs_orientation():
    weight = eo.Parameter(np.zeros((64, 32)))  # Linear(64, 32): PyTorch's weight is (32, 64)
    eo.init.orthogonal_(weight, generator=np.random.default_rng(1))
    np.testing.assert_allclose(weight.data.T @ weight.data, np.eye(32), atol=1e-12)
    conv = eo.Parameter(np.zeros((3, 3, 4, 8)))
    eo.init.orthogonal_(conv, generator=np.random.default_rng(1))
    rows = np.moveaxis(conv.data, -1, 0).reshape(8, -1)
    np.testing.assert_allclose(rows @ rows.T, np.eye(8), atol=1e-12)


def test_in_place_generator_and_manual_seed():
    layer = eo.Linear(5, 4)
    weight = layer.weight
    eo.init.constant_(layer.bias, 0.25)
    assert layer.weight is weight and (layer.bias.data == 0.25).all()
    assert layer.weight.dtype == "float32"
    eo.init.ones_(layer.bias)
    eo.init.zeros_(layer.weight)
    assert layer.bias.data.sum() == 4 and not layer.weight.data.any()
    a = eo.init.normal_(eo.Parameter(np.zeros(6)), generator=np.random.default_rng(3)).data.copy()
    b = eo.init.normal_(eo.Parameter(np.zeros(6)), generator=np.random.default_rng(3)).data
    np.testing.assert_array_equal(a, b)
    eo.manual_seed(11)
    c = eo.init.uniform_(eo.Parameter(np.zeros(6))).data.copy()
    eo.manual_seed(11)
    np.testing.assert_array_equal(c, eo.init.uniform_(eo.Parameter(np.zeros(6))).data)


def test_bad_arguments():
    with pytest.raises(eo.EveryOError, match="at least 2 axes"):
        eo.init.xavier_uniform_(eo.Parameter(np.zeros(3)))
    with pytest.raises(eo.EveryOError, match="numpy.random.Generator"):
        eo.init.normal_(eo.Parameter(np.zeros(3)), generator=0)
    with pytest.raises(eo.EveryOError, match="unsupported nonlinearity"):
        eo.init.calculate_gain("swish")
    with pytest.raises(eo.EveryOError, match="mode must be"):
        eo.init.kaiming_normal_(eo.Parameter(np.zeros((2, 2))), mode="fan")
    with pytest.raises(eo.EveryOError, match="floating"):
        eo.init.zeros_(eo.tensor([1, 2]))


def test_zero_element_tensors_and_bad_arguments():
    # a zero fan divided by zero (raw ZeroDivisionError); PyTorch warns and leaves it alone
    for fn in (eo.init.kaiming_uniform_, eo.init.kaiming_normal_, eo.init.xavier_uniform_,
               eo.init.xavier_normal_):
        empty = eo.Parameter(np.zeros((0, 4), np.float32))
        with pytest.warns(UserWarning, match="zero-element"):
            assert fn(empty) is empty
    w = eo.Parameter(np.zeros((2, 2), np.float32))
    # NumPy's "high - low < 0" / "scale < 0" ValueErrors and a ZeroDivisionError leaked
    with pytest.raises(eo.EveryOError, match="a <= b"):
        eo.init.uniform_(w, 1.0, 0.0)
    with pytest.raises(eo.EveryOError, match="std must be >= 0"):
        eo.init.normal_(w, 0.0, -1.0)
    with pytest.raises(eo.EveryOError, match="std must be > 0"):
        eo.init.trunc_normal_(w, std=0.0)
