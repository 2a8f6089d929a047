"""Property test: random valid Sequential stacks of supported layers export and match ONNX
Runtime at batch sizes other than the one exported with."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import everyo as eo

ACTIVATIONS = [
    lambda draw: eo.ReLU(), lambda draw: eo.Sigmoid(), lambda draw: eo.Tanh(),
    lambda draw: eo.LeakyReLU(draw(st.sampled_from([0.01, 0.3]))),
    lambda draw: eo.GELU(draw(st.sampled_from(["none", "tanh"]))),
    lambda draw: eo.Dropout(0.5),
]


def randomized_norm(layer, seed):
    rng = np.random.default_rng(seed)
    for param in layer.parameters():
        param.data[...] = rng.uniform(-1.5, 1.5, param.shape)
    if getattr(layer, "running_mean", None) is not None:
        layer.running_mean = rng.normal(0, 1, layer.running_mean.shape).astype(np.float32)
        layer.running_var = rng.uniform(0.3, 2.0, layer.running_var.shape).astype(np.float32)
    return layer


def spatial_layer(draw, shape, seed):
    _, h, w, c = shape
    kind = draw(st.sampled_from(["conv", "maxpool", "avgpool", "bn", "act"]))
    if kind == "act":
        return draw(st.sampled_from(ACTIVATIONS))(draw)
    if kind == "bn":
        return randomized_norm(eo.BatchNorm2D(c), seed)
    stride = draw(st.integers(1, 2))
    padding = draw(st.sampled_from(["valid", "same", 1]))
    if kind == "conv":
        kernel = draw(st.integers(1, 3))
        dilation = draw(st.sampled_from([1, 1, 2]))
        return eo.Conv2D(c, draw(st.integers(1, 4)), kernel, stride=stride, padding=padding,
                         dilation=dilation, bias=draw(st.booleans()), seed=seed)
    pool = draw(st.integers(2, 3))
    layer_class = eo.MaxPool2D if kind == "maxpool" else eo.AvgPool2D
    return layer_class(pool, stride=stride, padding=padding)


def dense_layer(draw, shape, seed):
    features = shape[-1]
    kind = draw(st.sampled_from(["linear", "bn", "ln", "act"]))
    if kind == "linear":
        return eo.Linear(features, draw(st.integers(1, 6)), bias=draw(st.booleans()), seed=seed)
    if kind == "bn":
        return randomized_norm(eo.BatchNorm1D(features), seed)
    if kind == "ln":
        # NOTE: eps 1e-3, not 1e-5: after a ReLU and a Sigmoid a sample's features can be
        # nearly equal (spread 3e-4), and LayerNorm then multiplies every input error by up to
        # 1/sqrt(eps). ONNX Runtime's Sigmoid differs from ours by an ulp or two, which 1e-5
        # amplified to 4e-5 (a flaky failure); the exported graph was right either way.
        return randomized_norm(eo.LayerNorm(features, eps=1e-3), seed)
    return draw(st.sampled_from(ACTIVATIONS))(draw)


def output_shape(layer, shape):
    """The layer's output shape on a sample, or None when it does not fit this input."""
    try:
        with eo.no_grad():
            out = layer.eval()(eo.zeros(*shape))
    except eo.EveryOError:
        return None
    return out.shape if min(out.shape) > 0 else None


@st.composite
def stacks(draw):
    spatial = draw(st.booleans())
    batch = draw(st.integers(1, 2))
    if spatial:
        shape = (batch, draw(st.integers(3, 9)), draw(st.integers(3, 9)), draw(st.integers(1, 3)))
    else:
        shape = (batch, draw(st.integers(1, 6)))
    input_shape, layers = shape, []
    for seed in range(draw(st.integers(1, 4)) if spatial else 0):
        layer = spatial_layer(draw, shape, seed)
        new_shape = output_shape(layer, shape)
        if new_shape is not None:
            layers.append(layer)
            shape = new_shape
    if spatial:
        layers.append(eo.Flatten())
        shape = (batch, int(np.prod(shape[1:])))
    for seed in range(draw(st.integers(1, 4))):
        layer = dense_layer(draw, shape, 100 + seed)
        layers.append(layer)
        shape = output_shape(layer, shape)
    if draw(st.booleans()):
        layers.append(draw(st.sampled_from([eo.Softmax, eo.LogSoftmax]))())
    nested = draw(st.booleans()) and len(layers) > 2
    if nested:
        layers = [*layers[:1], eo.Sequential(*layers[1:-1]), layers[-1]]
    return eo.Sequential(*layers), input_shape


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stack=stacks(), opset=st.sampled_from([17, 20]))
def test_random_stack_matches_onnxruntime(stack, opset, parity):
    model, input_shape = stack
    model.train()
    parity(model, input_shape, batch_sizes=(3, 5), opset=opset, scale=1.5)
