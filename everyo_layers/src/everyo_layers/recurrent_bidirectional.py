"""Both directions of a bidirectional LSTM layer as one op, ``bilstm``.

Why one op: run as two ``lstm`` ops, a bidirectional layer also needs the input reversed, the
reverse direction's outputs reversed back, both directions' outputs sliced apart from their
final cell states and concatenated; in backward each of those slices scatters its gradient
into a fresh array of zeros, and the concatenation splits it again. Here the two directions
are two ``LSTMOp`` runs on the same kernels, writing their outputs straight into one
time-major buffer, and backward hands each direction its half of the gradient (a view for the
forward direction, one copy in processing order for the reverse one). The numbers are the two
``lstm`` ops' exactly: same kernels, same operands, the copies only move values.

Operands: ``x``, then the forward direction's ``h0, c0, w_ih, w_hh, b_ih, b_hh``, then the
reverse direction's (``LSTMOp``'s layout each); attr ``batch_first``. Returns ``seq + 1`` steps
of ``2 * hidden`` features laid out like ``x``: both directions' hidden states at every step
(forward first, as PyTorch concatenates them), then both final cell states. The forward
direction's final hidden state is its last step's output, the reverse one's its first step's.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Op, concatenate
from everyo_layers.recurrent_composite import lstm_composite
from everyo_layers.recurrent_ops import LSTMOp

_PER_DIRECTION = 6  # h0, c0, w_ih, w_hh, b_ih, b_hh


def _direction(needs: tuple) -> LSTMOp:
    """A time-major ``LSTMOp`` run by hand (not recorded: this op is the graph node)."""
    op = object.__new__(LSTMOp)
    op.needs_input_grad, op.saved = needs, None
    return op


class BidirectionalLSTMOp(Op):
    """Both directions of one LSTM layer: see the module's docstring."""

    __slots__ = ("batch_first", "directions")
    name = "bilstm"

    def forward(self, x, *operands, batch_first=True):
        if x.ndim != 3 or len(operands) != 2 * _PER_DIRECTION:
            raise EveryOError(f"bilstm: expected a 3-D input sequence and 2 x {_PER_DIRECTION} "
                              f"state and weight operands, got shape {x.shape} and "
                              f"{len(operands)} operands")
        self.batch_first = batch_first
        need = self.needs_input_grad
        forward, reverse = (_direction(need[:1 + _PER_DIRECTION]),
                            _direction(need[:1] + need[1 + _PER_DIRECTION:]))
        self.directions = (forward, reverse)
        xt = x.transpose(1, 0, 2) if batch_first else x
        out_f = forward.forward(xt, *operands[:_PER_DIRECTION], batch_first=False)
        out_r = reverse.forward(xt[::-1], *operands[_PER_DIRECTION:], batch_first=False)
        steps, batch, hidden = xt.shape[0], xt.shape[1], out_f.shape[-1]
        out = np.empty((steps + 1, batch, 2 * hidden), out_f.dtype)
        out[:, :, :hidden] = out_f
        out[:steps, :, hidden:] = out_r[steps - 1::-1]
        out[steps, :, hidden:] = out_r[steps]
        return out.transpose(1, 0, 2) if batch_first else out

    def backward(self, g):
        forward, reverse = self.directions
        gt = g.transpose(1, 0, 2) if self.batch_first else g
        steps, hidden = gt.shape[0] - 1, gt.shape[-1] // 2
        g_r = np.empty((steps + 1,) + gt.shape[1:2] + (hidden,), gt.dtype)
        g_r[:steps] = gt[steps - 1::-1, :, hidden:]
        g_r[steps] = gt[steps, :, hidden:]
        grads_f = forward.backward(gt[:, :, :hidden])
        grads_r = reverse.backward(g_r)
        dx = None
        if self.needs_input_grad[0]:
            dx = grads_f[0] + grads_r[0][::-1]
            if self.batch_first:
                dx = dx.transpose(1, 0, 2)
        return (dx, *grads_f[1:], *grads_r[1:])

    def composite(self, x, *operands):
        time = 1 if self.batch_first else 0

        def steps(start, stop, step=1):
            return (slice(None),) * time + (slice(start, stop, step),)

        count = x.shape[time]
        source = x[steps(None, None, -1)]
        out_f = lstm_composite(x, *operands[:_PER_DIRECTION], self.batch_first)
        out_r = lstm_composite(source, *operands[_PER_DIRECTION:], self.batch_first)
        hidden_states = concatenate([out_f[steps(None, count)],
                                     out_r[steps(count - 1, None, -1)]], axis=2)
        cells = concatenate([out_f[steps(count, None)], out_r[steps(count, None)]], axis=2)
        return concatenate([hidden_states, cells], axis=time)


OPS = {"bilstm": BidirectionalLSTMOp}
