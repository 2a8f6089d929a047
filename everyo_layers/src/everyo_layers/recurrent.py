"""Recurrent layers ``RNN``, ``LSTM`` and ``GRU``, each layer of the stack one fused op.

The parameters are named like PyTorch's (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
``bias_hh_l0``, ...) but stored in ``Linear``'s ``(in, out)`` layout: PyTorch's
``weight_ih_l0`` is ``layer.weight_ih_l0.data.T``. See :mod:`everyo_layers.recurrent_ops` for
the maths and docs/layers_sequence.md for the conventions.
"""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Module, Parameter, Tensor, concatenate, dispatch, stack
from everyo_layers.checks import argument, check_float
from everyo_layers.initializers import layer_generator
from everyo_layers.recurrent_bidirectional import OPS as _BIDIRECTIONAL_OPS
from everyo_layers.recurrent_ops import OPS as _RECURRENT_OPS
from everyo_layers.recurrent_run import check_lengths, run_direction


class _Recurrent(Module):
    """A stack of ``num_layers`` recurrent layers of one kind (set by the subclass)."""

    op_name = ""
    gates = 1
    has_cell = False

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 batch_first: bool = True, return_state: bool = False, seed=None,
                 bidirectional: bool = False, dropout: float = 0.0):
        super().__init__()
        name = type(self).__name__
        self.input_size = argument(name, "input_size", input_size, "positive int")
        self.hidden_size = argument(name, "hidden_size", hidden_size, "positive int")
        self.num_layers = argument(name, "num_layers", num_layers, "positive int")
        if argument(name, "dropout", dropout, "probability") == 1.0:
            raise EveryOError(f"{name}: dropout must be in [0, 1), got {dropout}")
        self.batch_first, self.return_state = bool(batch_first), bool(return_state)
        self.bidirectional, self.dropout = bool(bidirectional), float(dropout)
        self.rng = layer_generator(seed)
        # NOTE: PyTorch's init: every weight and bias from U(-1/sqrt(hidden), 1/sqrt(hidden)).
        bound = 1.0 / math.sqrt(self.hidden_size)
        width = self.gates * self.hidden_size
        for k in range(self.num_layers):
            fan = self.input_size if k == 0 else self.hidden_size * self.directions
            for suffix in self.suffixes:
                for name, shape in ((f"weight_ih_l{k}{suffix}", (fan, width)),
                                    (f"weight_hh_l{k}{suffix}", (self.hidden_size, width)),
                                    (f"bias_ih_l{k}{suffix}", (width,)),
                                    (f"bias_hh_l{k}{suffix}", (width,))):
                    data = self.rng.uniform(-bound, bound, size=shape).astype(np.float32)
                    setattr(self, name, Parameter(data))

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def suffixes(self) -> tuple:
        """Parameter-name suffix of each direction (PyTorch's)."""
        return ("", "_reverse") if self.bidirectional else ("",)

    @property
    def label(self) -> str:
        return f"{type(self).__name__}({self.input_size}→{self.hidden_size})"

    def layer_parameters(self, k: int, suffix: str = "") -> tuple:
        """``(weight_ih, weight_hh, bias_ih, bias_hh)`` of layer ``k`` (direction ``suffix``)."""
        return tuple(getattr(self, f"{n}_l{k}{suffix}")
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
        """The initial state(s) as a list (one entry per tensor), each (layers*dirs, batch, H)."""
        expected = (self.num_layers * self.directions, batch, self.hidden_size)
        if state is None:
            zeros = np.zeros(expected, dtype)
            return [zeros] * (2 if self.has_cell else 1)
        if self.has_cell and not isinstance(state, (tuple, list)):
            raise EveryOError(f"{self.label}: the initial state is a pair (h0, c0), got "
                              f"{type(state).__name__}")
        parts = list(state) if self.has_cell else [state]
        if self.has_cell and len(parts) != 2:
            raise EveryOError(f"{self.label}: the initial state is a pair (h0, c0)")
        for part in parts:
            shape = part.shape if isinstance(part, Tensor) else np.shape(part)
            if np.asarray(part.data if isinstance(part, Tensor) else part).dtype.kind == "c":
                raise EveryOError(f"{self.label}: the initial state is complex; a recurrent "
                                  f"layer's state is real (its imaginary part would be dropped)")
            if tuple(shape) != expected:
                raise EveryOError(f"{self.label}: expected initial state of shape "
                                  f"(num_layers * directions, batch, hidden) = {expected}, got "
                                  f"{tuple(shape)}")
        return parts

    def forward(self, x, state=None, lengths=None):
        """Run the stack over the sequence ``x``.

        Args:
            x: ``(batch, seq, input_size)`` (``(seq, batch, input_size)`` when not batch_first).
            state: optional initial state, ``(num_layers * directions, batch, hidden)``; for
                LSTM a pair ``(h0, c0)``. Zeros when omitted.
            lengths: optional real length of each sample (ints in ``[1, seq]``): outputs past
                it are zero and the final state is the one after the sample's last real step
                (PyTorch's packed-sequence results).

        Returns:
            The last layer's hidden state at every step (both directions concatenated on the
            last axis when bidirectional), laid out like ``x``; with ``return_state=True`` the
            pair ``(output, final_state)``, final states ``(num_layers * directions, batch,
            hidden)`` ordered layer by layer, forward before reverse.
        """
        data = self._check_input(x)
        batch, steps = (data.shape[:2] if self.batch_first else data.shape[1::-1])
        if lengths is not None:
            lengths = check_lengths(self.label, lengths, batch, steps)
        initial = self._initial(state, batch, data.dtype)
        out = x if self.batch_first else dispatch("transpose", x, axes=(1, 0, 2))
        finals: list = [[] for _ in initial]
        for k in range(self.num_layers):
            if k and self.dropout and self.training:
                out = dispatch("dropout", out, p=self.dropout, rng=self.rng)
            if self.bidirectional and self.op_name == "lstm" and lengths is None:
                out = self._both_directions(out, initial, k, finals)
                continue
            outputs = []
            for d, suffix in enumerate(self.suffixes):
                starts = [s[k * self.directions + d] for s in initial]
                result, last = run_direction(self.op_name, out, starts,
                                             self.layer_parameters(k, suffix), self._attrs(),
                                             self.has_cell, lengths, reverse=d == 1)
                outputs.append(result)
                for held, value in zip(finals, last):
                    held.append(value)
            out = outputs[0] if len(outputs) == 1 else concatenate(outputs, axis=2)
        if not self.batch_first:
            out = dispatch("transpose", out, axes=(1, 0, 2))
        if not self.return_state:
            return out
        final = [stack(f, axis=0) for f in finals]
        return out, (tuple(final) if self.has_cell else final[0])

    def _both_directions(self, x, initial: list, k: int, finals: list):
        """Layer ``k`` of a bidirectional LSTM as one ``bilstm`` op over batch-first ``x``
        (no lengths): its output sequence; appends both directions' final states to
        ``finals``."""
        operands = []
        for d, suffix in enumerate(self.suffixes):
            operands += [s[2 * k + d] for s in initial] + list(self.layer_parameters(k, suffix))
        out = dispatch("bilstm", x, *operands, batch_first=True)
        steps, hidden = x.shape[1], self.hidden_size
        if self.return_state:  # (the forward direction ends at the last step, the reverse one
            h, c = finals  # at the first)
            h += [out[:, steps - 1, :hidden], out[:, 0, hidden:]]
            c += [out[:, steps, :hidden], out[:, steps, hidden:]]
        return out[:, :steps]

    def _attrs(self) -> dict:
        return {}

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, return_state={self.return_state}, "
                f"bidirectional={self.bidirectional}, dropout={self.dropout}")


