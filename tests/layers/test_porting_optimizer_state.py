"""A PyTorch optimizer's state loads into an EveryO optimizer whose parameters came from the
converted PyTorch model: its per-parameter buffers convert as the weights did (transposed
Linear weights, square ones included; conv kernels; a Linear after Flatten), and training
continues on PyTorch's trajectory. Where a parameter's layout is not known, the buffer is
refused by name rather than loaded as it is."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

STEPS = 3
OPTIMIZERS = [
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.5, "centered": True}),
    ("Adagrad", {"lr": 0.1}),
    ("Adadelta", {"lr": 0.5}),
]


def _models(torch):
    """The same network in both frameworks: conv, Flatten, a Linear after it, a square
    Linear (6 -> 6) and a last Linear."""
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 6),
        torch.nn.Tanh(), torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).double()
    ours = eo.Sequential(eo.Conv2D(3, 4, 3), eo.ReLU(), eo.Flatten(), eo.Linear(64, 6),
                         eo.Tanh(), eo.Linear(6, 6), eo.Tanh(), eo.Linear(6, 3)).double()
    return theirs, ours


def _batches(count):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((5, 6, 6, 3)), rng.standard_normal((5, 3)))
            for _ in range(count)]


def _torch_step(torch, model, optimizer, images, targets):
    optimizer.zero_grad()
    out = model(torch.tensor(images.transpose(0, 3, 1, 2)))  # NCHW
    ((out - torch.tensor(targets)) ** 2).mean().backward()
    optimizer.step()


def _our_step(model, optimizer, images, targets):
    optimizer.zero_grad()
    ((model(images) - eo.tensor(targets)) ** 2).mean().backward()
    optimizer.step()


@pytest.mark.parametrize("name, options", OPTIMIZERS)
def test_pytorch_optimizer_state_continues_pytorchs_training(name, options, torch):
    theirs, ours = _models(torch)
    batches = _batches(2 * STEPS)
    their_optimizer = getattr(torch.optim, name)(theirs.parameters(), **options)
    for images, targets in batches[:STEPS]:
        _torch_step(torch, theirs, their_optimizer, images, targets)

    example = batches[0][0]
    ours.load_state_dict(eo.convert_state_dict(ours, theirs.state_dict(), example_input=example))
    our_optimizer = getattr(eo, name)(ours.parameters(), **options)
    our_optimizer.load_state_dict(their_optimizer.state_dict())

    for images, targets in batches[STEPS:]:
        _torch_step(torch, theirs, their_optimizer, images, targets)
        _our_step(ours, our_optimizer, images, targets)
    expected = eo.convert_state_dict(ours, theirs.state_dict(), example_input=example)
    for key, value in ours.state_dict().items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-9, atol=1e-12, err_msg=key)


def test_square_linear_buffers_are_transposed(torch):
    """The case a shape check cannot see: a (6, 6) weight's momentum, element by element."""
    theirs, ours = _models(torch)
    images, targets = _batches(1)[0]
    their_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    _torch_step(torch, theirs, their_optimizer, images, targets)
    ours.load_state_dict(eo.convert_state_dict(ours, theirs.state_dict(), example_input=images))
    our_optimizer = eo.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    our_optimizer.load_state_dict(their_optimizer.state_dict())
    their_buffer = their_optimizer.state[theirs[5].weight]["momentum_buffer"].numpy()
    assert their_buffer.shape == (6, 6) and not np.allclose(their_buffer, their_buffer.T)
    np.testing.assert_array_equal(our_optimizer.state[ours[5].weight]["momentum_buffer"],
                                  their_buffer.T)


def test_lbfgs_state_converts_its_flat_vectors(torch):
    theirs, ours = _models(torch)
    images, targets = _batches(1)[0]
    options = {"history_size": 4, "max_iter": 3}

    def torch_closure():
        their_optimizer.zero_grad()
        out = theirs(torch.tensor(images.transpose(0, 3, 1, 2)))
        loss = ((out - torch.tensor(targets)) ** 2).mean()
        loss.backward()
        return loss

    def our_closure():
        our_optimizer.zero_grad()
        loss = ((ours(images) - eo.tensor(targets)) ** 2).mean()
        loss.backward()
        return loss

    their_optimizer = torch.optim.LBFGS(theirs.parameters(), **options)
    their_optimizer.step(torch_closure)
    ours.load_state_dict(eo.convert_state_dict(ours, theirs.state_dict(), example_input=images))
    our_optimizer = eo.LBFGS(ours.parameters(), **options)
    our_optimizer.load_state_dict(their_optimizer.state_dict())
    for _ in range(2):
        their_optimizer.step(torch_closure)
        our_optimizer.step(our_closure)
    expected = eo.convert_state_dict(ours, theirs.state_dict(), example_input=images)
    for key, value in ours.state_dict().items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-8, atol=1e-10, err_msg=key)


