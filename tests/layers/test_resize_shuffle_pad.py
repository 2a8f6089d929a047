"""eo.interpolate / Upsample (nearest, bilinear, align_corners, size or scale_factor),
PixelShuffle / PixelUnshuffle (PyTorch's channel order on NHWC) and ReflectionPad2D /
ReplicationPad2D against PyTorch on the permuted input, in float32 and float64 (forward and
input gradient); numerical and second derivatives; bad input named."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.second_order import F, nchw, nhwc, normal, second_order_tests
from support.torch_oracle import compare_with_torch

INTERPOLATIONS = [
    dict(scale_factor=2, mode="nearest"), dict(scale_factor=1.7, mode="nearest"),
    dict(size=(3, 11), mode="nearest"), dict(scale_factor=(0.5, 3), mode="nearest"),
    dict(scale_factor=1.7, mode="nearest", recompute_scale_factor=True),
    dict(scale_factor=2, mode="bilinear"), dict(scale_factor=1.3, mode="bilinear"),
    dict(size=(4, 9), mode="bilinear"), dict(scale_factor=(0.5, 2.5), mode="bilinear"),
    dict(scale_factor=1.3, mode="bilinear", align_corners=True),
    dict(size=(7, 2), mode="bilinear", align_corners=True),
    dict(size=1, mode="bilinear", align_corners=True),
    # PyTorch's shortcuts: an axis that keeps its length is copied, a doubled one repeats
    # (nearest), whatever the scale factor says
    dict(scale_factor=(1.1, 2.1), mode="nearest"), dict(scale_factor=(1.1, 1.3), mode="bilinear"),
]
DTYPES = ["float64", "float32"]


def _ids(options):
    return "-".join(f"{k}={v}" for k, v in options.items())


@pytest.mark.torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", INTERPOLATIONS, ids=[_ids(o) for o in INTERPOLATIONS])
def test_interpolate_matches_torch(torch, rng, dtype, options):
    x = rng.standard_normal((2, 5, 7, 3))
    compare_with_torch(torch, lambda t: eo.interpolate(t, **options),
                       lambda t: nhwc(torch.nn.functional.interpolate(nchw(t), **options)),
                       [x], dtype=dtype)
    module = eo.Upsample(**options)
    reference = torch.nn.Upsample(**options)
    compare_with_torch(torch, module, lambda t: nhwc(reference(nchw(t))), [x], dtype=dtype)


@pytest.mark.torch
@pytest.mark.parametrize("by", ["size", "scale_factor"])
def test_nearest_takes_torchs_source_pixel_for_every_length(torch, by):
    """PyTorch computes nearest's source index in float32 (``floor(i * scale)``), which picks
    another pixel than exact arithmetic for some lengths (an input of 2 resized to 82)."""
    for n in range(1, 13):
        x = np.arange(n, dtype=np.float64).reshape(1, n, 1, 1)
        options = ([dict(size=(out, 1)) for out in range(1, 90)] if by == "size" else
                   [dict(scale_factor=(float(f), 1.0)) for f in np.arange(1.0 / n, 4.0, 0.01)])
        for option in options:
            expected = torch.nn.functional.interpolate(
                torch.from_numpy(x).permute(0, 3, 1, 2), **option).numpy().ravel()
            got = eo.interpolate(eo.tensor(x), **option).numpy().ravel()
            np.testing.assert_array_equal(got, expected, err_msg=f"input {n}, {option}")


@pytest.mark.torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factor, shape", [(2, (2, 3, 4, 12)), (3, (1, 2, 2, 9)),
                                           (2, (3, 4, 8))])
def test_pixel_shuffle_and_unshuffle_match_torch(torch, rng, dtype, factor, shape):
    x = rng.standard_normal(shape)

    def channels_first(layer):
        def run(t):
            if t.ndim == 3:
                return layer(t.permute(2, 0, 1)).permute(1, 2, 0)
            return nhwc(layer(nchw(t)))
        return run

    out = compare_with_torch(torch, eo.PixelShuffle(factor),
                             channels_first(torch.nn.PixelShuffle(factor)), [x], dtype=dtype)
    compare_with_torch(torch, eo.PixelUnshuffle(factor),
                       channels_first(torch.nn.PixelUnshuffle(factor)), [out.data], dtype=dtype)
    np.testing.assert_array_equal(eo.PixelUnshuffle(factor)(out).data, x.astype(dtype))


@pytest.mark.torch
def test_a_conv_ported_from_torch_feeds_pixel_shuffle_as_in_torch(torch, rng):
    """The channel order is PyTorch's: its conv weights, transposed as usual, give its image."""
    ref = torch.nn.Sequential(torch.nn.Conv2d(2, 3 * 4, 3, padding=1),
                              torch.nn.PixelShuffle(2)).double()
    ours = eo.Sequential(eo.Conv2D(2, 12, 3, padding=1), eo.PixelShuffle(2)).to("float64")
    ours[0].weight.data[...] = ref[0].weight.detach().numpy().transpose(2, 3, 1, 0)
    ours[0].bias.data[...] = ref[0].bias.detach().numpy()
    x = rng.standard_normal((2, 4, 5, 2))
    np.testing.assert_allclose(ours(x).data, nhwc(ref(nchw(torch.tensor(x)))).detach().numpy(),
                               rtol=1e-12, atol=1e-12)


PADS = [1, (1, 2, 0, 3), (0, 0, 2, 1)]


