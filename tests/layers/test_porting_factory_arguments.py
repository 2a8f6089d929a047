"""PyTorch's ``device=``/``dtype=`` constructor arguments on every layer with parameters: the
CPU is accepted, other devices refused by name, parameters and floating buffers created in
the dtype (NumPy's, a name, or a torch dtype by name)."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError
from everyo.plugins import registry
from everyo_layers.factory_arguments import LAYERS_TAKING_FACTORY_ARGUMENTS

ARGUMENTS = {
    "Linear": (3, 4), "Conv1D": (3, 4, 3), "Conv2D": (3, 4, 3), "Conv2DTranspose": (3, 4, 3),
    "Embedding": (10, 4), "BatchNorm1D": (4,), "BatchNorm2D": (4,), "LayerNorm": (4,),
    "GroupNorm": (2, 4), "RMSNorm": (4,), "InstanceNorm1D": (4,), "InstanceNorm2D": (4,),
    "RNN": (3, 4), "LSTM": (3, 4), "GRU": (3, 4), "RNNCell": (3, 4), "LSTMCell": (3, 4),
    "GRUCell": (3, 4), "MultiHeadAttention": (4, 2), "TransformerEncoderLayer": (4, 2, 8),
    "TransformerDecoderLayer": (4, 2, 8),
    "Transformer": (4, 2, 1, 1, 8),
}
NAMES = [cls.__name__ for cls in LAYERS_TAKING_FACTORY_ARGUMENTS]


def _floating_arrays(layer):
    arrays = [("parameter " + n, p.data) for n, p in layer.named_parameters()]
    arrays += [("buffer " + n, b.data if isinstance(b, eo.Tensor) else np.asarray(b))
               for n, b in layer.named_buffers()]
    return [(n, a) for n, a in arrays if a.dtype.kind == "f" or a.dtype.name == "bfloat16"]


def _build(name, **options):
    extra = {"track_running_stats": True} if name.startswith("InstanceNorm") else {}
    return getattr(eo, name)(*ARGUMENTS[name], **extra, **options)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["float64", np.float64, np.dtype("float16"), "bfloat16"])
def test_layer_parameters_are_created_in_the_dtype(name, dtype):
    layer = _build(name, device="cpu", dtype=dtype)
    arrays = _floating_arrays(layer)
    assert arrays, f"{name} has no floating parameters or buffers"
    for what, array in arrays:
        assert array.dtype == np.dtype(dtype), f"{name} {what} is {array.dtype}"


@pytest.mark.parametrize("name", NAMES)
def test_layer_signature_has_pytorchs_factory_arguments(name):
    parameters = inspect.signature(getattr(eo, name)).parameters
    assert parameters["device"].default is None and parameters["dtype"].default is None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "mps", "meta"])
def test_other_devices_are_refused_by_name(name, device):
    with pytest.raises(EveryOError, match=rf"{name}\(device=...\).*{device}"):
        _build(name, device=device)


@pytest.mark.parametrize("dtype", ["int64", np.int32, "bool", "complex64", "float8_e4m3fn",
                                   "no-such-dtype"])
def test_non_floating_dtypes_are_refused_by_name(dtype):
    with pytest.raises(EveryOError, match=r"Linear\(dtype=...\)"):
        eo.Linear(3, 4, dtype=dtype)


def test_torch_devices_and_dtypes_are_read_by_name(torch):
    theirs = torch.nn.Linear(3, 4, device=torch.device("cpu"), dtype=torch.float64)
    ours = eo.Linear(3, 4, device=torch.device("cpu"), dtype=torch.float64)
    assert ours.weight.dtype == str(theirs.weight.dtype).removeprefix("torch.")
    assert eo.LSTM(3, 4, dtype=torch.bfloat16).weight_ih_l0.dtype == "bfloat16"
    with pytest.raises(EveryOError, match=r"Conv2D\(device=...\).*meta"):
        eo.Conv2D(3, 4, 3, device=torch.device("meta"))
    with pytest.raises(EveryOError, match=r"Conv2D\(dtype=...\).*int64"):
        eo.Conv2D(3, 4, 3, dtype=torch.int64)
    # and wherever a dtype is taken: a tensor's and a module's .to
    assert eo.ones(2).to("cpu", torch.float64).dtype == "float64"
    assert eo.Linear(2, 2).to(torch.float16).weight.dtype == "float16"


def test_a_float64_layer_computes_in_float64():
    layer = eo.Linear(3, 4, dtype="float64", seed=0)
    out = layer(np.ones((2, 3)))
    assert out.dtype == "float64"


def test_every_layer_with_parameters_takes_the_factory_arguments():
    """A layer class that creates parameters when built must be in the list (else a new
    layer would raise TypeError on device=/dtype=)."""
    missing = []
    for name, cls in registry("layers").items.items():
        if not (inspect.isclass(cls) and issubclass(cls, eo.Module)):
            continue
        for args in [(), (4,), (4, 4), (4, 2), (4, 4, 3), (4, 2, 3)]:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    layer = cls(*args)
            except (EveryOError, TypeError, ValueError):
                continue
            if any(True for _ in layer.parameters()) and \
                    cls not in LAYERS_TAKING_FACTORY_ARGUMENTS:
                missing.append(name)
            break
    assert not missing, f"layers with parameters but no device=/dtype=: {missing}"


@pytest.mark.parametrize("name, args, options", [
    ("Conv2D", (3, 4, 3), {"padding_mode": "zeros"}),
    ("Conv1D", (3, 4, 3), {"padding_mode": "zeros"}),
    ("Conv2DTranspose", (3, 4, 3), {"padding_mode": "zeros", "groups": 1, "dilation": 1}),
    ("Embedding", (10, 4), {"max_norm": None, "norm_type": 2, "scale_grad_by_freq": False,
                            "sparse": False}),
])
def test_pytorch_options_at_their_default_are_accepted(name, args, options, torch):
    torch_name = {"Conv2D": "Conv2d", "Conv1D": "Conv1d",
                  "Conv2DTranspose": "ConvTranspose2d"}.get(name, name)
    theirs = inspect.signature(getattr(torch.nn, torch_name)).parameters
    ours = inspect.signature(getattr(eo, name)).parameters
    for option in options:
        assert ours[option].default == theirs[option].default, option
    assert getattr(eo, name)(*args, **options).weight is not None


@pytest.mark.parametrize("call, says", [
    (lambda: eo.Conv2D(3, 4, 3, padding=1, padding_mode="reflect"),
     r"Conv2D: padding_mode='reflect' is not supported.*ReflectionPad2D"),
    (lambda: eo.Conv1D(3, 4, 3, padding_mode="circular"), "Conv1D: padding_mode='circular'"),
    (lambda: eo.Conv2DTranspose(4, 4, 3, groups=2), "Conv2DTranspose: groups=2"),
    (lambda: eo.Conv2DTranspose(4, 4, 3, groups=True), "Conv2DTranspose: groups=True"),
    (lambda: eo.Embedding(10, 4, max_norm=1.0), "Embedding: max_norm=1.0"),
    (lambda: eo.Embedding(10, 4, sparse=True), "Embedding: sparse=True.*dense"),
    (lambda: eo.Embedding(10, 4, scale_grad_by_freq=1), "Embedding: scale_grad_by_freq=1"),
])
def test_pytorch_options_other_than_the_default_are_refused_by_name(call, says):
    with pytest.raises(EveryOError, match=says):
        call()
