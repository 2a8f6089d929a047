"""Models written as a user would (custom forwards from core ops and layers) and the check that
runs an exported file in both consumers at several sizes."""

from __future__ import annotations

import numpy as np

import everyo as eo

# Parity bound of the traced models: float32 rounding only.
TOLERANCE = 1e-5
BATCH_SIZES = (1, 3, 17)


def model_outputs(model, arrays) -> list[np.ndarray]:
    before = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with eo.no_grad():
            result = model(*[eo.tensor(a) for a in arrays])
    finally:
        for module, training in before:
            module.training = training
    return [np.asarray(r.data) for r in (result if isinstance(result, (tuple, list)) else [result])]


def consumers(path):
    """``(name, run(feeds) -> outputs)`` for ONNX Runtime and onnx.reference."""
    import onnx
    import onnxruntime
    from onnx.reference import ReferenceEvaluator

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    evaluator = ReferenceEvaluator(onnx.load(str(path)))
    return [("onnxruntime", lambda feeds: session.run(None, feeds)),
            ("onnx.reference", lambda feeds: evaluator.run(None, feeds))]


def assert_parity(model, path, shapes_for, sizes=BATCH_SIZES, seed=0):
    """Run ``path`` in both consumers on inputs ``shapes_for(size)`` for every size and
    compare with the model within ``TOLERANCE``; also checks the file with the full checker
    and strict shape inference."""
    import onnx

    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    names = [i.name for i in proto.graph.input]
    rng = np.random.default_rng(seed)
    runners = consumers(path)
    for size in sizes:
        arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes_for(size)]
        expected = model_outputs(model, arrays)
        feeds = dict(zip(names, arrays))
        for consumer, run in runners:
            actual = run(feeds)
            assert len(actual) == len(expected), consumer
            for got, want in zip(actual, expected):
                assert got.shape == want.shape, (consumer, size)
                np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE,
                                           err_msg=f"{consumer}, size {size}")


def assert_any_length(model, path, shape, lengths):
    """Export with axis 1 symbolic (``time``), verify, and check parity at every length."""
    import everyo as eo

    eo.export_onnx(model, path, input_shape=shape, dynamic_axes={"input": {1: "time"}},
                   verify=True)
    for length in lengths:
        assert_parity(model, path, lambda n, t=length: [(n, t, *shape[2:])])


def op_types(path) -> list[str]:
    import onnx

    return [node.op_type for node in onnx.load(str(path)).graph.node]


class ResidualBlock(eo.Module):
    def __init__(self, channels: int, seed: int):
        super().__init__()
        self.conv1 = eo.Conv2D(channels, channels, 3, padding="same", seed=seed)
        self.bn1 = eo.BatchNorm2D(channels)
        self.conv2 = eo.Conv2D(channels, channels, 3, padding="same", seed=seed + 1)
        self.bn2 = eo.BatchNorm2D(channels)

    def forward(self, x):
        h = eo.relu(self.bn1(self.conv1(x)))
        return eo.relu(x + self.bn2(self.conv2(h)))


class ResidualCNN(eo.Module):
    """Stem, two residual blocks with a skip add, global average pooling with eo.mean, head."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = eo.Conv2D(3, 8, 3, padding="same", seed=0)
        self.blocks = eo.Sequential(ResidualBlock(8, 1), ResidualBlock(8, 3))
        self.head = eo.Linear(8, classes, seed=5)

    def forward(self, x):
        features = self.blocks(eo.relu(self.stem(x)))
        return self.head(eo.mean(features, axis=(1, 2)))


class SkipConcatMLP(eo.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = eo.Linear(6, 16, seed=0)
        self.fc2 = eo.Linear(16, 16, seed=1)
        self.out = eo.Linear(16 + 6, 3, seed=2)

    def forward(self, x):
        h = eo.tanh(self.fc1(x))
        h = h + eo.relu(self.fc2(h))  # skip connection
        return eo.log_softmax(self.out(eo.concatenate([h, x], axis=-1)), axis=-1)


class CausalSelfAttention(eo.Module):
    """GPT-style attention from core ops; the causal mask is built once at full length and
    sliced with the sequence length read from ``x.shape``."""

    def __init__(self, dim: int = 8, heads: int = 2, max_len: int = 32):
        super().__init__()
        self.heads = heads
        self.norm = eo.LayerNorm(dim)
        self.qkv = eo.Linear(dim, 3 * dim, seed=0)
        self.proj = eo.Linear(dim, dim, seed=1)
        self.mask = eo.tensor(np.tril(np.ones((max_len, max_len), bool)))

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = (part.reshape(b, t, h, c // h).transpose(0, 2, 1, 3)
                   for part in self._split(self.qkv(self.norm(x)), c))
        scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / np.sqrt(c // h))
        scores = eo.where(self.mask[:t, :t], scores, -1e9)
        y = (eo.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
        return x + self.proj(y)

    @staticmethod
    def _split(qkv, c):
        return qkv[:, :, :c], qkv[:, :, c:2 * c], qkv[:, :, 2 * c:]


class TwoInputs(eo.Module):
    """An image branch and a vector branch, fused; returns logits and the fused features."""

    def __init__(self):
        super().__init__()
        self.conv = eo.Conv2D(2, 4, 3, stride=2, padding="same", seed=0)
        self.flatten = eo.Flatten()
        self.side = eo.Linear(5, 4, seed=1)
        self.head = eo.Linear(4 * 3 * 3 + 4, 2, seed=2)

    def forward(self, image, vector):
        fused = eo.concatenate([self.flatten(eo.relu(self.conv(image))),
                                eo.sigmoid(self.side(vector))], axis=1)
        return self.head(fused), fused


class ConvBNReLU(eo.Module):
    def __init__(self, cin: int, cout: int, seed: int):
        super().__init__()
        self.conv = eo.Conv2D(cin, cout, 3, padding="same", bias=False, seed=seed)
        self.bn = eo.BatchNorm2D(cout)
        self.act = eo.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class ConvStack(eo.Module):
    def __init__(self):
        super().__init__()
        self.layers = eo.Sequential(ConvBNReLU(3, 4, 0), ConvBNReLU(4, 4, 1))

    def forward(self, x):
        return self.layers(x)


def with_trained_statistics(model, seed: int = 0):
    """Give every batch norm non-trivial running statistics and affine parameters."""
    rng = np.random.default_rng(seed)
    for module in model.modules():
        if isinstance(module, (eo.BatchNorm1D, eo.BatchNorm2D)):
            module.running_mean = rng.normal(0, 0.5, module.running_mean.shape).astype(np.float32)
            module.running_var = rng.uniform(0.5, 2.0, module.running_var.shape).astype(np.float32)
            module.weight.data[...] = rng.uniform(0.5, 1.5, module.weight.shape)
            module.bias.data[...] = rng.normal(0, 0.3, module.bias.shape)
    return model


class DeepResidual(eo.Module):
    """``blocks`` residual blocks of LayerNorm and Linear (2 layers each) in custom forwards."""

    def __init__(self, width: int = 64, blocks: int = 25):
        super().__init__()
        self.blocks = eo.Sequential(*[_NormLinearBlock(width, seed) for seed in range(blocks)])

    def forward(self, x):
        return self.blocks(x)


class _NormLinearBlock(eo.Module):
    def __init__(self, width: int, seed: int):
        super().__init__()
        self.norm = eo.LayerNorm(width)
        self.fc = eo.Linear(width, width, seed=seed)

    def forward(self, x):
        return x + eo.relu(self.fc(self.norm(x)))