@pytest.mark.torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["ReflectionPad2D", "ReplicationPad2D"])
@pytest.mark.parametrize("padding", PADS, ids=str)
def test_padding_layers_match_torch(torch, rng, dtype, kind, padding):
    ref = getattr(torch.nn, kind[:-1] + "d")(padding)
    compare_with_torch(torch, getattr(eo, kind)(padding), lambda t: nhwc(ref(nchw(t))),
                       [rng.standard_normal((2, 4, 5, 3))], dtype=dtype)
    unbatched = rng.standard_normal((4, 5, 3))
    np.testing.assert_allclose(getattr(eo, kind)(padding)(unbatched).data,
                               ref(torch.tensor(unbatched).permute(2, 0, 1)).permute(
                                   1, 2, 0).numpy())


@pytest.mark.parametrize("build, shape", [
    (lambda: eo.Upsample(scale_factor=1.5, mode="bilinear"), (1, 3, 4, 2)),
    (lambda: eo.Upsample(size=(5, 2), mode="bilinear", align_corners=True), (1, 3, 4, 2)),
    (lambda: eo.Upsample(scale_factor=2), (1, 3, 2, 2)),
    (lambda: eo.PixelShuffle(2), (1, 2, 3, 8)),
    (lambda: eo.PixelUnshuffle(2), (1, 4, 2, 2)),
    (lambda: eo.ReflectionPad2D((2, 1, 0, 1)), (1, 3, 4, 2)),
    (lambda: eo.ReplicationPad2D(2), (1, 3, 4, 2)),
])
def test_gradcheck(rng, build, shape):
    assert eo.gradcheck(build(), rng.standard_normal(shape))


@pytest.mark.parametrize("call, problem", [
    (lambda: eo.interpolate(eo.ones(1, 3, 3, 2)), "interpolate: give exactly one of size and "
                                                  "scale_factor"),
    (lambda: eo.interpolate(eo.ones(1, 3, 3, 2), size=2, scale_factor=2),
     "give exactly one"),
    (lambda: eo.interpolate(eo.ones(1, 3, 3, 2), scale_factor=2, mode="bicubic"),
     r"interpolate: mode must be one of \('nearest', 'bilinear'\), got 'bicubic'"),
    (lambda: eo.interpolate(eo.ones(1, 3, 3, 2), scale_factor=2, align_corners=True),
     "align_corners is for mode='bilinear' only"),
    (lambda: eo.interpolate(eo.ones(1, 3, 3, 2), size=(2.5, 3)),
     r"interpolate: size must be an int or a pair of them \(H, W\), got \(2.5, 3\)"),
    (lambda: eo.interpolate(eo.ones(1, 3, 3, 2), scale_factor=-1.0),
     "scale_factor must be positive"),
    (lambda: eo.interpolate(eo.ones(1, 3, 3, 2), scale_factor=0.2),
     r"interpolate: scale_factor 0.2 leaves no pixel of input \(3, 3\)"),
    (lambda: eo.interpolate(eo.ones(3, 3, 2), scale_factor=2), r"interpolate: expected NHWC "
                                                               r"input \(4 axes\)"),
    (lambda: eo.Upsample(scale_factor="2"), "Upsample: scale_factor must be a number"),
    (lambda: eo.PixelShuffle(2)(eo.ones(1, 2, 2, 6)),
     r"PixelShuffle\(2\): the 6 channels of input \(1, 2, 2, 6\) are not divisible by "
     r"upscale_factor \*\* 2 = 4"),
    (lambda: eo.PixelUnshuffle(2)(eo.ones(1, 3, 4, 2)),
     r"PixelUnshuffle\(2\): height and width of input \(1, 3, 4, 2\) must be divisible"),
    (lambda: eo.PixelShuffle(2)(eo.ones(4, 8)), r"PixelShuffle\(2\): expected channels-last"),
    (lambda: eo.ReflectionPad2D(3)(eo.ones(1, 3, 4, 2)),
     r"ReflectionPad2D\(3, 3, 3, 3\): reflection pads must be smaller than the input's height"),
    (lambda: eo.ReplicationPad2D((1, 2, 3))(eo.ones(1, 3, 4, 2)),
     r"ReplicationPad2D: padding must be a non-negative int or 4 of them"),
    (lambda: eo.ReplicationPad2D(-1), "ReplicationPad2D: padding must be a non-negative"),
    (lambda: eo.ReplicationPad2D(1)(eo.ones(3, 4)), r"ReplicationPad2D.*NHWC \(or HWC\)"),
])
def test_bad_input_is_named(call, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        call()


SECOND_ORDER = [
    ("interpolate_bilinear_squared",
     lambda x: eo.interpolate(x, scale_factor=1.5, mode="bilinear") ** 2,
     lambda x: nhwc(F().interpolate(nchw(x), scale_factor=1.5, mode="bilinear")) ** 2,
     [normal(1, 3, 4, 2)]),
    ("pixel_shuffle_squared", lambda x: eo.PixelShuffle(2)(x) ** 2,
     lambda x: nhwc(F().pixel_shuffle(nchw(x), 2)) ** 2, [normal(1, 2, 3, 8)]),
    ("reflection_pad_squared", lambda x: eo.ReflectionPad2D((1, 0, 2, 1))(x) ** 2,
     lambda x: nhwc(F().pad(nchw(x), (1, 0, 2, 1), mode="reflect")) ** 2, [normal(1, 3, 4, 2)]),
    ("replication_pad_squared", lambda x: eo.ReplicationPad2D(1)(x) ** 2,
     lambda x: nhwc(F().pad(nchw(x), (1, 1, 1, 1), mode="replicate")) ** 2,
     [normal(1, 3, 4, 2)]),
]
test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))
