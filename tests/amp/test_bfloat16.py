"""eo.autocast(dtype="bfloat16"): which dtypes come out, which gradients flow where, that every
result is the float32 computation rounded once, and that a CNN trains as well as in float32."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.dtypes import BFLOAT16
from everyo_amp import BFLOAT16_POLICY, DEFAULT_POLICY


def bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint16) if array.dtype.itemsize == 2 else array.view(np.uint32)


def rounded(array) -> np.ndarray:
    """``array`` rounded to bfloat16 and back: what a cast node hands the op."""
    return np.asarray(array, np.float32).astype(BFLOAT16).astype(np.float32)


class Probe(eo.Op):
    """Identity that records the dtype of the gradient reaching its input."""

    __slots__ = ()
    seen: list = []

    def forward(self, x):
        return x

    def backward(self, g):
        Probe.seen.append(g.dtype)
        return (g,)


def cnn(seed=0):
    return eo.Sequential(
        eo.Conv2D(1, 8, 3, padding="same", seed=seed), eo.ReLU(), eo.MaxPool2D(2),
        eo.Conv2D(8, 16, 3, padding="same", seed=seed + 1), eo.ReLU(), eo.MaxPool2D(2),
        eo.Flatten(), eo.Linear(2 * 2 * 16, 10, seed=seed + 2))


# -- the policy ----------------------------------------------------------------------------------

def test_the_bfloat16_policy_is_registered_with_the_same_lists():
    policies = eo.registry("autocast_policies")
    assert policies.owners["bfloat16"] == "everyo_amp"
    assert policies["bfloat16"] is BFLOAT16_POLICY and BFLOAT16_POLICY.dtype == "bfloat16"
    assert BFLOAT16_POLICY.ops == DEFAULT_POLICY.ops == {"matmul", "conv2d"}
    assert BFLOAT16_POLICY.upcast == DEFAULT_POLICY.upcast
    x, w = eo.ones(2, 3), eo.ones(3, 4, requires_grad=True)
    with eo.autocast(policy="bfloat16"):
        assert (x @ w).dtype == "bfloat16"
    with eo.autocast(dtype="bfloat16"):
        assert (x @ w).dtype == "bfloat16"
    with eo.autocast(policy="bfloat16", dtype="float16"):  # dtype= overrides the policy's
        assert (x @ w).dtype == "float16"


def test_output_dtypes_master_weights_and_their_gradients():
    model = cnn()
    x = eo.randn(4, 8, 8, 1, seed=0)
    with eo.autocast(dtype="bfloat16"):
        features = model[0](x)
        logits = model(x)
        total = eo.sum(features)  # the float32 list: cast up
        loss = eo.cross_entropy(logits, eo.tensor([0, 1, 2, 3]))
    assert features.dtype == "bfloat16" and logits.dtype == "bfloat16"
    assert model[1](features).dtype == "bfloat16"  # ReLU keeps its input's dtype
    assert total.dtype == "float32" and loss.dtype == "float32"
    loss.backward()
    for name, param in model.named_parameters():
        assert param.dtype == "float32" and param.grad.dtype == np.float32, name
        assert np.any(param.grad), name


def test_gradients_reaching_bfloat16_activations_are_bfloat16():
    model = eo.Sequential(eo.Linear(6, 5, seed=0), eo.ReLU(), eo.Linear(5, 3, seed=1))
    x = eo.randn(4, 6, seed=1, requires_grad=True)
    Probe.seen.clear()
    with eo.autocast(dtype="bfloat16"):
        hidden = Probe.apply(model[1](model[0](x)))
        out = model[2](hidden)
    assert hidden.dtype == "bfloat16"
    (out.to("float32") ** 2).mean().backward()
    assert Probe.seen == [BFLOAT16]
    assert x.grad.dtype == np.float32  # back through the cast node: the input's own dtype


def test_float64_and_integers_are_left_alone():
    w = eo.randn(3, 3, seed=0, dtype="float64")
    with eo.autocast(dtype="bfloat16"):
        assert (w @ w).dtype == "float64"
        assert eo.matmul(eo.tensor([[1, 2]]), eo.tensor([[3], [4]])).dtype.startswith("int")


# -- numerics: the float32 computation rounded once ----------------------------------------------

def test_linear_forward_and_gradients_are_float32_rounded_once():
    rng = np.random.default_rng(3)
    layer = eo.Linear(64, 48, seed=0)
    x = eo.tensor(rng.standard_normal((32, 64)).astype(np.float32), requires_grad=True)
    g = rng.standard_normal((32, 48)).astype(np.float32)
    with eo.autocast(dtype="bfloat16"):
        out = layer(x)
    out.backward(g.astype(BFLOAT16))
    xr, wr, br = rounded(x.data), rounded(layer.weight.data), rounded(layer.bias.data)
    np.testing.assert_array_equal(bits(out.data), bits((xr @ wr + br).astype(BFLOAT16)))
    gr = rounded(g)
    np.testing.assert_array_equal(bits(layer.weight.grad), bits(rounded(xr.T @ gr)))
    np.testing.assert_array_equal(bits(x.grad), bits(rounded(gr @ wr.T)))
    np.testing.assert_array_equal(bits(layer.bias.grad), bits(rounded(gr.sum(axis=0))))


def test_conv2d_forward_is_the_float32_convolution_rounded_once():
    rng = np.random.default_rng(4)
    conv = eo.Conv2D(3, 5, 3, padding="same", seed=0)
    x = rng.standard_normal((2, 6, 6, 3)).astype(np.float32)
    with eo.autocast(dtype="bfloat16"):
        out = conv(eo.tensor(x))
    with eo.autocast(False):  # the reference: float32 on the rounded operands
        reference = eo.conv2d(eo.tensor(rounded(x)), eo.tensor(rounded(conv.weight.data)),
                              eo.tensor(rounded(conv.bias.data)), padding=((1, 1), (1, 1)))
    assert out.dtype == "bfloat16"
    np.testing.assert_array_equal(bits(out.data), bits(reference.data.astype(BFLOAT16)))


@pytest.mark.torch
def test_matches_pytorch_cpu_bfloat16_autocast(torch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    layer = eo.Linear(32, 8, seed=0)
    with eo.autocast(dtype="bfloat16"):
        ours = layer(eo.tensor(x)).to("float32").data
    reference = torch.nn.Linear(32, 8)
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(layer.weight.data.T.copy()))
        reference.bias.copy_(torch.from_numpy(layer.bias.data))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = reference(torch.from_numpy(x))
    assert theirs.dtype == torch.bfloat16
    # NOTE: PyTorch's CPU kernel may accumulate in another order; both round once to 8 bits.
    np.testing.assert_allclose(ours, theirs.detach().float().numpy(), rtol=2**-7, atol=1e-6)


# -- GradScaler is optional -----------------------------------------------------------------------

def test_grad_scaler_works_and_changes_nothing_under_bfloat16():
    x, y = eo.randn(16, 6, seed=0), eo.tensor(np.arange(16) % 3)

    def one_step(scaler):
        model = eo.Sequential(eo.Linear(6, 8, seed=0), eo.ReLU(), eo.Linear(8, 3, seed=1))
        optimizer = eo.SGD(list(model.parameters()), lr=0.1)
        with eo.autocast(dtype="bfloat16"):
            logits = model(x)
        loss = eo.cross_entropy(logits, y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.backward(loss)
            assert scaler.step(optimizer)
            scaler.update()
        return [p.data.copy() for p in model.parameters()]

    # a power-of-two scale multiplies and divides bfloat16 gradients exactly
    for plain, scaled in zip(one_step(None), one_step(eo.GradScaler(init_scale=2.0**12))):
        np.testing.assert_array_equal(plain, scaled)


# -- end to end -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_digits_cnn_under_bfloat16_matches_float32_accuracy_within_one_point():
    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn is a test extra")
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]  # NHWC
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:1400], order[1400:]

    def accuracy(dtype):
        model = eo.Sequential(
            eo.Conv2D(1, 16, 3, padding="same", seed=0), eo.BatchNorm2D(16), eo.ReLU(),
            eo.MaxPool2D(2),
            eo.Conv2D(16, 32, 3, padding="same", seed=1), eo.ReLU(), eo.MaxPool2D(2),
            eo.Flatten(), eo.Linear(2 * 2 * 32, 10, seed=2))
        optimizer = eo.Adam(list(model.parameters()), lr=3e-3)
        scheduler = eo.StepLR(optimizer, step_size=5, gamma=0.3)
        loader = eo.DataLoader((images[train], labels[train]), batch_size=64, shuffle=True,
                               seed=0)
        for _ in range(12):
            for x, y in loader:
                optimizer.zero_grad()
                with eo.autocast(enabled=dtype is not None, dtype=dtype):
                    logits = model(x)
                eo.cross_entropy(logits, y).backward()
                optimizer.step()
            scheduler.step()
        model.eval()
        with eo.no_grad():
            predictions = model(eo.tensor(images[test])).data.argmax(axis=1)
        return float(np.mean(predictions == labels[test]))

    reference, bf16 = accuracy(None), accuracy("bfloat16")
    assert reference > 0.97
    assert abs(bf16 - reference) <= 0.01, (bf16, reference)  # one point of accuracy


def test_a_model_trained_under_autocast_exports_float32_weights(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import onnx

    model = eo.Sequential(eo.Linear(6, 8, seed=0), eo.ReLU(), eo.Linear(8, 3, seed=1))
    optimizer = eo.SGD(list(model.parameters()), lr=0.1)
    x, y = eo.randn(16, 6, seed=0), eo.tensor(np.arange(16) % 3)
    for dtype in ("bfloat16", "float16"):
        optimizer.zero_grad()
        with eo.autocast(dtype=dtype):
            logits = model(x)
        eo.cross_entropy(logits, y).backward()
        optimizer.step()
    path = tmp_path / "trained.onnx"
    eo.export_onnx(model, str(path), input_shape=(1, 6), verify=True)  # outside the block
    graph = onnx.load(str(path)).graph
    assert graph.initializer and all(
        t.data_type == onnx.TensorProto.FLOAT for t in graph.initializer)
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    np.testing.assert_allclose(eo.run_onnx(str(path), x.data), model(x).data, rtol=1e-5,
                               atol=1e-6)


def test_layers_take_bfloat16_where_they_ask_for_a_float():
    scores = eo.randn(4, 3, seed=0).to("bfloat16")
    targets = eo.softmax(eo.randn(4, 3, seed=1)).to("bfloat16")  # probabilities, not indices
    expected = eo.cross_entropy(scores.to("float32"), targets.to("float32"))
    assert eo.cross_entropy(scores, targets).item() == pytest.approx(expected.item(), rel=1e-6)
    weight = eo.Parameter(np.zeros((3, 4), BFLOAT16))
    eo.init.normal_(weight)
    assert weight.dtype == "bfloat16" and np.any(weight.data.astype(np.float32))
