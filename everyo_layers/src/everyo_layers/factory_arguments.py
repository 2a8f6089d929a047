"""PyTorch's ``device=`` and ``dtype=`` constructor arguments (its "factory kwargs"), taken by
every layer that creates parameters or floating buffers, in one place.

``nn.Linear(3, 4, device="cpu", dtype=torch.float64)`` ports as
``eo.Linear(3, 4, device="cpu", dtype=torch.float64)``: ``device`` is ``None``, ``"cpu"``
(``"cpu:0"``) or a ``torch.device("cpu")`` (EveryO's only device; any other is refused by
name), ``dtype`` a floating dtype given as NumPy's, a name (``"float64"``, ``"bfloat16"``) or a
``torch.dtype`` (read by its name; torch is never imported). The layer's floating parameters
and buffers are created in that dtype, as ``layer.to(dtype)`` would cast them, sub-layers
included (a ``TransformerEncoderLayer``'s ``Linear``s). docs/porting.md.

The same wrapper names a layer too large to create (``eo.Linear(3, 10**10)``): an
``EveryOMemoryError`` (also a ``MemoryError``) with the layer's arguments, the shape and bytes.

The layers are listed by public name in :data:`LAYERS_TAKING_FACTORY_ARGUMENTS` (PyTorch's
counterparts of all of them take the two arguments); importing this module gives each of them
the two keyword-only arguments, once, through :func:`with_factory_arguments`.
"""

from __future__ import annotations

import functools
import inspect

from everyo.errors import EveryOError, allocating
from everyo.validation import checked_argument, checked_device, parameter_dtype
from everyo_layers.activation import LeakyReLU, ReLU
from everyo_layers.activation_smooth import ELU, Hardswish, Mish, SiLU
from everyo_layers.attention import MultiHeadAttention
from everyo_layers.conv import Conv2D
from everyo_layers.conv1d import Conv1D
from everyo_layers.conv_transpose import Conv2DTranspose
from everyo_layers.embedding import Embedding
from everyo_layers.linear import Linear
from everyo_layers.norm import BatchNorm1D, BatchNorm2D, LayerNorm
from everyo_layers.norm_group import GroupNorm, RMSNorm
from everyo_layers.norm_instance import InstanceNorm1D, InstanceNorm2D
from everyo_layers.recurrent import GRU, LSTM, RNN
from everyo_layers.recurrent_cell import GRUCell, LSTMCell, RNNCell
from everyo_layers.transformer import TransformerDecoderLayer, TransformerEncoderLayer
from everyo_layers.transformer_stack import Transformer

LAYERS_TAKING_FACTORY_ARGUMENTS = (
    Linear, Conv1D, Conv2D, Conv2DTranspose, Embedding, BatchNorm1D, BatchNorm2D, LayerNorm,
    GroupNorm, RMSNorm, InstanceNorm1D, InstanceNorm2D, RNN, LSTM, GRU, RNNCell, LSTMCell,
    GRUCell, MultiHeadAttention, TransformerEncoderLayer, TransformerDecoderLayer, Transformer,
)

#: The layers whose PyTorch counterparts take ``inplace=`` (``Dropout`` takes it itself).
LAYERS_TAKING_INPLACE = (ReLU, LeakyReLU, ELU, SiLU, Hardswish, Mish)

#: PyTorch's constructor options EveryO takes at their default only: keyword-only, a value
#: other than PyTorch's default is refused by name with what to do instead.
DEFAULT_ONLY_ARGUMENTS = {
    Conv1D: {"padding_mode": ("zeros", "pad first, e.g. with eo.pad(x, ..., mode='reflect')")},
    Conv2D: {"padding_mode": ("zeros", "pad first with eo.ReflectionPad2D or "
                                       "eo.ReplicationPad2D")},
    Conv2DTranspose: {"padding_mode": ("zeros", "only zeros, as in PyTorch"),
                      "groups": (1, "a grouped transposed convolution is not implemented"),
                      "dilation": (1, "a dilated transposed convolution is not implemented")},
    Embedding: {"max_norm": (None, "renormalise the table yourself under eo.no_grad()"),
                "norm_type": (2.0, "it only matters with max_norm"),
                "scale_grad_by_freq": (False, "not implemented"),
                "sparse": (False, "EveryO's gradients are dense")},
}