def _momentum_state(weight_shape, index=0):
    """A PyTorch-style SGD state (no "type"): one buffer for parameter ``index``."""
    return {"state": {index: {"momentum_buffer": np.arange(np.prod(weight_shape), dtype=float)
                              .reshape(weight_shape)}},
            "param_groups": [{"params": [0, 1], "lr": 0.1, "momentum": 0.9, "dampening": 0.0,
                              "weight_decay": 0.0, "nesterov": False, "maximize": False,
                              "foreach": None, "differentiable": False, "fused": None}]}


def test_buffer_of_a_parameter_of_unknown_layout_is_refused_by_name():
    """A square Linear never converted with convert_state_dict: its layout relative to the
    PyTorch state is unknown, so its buffer is refused (parameter index and buffer named),
    and nothing changes."""
    layer = eo.Linear(4, 4, seed=0)
    optimizer = eo.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(EveryOError, match=r"'momentum_buffer' of parameter 0.*convert_state_dict"):
        optimizer.load_state_dict(_momentum_state((4, 4)))
    assert optimizer.state == {}
    # a vector (a bias) is never rearranged by a layer: PyTorch's buffer loads as it is
    optimizer.load_state_dict(_momentum_state((4,), index=1))
    np.testing.assert_array_equal(optimizer.state[layer.bias]["momentum_buffer"], np.arange(4.0))


def test_everyo_own_state_is_never_converted():
    layer = eo.Linear(4, 4, seed=0)
    eo.convert_state_dict(eo.Sequential(layer), {"0.weight": np.eye(4), "0.bias": np.zeros(4)})
    optimizer = eo.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    layer(np.ones((2, 4), np.float32)).sum().backward()
    optimizer.step()
    saved = optimizer.state_dict()
    buffer = saved["state"][0]["momentum_buffer"]
    restored = eo.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    restored.load_state_dict(saved)
    np.testing.assert_array_equal(restored.state[layer.weight]["momentum_buffer"], buffer)


class _Scale(eo.Module):
    def __init__(self):
        super().__init__()
        self.factor = eo.Parameter(np.ones((2, 2)))


def test_buffer_of_a_computed_parameter_is_refused_by_name():
    """A converter that computes a parameter (not a rearrangement) gives no layout for its
    buffers: refused naming the parameter and the buffer."""
    class Conversion:
        @eo.hookimpl
        def everyo_register_state_converters(self, register):
            register(_Scale, lambda layer, entries, context:
                     {"factor": np.exp(entries.take("log_scale", (2, 2)))})

    eo.register_plugin(Conversion(), name="test-porting-scale")
    try:
        model = eo.Sequential(_Scale())
        model.load_state_dict(eo.convert_state_dict(model, {"0.log_scale": np.zeros((2, 2))}))
    finally:
        eo.unregister_plugin("test-porting-scale")
    optimizer = eo.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = _momentum_state((2, 2))
    state["param_groups"][0]["params"] = [0]
    with pytest.raises(EveryOError, match=r"'momentum_buffer' of parameter 0.*'0\.factor' is "
                                          r"computed"):
        optimizer.load_state_dict(state)


def test_multi_head_attention_state_is_refused_not_misread(torch):
    """PyTorch packs q, k, v into one in_proj_weight (4 parameters, EveryO 8): refused."""
    theirs = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    ours = eo.Sequential(eo.MultiHeadAttention(4, 2))
    their_optimizer = torch.optim.Adam(theirs.parameters())
    x = torch.randn(2, 3, 4)
    theirs(x, x, x)[0].sum().backward()
    their_optimizer.step()
    ours.load_state_dict(eo.convert_state_dict(
        ours, {f"0.{k}": v for k, v in theirs.state_dict().items()}))
    our_optimizer = eo.Adam(ours.parameters())
    with pytest.raises(EveryOError, match="4 parameters in the state, 8 in the optimizer.*"
                                          "in_proj_weight"):
        our_optimizer.load_state_dict(their_optimizer.state_dict())
    assert our_optimizer.state == {}