class RNN(_Recurrent):
    """Elman recurrent layer(s): ``h_t = tanh(x_t W_ih + b_ih + h_{t-1} W_hh + b_hh)``.

    Args:
        input_size: features of each step of the input.
        hidden_size: size of the hidden state.
        num_layers: stacked layers, each feeding its output sequence to the next.
        batch_first: input/output ``(batch, seq, features)``; else ``(seq, batch, features)``.
        return_state: also return the final hidden state ``(num_layers * directions, batch,
            hidden)``.
        nonlinearity: ``"tanh"`` (default) or ``"relu"``.
        seed: seed of the initialisation (PyTorch's scheme) and of the dropout masks.
        bidirectional: also run every layer backwards over the sequence; its parameters end in
            ``_reverse`` and the outputs of both directions are concatenated.
        dropout: drop probability applied (while training) to the input of every layer but
            the first.

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
                 nonlinearity: str = "tanh", seed=None, bidirectional: bool = False,
                 dropout: float = 0.0):
        if nonlinearity not in ("tanh", "relu"):
            raise EveryOError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, batch_first, return_state, seed,
                         bidirectional, dropout)
        self.nonlinearity = nonlinearity

    def _attrs(self) -> dict:
        return {"nonlinearity": self.nonlinearity}


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


OPS = {**_RECURRENT_OPS, **_BIDIRECTIONAL_OPS}
LAYERS = {"RNN": RNN, "LSTM": LSTM, "GRU": GRU}
