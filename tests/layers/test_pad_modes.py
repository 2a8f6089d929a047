"""eo.pad's modes and negative (cropping) widths against PyTorch's F.pad, gradcheck (first and
second derivatives), and the composite against the fast kernel."""

from __future__ import annotations

import pytest

import everyo as eo
from support.torch_oracle import assert_composite_matches, compare_with_torch

CASES = [  # (mode, pad_width per axis of a (2, 3, 5, 4) input; torch pads the last 2 axes)
    ("constant", ((0, 0), (0, 0), (2, -1), (1, 3))),
    ("constant", ((0, 0), (0, 0), (-1, -2), (0, 1))),
    ("reflect", ((0, 0), (0, 0), (2, 4), (3, 1))),
    ("reflect", ((0, 0), (0, 0), (-1, 2), (1, -2))),
    ("replicate", ((0, 0), (0, 0), (3, 0), (5, 2))),
    ("replicate", ((0, 0), (0, 0), (-2, 1), (2, -1))),
    ("circular", ((0, 0), (0, 0), (5, 2), (1, 4))),
    ("circular", ((0, 0), (0, 0), (-1, 3), (2, -1))),
]


def torch_pads(widths):
    """np.pad-style pairs (first axis first) -> F.pad's flat tuple (last axis first)."""
    return tuple(w for pair in reversed(widths[2:]) for w in pair)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode, widths", CASES)
def test_pad_matches_torch(torch, rng, dtype, mode, widths):
    x = rng.standard_normal((2, 3, 5, 4))
    F = torch.nn.functional
    value = 0.5 if mode == "constant" else None
    extra = {"value": value} if value is not None else {}
    compare_with_torch(torch, lambda t: eo.pad(t, widths, mode=mode, **extra),
                       lambda t: F.pad(t, torch_pads(widths), mode=mode, **extra), [x],
                       dtype=dtype)


@pytest.mark.parametrize("mode, widths", CASES)
def test_pad_gradcheck_and_composite(rng, mode, widths):
    x = rng.standard_normal((1, 2, 5, 4))
    assert eo.gradcheck(lambda t: eo.pad(t, widths, mode=mode, value=0.5), x)
    out = eo.pad(eo.tensor(x, requires_grad=True), widths, mode=mode, value=0.5)
    if out._ctx is not None and hasattr(out._ctx, "composite"):
        assert_composite_matches(out)


def test_pad_errors():
    x = eo.zeros(2, 3)
    with pytest.raises(eo.EveryOError, match="pad: reflect padding of 3 needs more than 3"):
        eo.pad(x, ((0, 0), (3, 0)), mode="reflect")
    with pytest.raises(eo.EveryOError, match="pad: mode must be one of"):
        eo.pad(x, 1, mode="wrap")
    with pytest.raises(eo.EveryOError, match="crop axis 1 of length 3 to nothing"):
        eo.pad(x, ((0, 0), (-2, -2)))


@pytest.mark.parametrize("mode", ["constant", "reflect"])
@pytest.mark.parametrize("widths", [((0, 0), (1.5, 1)), None, "a"])
def test_widths_that_are_not_integers_are_refused(mode, widths):
    """As np.pad: a width of 1.5 is an error, never silently a width of 1."""
    with pytest.raises(eo.EveryOError, match="pad: pad_width .* must be an int"):
        eo.pad(eo.ones(2, 3), widths, mode=mode)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular", "constant"])
def test_pad_second_derivatives(rng, mode):
    assert eo.gradgradcheck(lambda x: eo.pad(x, ((0, 0), (2, -1), (1, 1)), mode=mode) ** 2,
                            rng.standard_normal((1, 4, 3)))
