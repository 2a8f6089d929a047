"""``Conv1D`` on NWC input: the 2-D convolution ops on a height-1 view (free reshapes)."""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, dispatch
from everyo_layers.checks import argument, check_float, check_groups
from everyo_layers.initializers import fan_in_bound, layer_generator, uniform_parameter
from everyo_layers.padding import effective_kernel, resolve_padding
from everyo_layers.windows import check_geometry


def _single(value, what: str) -> int:
    if isinstance(value, (tuple, list)) and len(value) == 1:
        (value,) = value
    return argument("Conv1D", what, value, "positive int")


class Conv1D(Module):
    """1-D convolution over NWC input ``(batch, length, channels)``, as Keras.

    Args:
        in_channels, out_channels: channels of the input and the output.
        kernel_size, stride, dilation: ints.
        padding: ``"valid"``, ``"same"`` (TensorFlow's rule), ``"causal"`` (all padding on the
            left: output step t sees only inputs up to t), an int or ``(left, right)``.
        groups: independent channel groups (``groups=in_channels``: depthwise).
        bias: learn an additive bias per output channel.
        seed: seed of the initialisation (PyTorch's: U(+-1/sqrt(in/groups*k))).

    Attributes:
        weight: Parameter of shape ``(k, in_channels // groups, out_channels)``.
        bias: Parameter of shape ``(out_channels,)`` or None.

    Example:
        >>> import everyo as eo
        >>> conv = eo.Conv1D(4, 6, 5, dilation=2, padding="same", seed=0)
        >>> conv(eo.ones(2, 30, 4)).shape, conv.weight.shape
        ((2, 30, 6), (5, 4, 6))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding="valid", dilation: int = 1, groups: int = 1, bias: bool = True,
                 seed=None):
        super().__init__()
        self.in_channels = argument("Conv1D", "in_channels", in_channels, "positive int")
        self.out_channels = argument("Conv1D", "out_channels", out_channels, "positive int")
        (_, k), (_, s), (_, d) = check_geometry(
            "Conv1D", (1, _single(kernel_size, "kernel_size")), (1, _single(stride, "stride")),
            (1, _single(dilation, "dilation")))
        self.kernel_size, self.stride, self.dilation = k, s, d
        self.groups = check_groups("Conv1D", groups, self.in_channels, self.out_channels)
        if padding != "causal":
            self.pads_2d(padding, 1)  # validate the form early
        self.padding = padding
        rng = layer_generator(seed)
        per_group = self.in_channels // self.groups
        bound = fan_in_bound(per_group * k)
        self.weight = uniform_parameter(rng, (k, per_group, self.out_channels), bound)
        self.bias = uniform_parameter(rng, (self.out_channels,), bound) if bias else None

    def pads_2d(self, padding, length: int) -> tuple:
        """``padding`` for an input of ``length`` steps as the 2-D ops' explicit pads
        ``((0, 0), (left, right))`` (also what the ONNX exporter writes).

        Example:
            >>> import everyo as eo
            >>> eo.Conv1D(2, 2, 3, dilation=2, padding="causal").pads_2d("causal", 10)
            ((0, 0), (4, 0))
        """
        if padding == "causal":
            return (0, 0), (effective_kernel(self.kernel_size, self.dilation) - 1, 0)
        if isinstance(padding, str):
            return resolve_padding(padding, (1, length), (1, self.kernel_size),
                                   (1, self.stride), (1, self.dilation))
        if isinstance(padding, (int, np.integer)):
            padding = (int(padding), int(padding))
        try:
            return resolve_padding(((0, 0), tuple(padding)), (1, length), (1, self.kernel_size))
        except (EveryOError, TypeError):
            raise EveryOError(f"Conv1D: padding must be 'valid', 'same', 'causal', an int or "
                              f"(left, right) ints >= 0, got {padding!r}") from None

    @property
    def label(self) -> str:
        return f"Conv1D({self.in_channels}→{self.out_channels})"

    def forward(self, x):
        data = check_float(self.label, x)
        if data.ndim != 3 or data.shape[-1] != self.in_channels:
            hint = (" — is this NCW?" if data.ndim == 3 and data.shape[1] == self.in_channels
                    else "")
            raise EveryOError(f"{self.label}: expected NWC input with {self.in_channels} "
                              f"channels, got shape {data.shape}{hint}")
        n, length, _ = data.shape
        pads = self.pads_2d(self.padding, length)
        if length + sum(pads[1]) < effective_kernel(self.kernel_size, self.dilation):
            raise EveryOError(f"{self.label}: a kernel of {self.kernel_size} (dilation "
                              f"{self.dilation}) does not fit input {data.shape} with padding "
                              f"{pads[1]}")
        x4 = dispatch("reshape", x, shape=(n, 1, length, self.in_channels))
        w4 = dispatch("reshape", self.weight, shape=(1,) + self.weight.shape)
        operands = (x4, w4) if self.bias is None else (x4, w4, self.bias)
        attrs = {"stride": (1, self.stride), "padding": pads, "dilation": (1, self.dilation)}
        if self.groups > 1:
            out = dispatch("grouped_conv2d", *operands, groups=self.groups, **attrs)
        else:
            out = dispatch("conv2d", *operands, **attrs)
        return dispatch("reshape", out, shape=(n, out.shape[2], self.out_channels))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding!r}, dilation={self.dilation}, "
                f"groups={self.groups}")


OPS: dict = {}
LAYERS = {"Conv1D": Conv1D}