def checked_factory_arguments(name: str, device, dtype):
    """The NumPy dtype (or None) after checking both arguments of layer ``name``: the CPU or
    an ``EveryOError`` naming the device; a real floating dtype or one naming it."""
    checked_device(f"{name}(device=...)", device)
    return None if dtype is None else parameter_dtype(f"{name}(dtype=...)", dtype)


def _extended_signature(original, extra: list) -> inspect.Signature:
    """``original``'s signature with the parameters ``extra`` added (before ``**kwargs``)."""
    signature = inspect.signature(original)
    parameters = list(signature.parameters.values())
    # keyword-only parameters go last (before **kwargs), positional-or-keyword ones right
    # after the last positional one
    stops = (inspect.Parameter.VAR_KEYWORD,) if all(
        p.kind is p.KEYWORD_ONLY for p in extra) else (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.VAR_KEYWORD)
    at = next((i for i, p in enumerate(parameters) if p.kind in stops), len(parameters))
    fresh = [p for p in extra if p.name not in signature.parameters]
    return signature.replace(parameters=parameters[:at] + fresh + parameters[at:])


def with_factory_arguments(cls: type) -> type:
    """Give ``cls.__init__`` the keyword-only ``device=None, dtype=None`` (once; a subclass
    that inherits the wrapped ``__init__`` is not wrapped again)."""
    original = cls.__init__
    if getattr(original, "takes_factory_arguments", False):
        return cls

    @functools.wraps(original)
    def __init__(self, *args, device=None, dtype=None, **kwargs):
        # NOTE: checked before anything is allocated
        name = type(self).__name__
        resolved = checked_factory_arguments(name, device, dtype)
        call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        with allocating(f"{name}({call}) creating its parameters"):
            original(self, *args, **kwargs)
            if resolved is not None:
                self.to(resolved)

    __init__.__signature__ = _extended_signature(  # type: ignore[attr-defined]
        original, [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
                   for name in ("device", "dtype")])
    __init__.takes_factory_arguments = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def with_inplace_argument(cls: type) -> type:
    """Give ``cls.__init__`` PyTorch's ``inplace=False``, last and positional too (as in
    ``nn.ReLU(True)``, ``nn.LeakyReLU(0.2, True)``): a bool, kept as ``layer.inplace``. The
    layer still returns its output as a new tensor and leaves its input as it is, which is
    what every use of a layer's output sees (docs/porting.md)."""
    original = cls.__init__
    if getattr(original, "takes_inplace", False):
        return cls
    positional = [p for p in list(inspect.signature(original).parameters.values())[1:]
                  if p.kind is p.POSITIONAL_OR_KEYWORD]

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if len(args) == len(positional) + 1 and "inplace" not in kwargs:
            *args, kwargs["inplace"] = args
        inplace = checked_argument(type(self).__name__, "inplace", kwargs.pop("inplace", False),
                                   "bool", EveryOError)
        original(self, *args, **kwargs)
        self.inplace = inplace

    __init__.__signature__ = _extended_signature(  # type: ignore[attr-defined]
        original, [inspect.Parameter("inplace", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                     default=False)])
    __init__.takes_inplace = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def with_default_only_arguments(cls: type, options: dict) -> type:
    """Give ``cls.__init__`` the keyword-only ``options`` (``{name: (PyTorch's default,
    what to do instead)}``), accepted at their default and refused by name otherwise."""
    original = cls.__init__
    if getattr(original, "takes_default_only", False):
        return cls

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        for name, (default, instead) in options.items():
            value = kwargs.pop(name, default)
            same = value is default or (
                isinstance(value, bool) == isinstance(default, bool)
                and isinstance(value, (int, float, str)) and value == default)
            if not same:
                raise EveryOError(f"{type(self).__name__}: {name}={value!r} is not supported, "
                                  f"only PyTorch's default {default!r}: {instead}")
        original(self, *args, **kwargs)

    __init__.__signature__ = _extended_signature(  # type: ignore[attr-defined]
        original, [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
                   for name, (default, _) in options.items()])
    __init__.takes_default_only = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


for _layer, _options in DEFAULT_ONLY_ARGUMENTS.items():
    with_default_only_arguments(_layer, _options)
for _layer in LAYERS_TAKING_FACTORY_ARGUMENTS:
    with_factory_arguments(_layer)
for _layer in LAYERS_TAKING_INPLACE:
    with_inplace_argument(_layer)
