"""Recurrent layers ``RNN``, ``LSTM`` and ``GRU``, each layer of the stack one fused op.

The parameters are named like PyTorch's (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
``bias_hh_l0``, ...) but stored in ``Linear``'s ``(in, out)`` layout: PyTorch's
``weight_ih_l0`` is ``layer.weight_ih_l0.data.T``. See :mod:`everyo_layers.recurrent_ops` for
the maths and docs/layers_sequence.md for the conventions.
"""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Module, Parameter, Tensor, dispatch, stack
from everyo_layers.checks import check_float
from everyo_layers.recurrent_ops import OPS as _RECURRENT_OPS


class _Recurrent(Module):
    """A stack of ``num_layers`` recurrent layers of one kind (set by the subclass)."""

    op_name = ""
    gates = 1
    has_cell = False

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = True, return_state: bool = False, seed=None):
        super().__init__()
        if min(input_size, hidden_size, num_layers) <= 0:
            raise EveryOError(f"{type(self).__name__}: input_size, hidden_size and num_layers "
                              f"must be positive, got {input_size}, {hidden_size}, {num_layers}")
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers = int(num_layers)
        self.batch_first, self.return_state = bool(batch_first), bool(return_state)
        rng = np.random.default_rng(seed)
        # NOTE: PyTorch's init: every weight and bias from U(-1/sqrt(hidden), 1/sqrt(hidden)).
        bound = 1.0 / math.sqrt(self.hidden_size)
        width = self.gates * self.hidden_size
        for k in range(self.num_layers):
            fan = self.input_size if k == 0 else self.hidden_size
            for name, shape in ((f"weight_ih_l{k}", (fan, width)),
                                (f"weight_hh_l{k}", (self.hidden_size, width)),
                                (f"bias_ih_l{k}", (width,)), (f"bias_hh_l{k}", (width,))):
                data = rng.uniform(-bound, bound, size=shape).astype(np.float32)
                setattr(self, name, Parameter(data))

    @property
    def label(self) -> str:
        return f"{type(self).__name__}({self.input_size}→{self.hidden_size})"

    def layer_parameters(self, k: int) -> tuple:
        """``(weight_ih, weight_hh, bias_ih, bias_hh)`` of layer ``k`` of the stack."""
        return tuple(getattr(self, f"{n}_l{k}")
                     for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    def _check_input(self, x) -> np.ndarray:
        data = check_float(self.label, x)
        layout = "(batch, seq, features)" if self.batch_first else "(seq, batch, features)"
        if data.ndim != 3 or data.shape[-1] != self.input_size:
            raise EveryOError(f"{self.label}: expected input {layout} with "
                              f"{self.input_size} features, got shape {data.shape}")
        if data.shape[1 if self.batch_first else 0] == 0:
            raise EveryOError(f"{self.label}: the input sequence {layout} is empty "
                              f"(shape {data.shape})")
        return data

    def _initial(self, state, batch: int, dtype) -> list:
        """The initial state(s) as a list (one entry per tensor), each (layers, batch, H)."""
        expected = (self.num_layers, batch, self.hidden_size)
        if state is None:
            zeros = np.zeros(expected, dtype)
            return [zeros] * (2 if self.has_cell else 1)
        parts = list(state) if self.has_cell else [state]
        if self.has_cell and len(parts) != 2:
            raise EveryOError(f"{self.label}: the initial state is a pair (h0, c0)")
        for part in parts:
            shape = part.shape if isinstance(part, Tensor) else np.shape(part)
            if tuple(shape) != expected:
                raise EveryOError(f"{self.label}: expected initial state of shape "
                                  f"(num_layers, batch, hidden) = {expected}, got {tuple(shape)}")
        return parts

    def forward(self, x, state=None):
        """Run the stack over the sequence ``x``.

        Args:
            x: ``(batch, seq, input_size)`` (``(seq, batch, input_size)`` when not batch_first).
            state: optional initial state, ``(num_layers, batch, hidden)``; for LSTM a pair
                ``(h0, c0)``. Zeros when omitted.

        Returns:
            The last layer's hidden state at every step, laid out like ``x``; with
            ``return_state=True`` the pair ``(output, final_state)``.
        """
        data = self._check_input(x)
        steps = data.shape[1] if self.batch_first else data.shape[0]
        batch = data.shape[0] if self.batch_first else data.shape[1]
        initial = self._initial(state, batch, data.dtype)
        last = (slice(None), -1) if self.batch_first else -1
        finals: list = [[] for _ in initial]
        out = x
        for k in range(self.num_layers):
            starts = [s[k] for s in initial]
            out = dispatch(self.op_name, out, *starts, *self.layer_parameters(k),
                           **self._attrs())
            if self.has_cell:  # the op appends the final cell state as one more step
                seq = (slice(None), slice(None, steps)) if self.batch_first else slice(None, steps)
                cell = (slice(None), steps) if self.batch_first else steps
                if self.return_state:
                    finals[1].append(out[cell])
                out = out[seq]
            if self.return_state:
                finals[0].append(out[last])
        if not self.return_state:
            return out
        final = [stack(f, axis=0) for f in finals]
        return out, (tuple(final) if self.has_cell else final[0])

    def _attrs(self) -> dict:
        return {"batch_first": self.batch_first}

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, return_state={self.return_state}")


class RNN(_Recurrent):
    """Elman recurrent layer(s): ``h_t = tanh(x_t W_ih + b_ih + h_{t-1} W_hh + b_hh)``.

    Args:
        input_size: features of each step of the input.
        hidden_size: size of the hidden state.
        num_layers: stacked layers, each feeding its output sequence to the next.
        batch_first: input/output ``(batch, seq, features)``; else ``(seq, batch, features)``.
        return_state: also return the final hidden state ``(num_layers, batch, hidden)``.
        nonlinearity: ``"tanh"`` (default) or ``"relu"``.
        seed: seed of the initialisation (PyTorch's scheme).

    Example:
        >>> import everyo as eo
        >>> rnn = eo.RNN(3, 5, num_layers=2, return_state=True, seed=0)
        >>> out, h = rnn(eo.ones(4, 6, 3))
        >>> out.shape, h.shape
        ((4, 6, 5), (2, 4, 5))
    """

    onnx_export = "refused"

    op_name, gates = "rnn", 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = True, return_state: bool = False,
                 nonlinearity: str = "tanh", seed=None):
        if nonlinearity not in ("tanh", "relu"):
            raise EveryOError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, batch_first, return_state, seed)
        self.nonlinearity = nonlinearity

    def _attrs(self) -> dict:
        return {"batch_first": self.batch_first, "nonlinearity": self.nonlinearity}


class LSTM(_Recurrent):
    """Long short-term memory layer(s) with PyTorch's gate order ``i, f, g, o``.

    Args: as :class:`RNN` (without ``nonlinearity``); the state is a pair ``(h, c)``.

    Example:
        >>> import everyo as eo
        >>> lstm = eo.LSTM(3, 5, return_state=True, seed=0)
        >>> out, (h, c) = lstm(eo.ones(4, 6, 3))
        >>> out.shape, h.shape, c.shape
        ((4, 6, 5), (1, 4, 5), (1, 4, 5))
    """

    onnx_export = "refused"

    op_name, gates, has_cell = "lstm", 4, True


class GRU(_Recurrent):
    """Gated recurrent unit layer(s) with PyTorch's gate order ``r, z, n``.

    Args: as :class:`RNN` (without ``nonlinearity``).

    Example:
        >>> import everyo as eo
        >>> gru = eo.GRU(3, 5, seed=0)
        >>> gru(eo.ones(4, 6, 3)).shape
        (4, 6, 5)
    """

    onnx_export = "refused"

    op_name, gates = "gru", 3


OPS = dict(_RECURRENT_OPS)
LAYERS = {"RNN": RNN, "LSTM": LSTM, "GRU": GRU}
