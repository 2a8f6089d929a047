"""One step of a recurrent layer: ``RNNCell``, ``LSTMCell`` and ``GRUCell`` (PyTorch's cells).

A cell runs the full layer's fused op (``rnn``, ``lstm``, ``gru``) over a sequence of one step,
with the same weights in the same layout (``weight_ih`` is ``(input_size, gates * hidden)``,
PyTorch's transposed) drawn in the same order from the same distribution: a cell and a
one-layer ``LSTM``/``GRU``/``RNN`` built with the same ``seed`` hold equal parameters, and one
step of each gives the same bits. The parameters carry PyTorch's cell names (``weight_ih``,
``weight_hh``, ``bias_ih``, ``bias_hh``, no layer suffix).
"""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Module, Parameter, Tensor, dispatch
from everyo_layers.checks import argument, check_float
from everyo_layers.initializers import layer_generator

_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


class _Cell(Module):
    """The shared constructor, checks and step of the three cells (set by the subclass)."""

    op_name = ""
    gates = 1
    has_cell = False

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, seed=None):
        super().__init__()
        name = type(self).__name__
        self.input_size = argument(name, "input_size", input_size, "positive int")
        self.hidden_size = argument(name, "hidden_size", hidden_size, "positive int")
        self.bias = bool(bias)
        rng = layer_generator(seed)
        # NOTE: PyTorch's init, drawn in the full layers' order (w_ih, w_hh, b_ih, b_hh), so
        # the same seed gives a cell the weights of a one-layer RNN/LSTM/GRU.
        bound = 1.0 / math.sqrt(self.hidden_size)
        width = self.gates * self.hidden_size
        shapes = ((self.input_size, width), (self.hidden_size, width), (width,), (width,))
        for name, shape in zip(_NAMES, shapes if self.bias else shapes[:2]):
            data = rng.uniform(-bound, bound, size=shape).astype(np.float32)
            setattr(self, name, Parameter(data))
        if not self.bias:
            self.bias_ih = self.bias_hh = None

    @property
    def label(self) -> str:
        return f"{type(self).__name__}({self.input_size}→{self.hidden_size})"

    def _check_input(self, x) -> np.ndarray:
        data = check_float(self.label, x)
        if data.ndim not in (1, 2) or data.shape[-1] != self.input_size:
            raise EveryOError(f"{self.label}: expected input (batch, {self.input_size}) or "
                              f"({self.input_size},), got shape {data.shape}")
        return data

    def _states(self, hx, batch: int, unbatched: bool, dtype) -> list:
        """The state operands, each ``(batch, hidden)``; zeros when ``hx`` is None."""
        expected = (self.hidden_size,) if unbatched else (batch, self.hidden_size)
        if hx is None:
            return [np.zeros((batch, self.hidden_size), dtype)] * (2 if self.has_cell else 1)
        if self.has_cell and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise EveryOError(f"{self.label}: the state is a pair (h, c), got "
                              f"{type(hx).__name__}")
        parts = list(hx) if self.has_cell else [hx]
        for part in parts:
            shape = tuple(part.shape if isinstance(part, Tensor) else np.shape(part))
            if shape != expected:
                raise EveryOError(f"{self.label}: expected a state of shape {expected} "
                                  f"(the input is {'un' if unbatched else ''}batched), got "
                                  f"{shape}")
        return [p.reshape(1, -1) if unbatched else p for p in parts]

    def _weights(self) -> tuple:
        if self.bias:
            return self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh
        zero = np.zeros(self.gates * self.hidden_size, self.weight_ih.dtype)
        return self.weight_ih, self.weight_hh, zero, zero

    def forward(self, x, hx=None):
        """One step from state ``hx`` (zeros when omitted).

        Args:
            x: ``(batch, input_size)``, or ``(input_size,)`` unbatched.
            hx: ``(batch, hidden)`` (``(hidden,)`` unbatched); for ``LSTMCell`` the pair
                ``(h, c)``.

        Returns:
            The next hidden state, shaped like ``hx``; for ``LSTMCell`` the pair ``(h, c)``.
        """
        data = self._check_input(x)
        unbatched = data.ndim == 1
        batch = 1 if unbatched else data.shape[0]
        states = self._states(hx, batch, unbatched, data.dtype)
        sequence = dispatch("reshape", x, shape=(batch, 1, self.input_size))
        out = dispatch(self.op_name, sequence, *states, *self._weights(),
                       batch_first=True, **self._attrs())
        parts = [out[:, 0], out[:, 1]] if self.has_cell else [out[:, 0]]
        if unbatched:
            parts = [p.reshape(self.hidden_size) for p in parts]
        return tuple(parts) if self.has_cell else parts[0]

    def _attrs(self) -> dict:
        return {}

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"


class RNNCell(_Cell):
    """One Elman step: ``h' = tanh(x W_ih + b_ih + h W_hh + b_hh)`` (PyTorch's ``RNNCell``).

    Args:
        input_size: features of the input.
        hidden_size: size of the hidden state.
        bias: learn ``bias_ih`` and ``bias_hh``.
        nonlinearity: ``"tanh"`` (default) or ``"relu"``.
        seed: seed of the initialisation (the weights of ``RNN(..., seed=seed)``).

    Example:
        >>> import everyo as eo
        >>> cell = eo.RNNCell(3, 5, seed=0)
        >>> cell(eo.ones(4, 3)).shape, cell.weight_ih.shape
        ((4, 5), (3, 5))
    """

    onnx_export = "refused"  # as the full layers (declared per class: not inherited)

    op_name, gates = "rnn", 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", seed=None):
        if nonlinearity not in ("tanh", "relu"):
            raise EveryOError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got "
                              f"{nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, seed)
        self.nonlinearity = nonlinearity

    def _attrs(self) -> dict:
        return {"nonlinearity": self.nonlinearity}


class LSTMCell(_Cell):
    """One LSTM step with PyTorch's gates ``i, f, g, o``; the state is the pair ``(h, c)``.

    Args: as :class:`RNNCell` (without ``nonlinearity``).

    Example:
        >>> import everyo as eo
        >>> cell = eo.LSTMCell(3, 5, seed=0)
        >>> h, c = cell(eo.ones(4, 3))
        >>> h, c = cell(eo.ones(4, 3), (h, c))
        >>> h.shape, c.shape, cell.weight_ih.shape
        ((4, 5), (4, 5), (3, 20))
    """

    onnx_export = "refused"  # as the full layers (declared per class: not inherited)

    op_name, gates, has_cell = "lstm", 4, True


class GRUCell(_Cell):
    """One GRU step with PyTorch's gates ``r, z, n``.

    Args: as :class:`RNNCell` (without ``nonlinearity``).

    Example:
        >>> import everyo as eo
        >>> eo.GRUCell(3, 5, seed=0)(eo.ones(4, 3)).shape
        (4, 5)
    """

    onnx_export = "refused"  # as the full layers (declared per class: not inherited)

    op_name, gates = "gru", 3


LAYERS = {"RNNCell": RNNCell, "LSTMCell": LSTMCell, "GRUCell": GRUCell}
