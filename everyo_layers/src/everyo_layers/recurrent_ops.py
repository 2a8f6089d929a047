"""Fused recurrent ops: one op runs a whole RNN, LSTM or GRU layer over the sequence.

Why fused: a sequence of T steps built from core ops would be ~15 graph nodes per step, and
Python overhead would dominate. Here the input projection of every step is ONE matmul, the
time loop runs on plain arrays keeping the gate activations, and backward is hand-written
backpropagation through time that ends with one matmul per weight gradient.

Weight layout (shared by the three ops, Keras-like ``(in, out)`` as in ``Linear``):
``w_ih`` is ``(input_size, G*H)`` and ``w_hh`` is ``(H, G*H)``, ``b_ih``/``b_hh`` are
``(G*H,)``, the G gate blocks in PyTorch's order (LSTM ``i, f, g, o``; GRU ``r, z, n``;
RNN one block). PyTorch's ``weight_ih_l0`` is exactly ``w_ih.T``.

Operands ``x`` are ``(batch, seq, features)`` when ``batch_first`` else ``(seq, batch,
features)``; the loop itself runs time-major on views, so neither layout copies the sequence.
"""

from __future__ import annotations

import functools

import numpy as np

from everyo import EveryOError, Op
from everyo.kernels import blas_matmul, kernel
from everyo_layers.recurrent_composite import gru_composite, lstm_composite, rnn_composite


def sigmoid_(a: np.ndarray) -> np.ndarray:
    """In-place logistic function as ``(1 + tanh(a/2)) / 2``: stable, no overflow warnings."""
    a *= 0.5
    np.tanh(a, out=a)
    a += 1.0
    a *= 0.5
    return a


class ScratchPool:
    """Scratch arrays that a backward pass borrows and returns, reused across steps.

    Why: a fresh multi-megabyte array is paged in by the kernel on first touch (glibc hands
    large freed blocks back to the OS), which cost the LSTM benchmark ~30% of its time in page
    faults. Only arrays that are dead when ``backward`` returns are pooled; at most ``keep``
    arrays per (shape, dtype) are kept. ``list.pop``/``append`` are atomic, so threads that
    run backward concurrently simply get different arrays.
    """

    def __init__(self, keep: int = 2, max_keys: int = 8):
        self.keep, self.max_keys = keep, max_keys
        self._free: dict = {}

    def take(self, shape: tuple, dtype) -> np.ndarray:
        """An uninitialised array of ``shape``/``dtype``, reused when one is free."""
        try:
            return self._free[(shape, np.dtype(dtype))].pop()
        except (KeyError, IndexError):
            return np.empty(shape, dtype)

    def give(self, *arrays: np.ndarray) -> None:
        """Return arrays nobody references any more."""
        for array in arrays:
            key = (array.shape, array.dtype)
            free = self._free.get(key)
            if free is None:
                if len(self._free) >= self.max_keys:
                    self._free.pop(next(iter(self._free)), None)  # forget the oldest shape
                free = self._free.setdefault(key, [])
            if len(free) < self.keep:
                free.append(array)


SCRATCH = ScratchPool()


def _time_major(x: np.ndarray, batch_first: bool) -> np.ndarray:
    return x.transpose(1, 0, 2) if batch_first else x


def _weight_gradients(xt: np.ndarray, previous: np.ndarray, flat: np.ndarray) -> tuple:
    """``(dw_ih, dw_hh)`` when one array holds both weights' pre-activation gradients
    (``flat``, (T*B, G*H)): ``[x_t | h_{t-1}]^T @ flat`` as one GEMM, split by rows.

    NOTE: each row of the product is the same dot products over the same T*B terms as in two
    separate GEMMs, and one GEMM of ``F + H`` rows ran ~6% faster than the two of ``F`` and
    ``H`` rows (bi-LSTM benchmark shapes: 1.72 against 1.83 ms), copying the two operands side
    by side (one pass over the sequence and the hidden states, ~0.02 ms) included.
    """
    steps, batch, features = xt.shape
    dtype = np.result_type(xt, previous, flat)  # (flat's: the activations' dtype)
    both = np.empty((steps, batch, features + previous.shape[-1]), dtype)
    both[..., :features] = xt
    both[..., features:] = previous
    product = blas_matmul(both.reshape(steps * batch, both.shape[-1]).T, flat)
    return product[:features], product[features:]


class _FusedRecurrentOp(Op):
    """Shared input projection and weight-gradient code of the fused recurrent ops.

    A subclass's ``forward`` calls ``_project`` then runs its time loop; its ``backward`` runs
    the loop in reverse, filling ``d_pre_x`` / ``d_pre_h``, the gradients of the
    pre-activations fed by the input and by the hidden projection (one array when both
    biases enter at the same place, as in LSTM and RNN), and ends with ``_gradients``.
    """

    __slots__ = ("batch_first",)
    gates = 1

    def _project(self, x, w_ih, w_hh, b_ih, b_hh, h0, fold_hidden_bias: bool):
        if x.ndim != 3:
            raise EveryOError(f"{self.name}: expected a 3-D input sequence, got shape {x.shape}")
        xt = _time_major(x, self.batch_first)
        steps, batch, features = xt.shape
        hidden = w_hh.shape[0]
        if w_ih.shape != (features, self.gates * hidden) or h0.shape != (batch, hidden):
            raise EveryOError(
                f"{self.name}: input features {features}, weights {w_ih.shape}/{w_hh.shape} "
                f"and initial state {h0.shape} do not fit (expected w_ih "
                f"({features}, {self.gates * hidden}), state ({batch}, {hidden}))")
        bias = b_ih + b_hh if fold_hidden_bias else b_ih
        # NOTE: the input projection of every time step in one GEMM. (Reshapes name every
        # size: NumPy cannot infer a -1 next to a zero, and an empty batch must work.)
        projected = blas_matmul(xt.reshape(steps * batch, features), w_ih)
        if bias is not None:  # (None: the caller's time loop adds it)
            projected += bias
        return xt, projected.reshape(steps, batch, projected.shape[-1]), hidden

    def _gradients(self, xt, hs, w_ih, w_hh, d_pre_x, d_pre_h, dh0, extra=()):
        """Gradients of every operand from the per-step pre-activation gradients."""
        need = self.needs_input_grad
        steps, batch, features = xt.shape
        flat_x = d_pre_x.reshape(steps * batch, d_pre_x.shape[-1])
        flat_h = d_pre_h.reshape(steps * batch, d_pre_h.shape[-1])
        dx = dw_ih = dw_hh = db_ih = db_hh = None
        if need[0]:
            dx = blas_matmul(flat_x, w_ih.T).reshape(steps, batch, features)
            if self.batch_first:
                dx = dx.transpose(1, 0, 2)
        n_states = 1 + len(extra)
        w_ih_i = n_states + 1
        if need[w_ih_i] and need[w_ih_i + 1] and d_pre_h is d_pre_x:
            dw_ih, dw_hh = _weight_gradients(xt, hs[:steps], flat_x)
        else:
            if need[w_ih_i]:
                dw_ih = blas_matmul(xt.reshape(steps * batch, features).T, flat_x)
            if need[w_ih_i + 1]:
                previous = hs[:steps].reshape(steps * batch, hs.shape[-1])
                dw_hh = blas_matmul(previous.T, flat_h)
        if need[w_ih_i + 2]:
            db_ih = flat_x.sum(axis=0)
        if need[w_ih_i + 3]:
            # (one array for both: the sum once)
            db_hh = db_ih.copy() if db_ih is not None and d_pre_h is d_pre_x else \
                flat_h.sum(axis=0)
        return (dx, dh0 if need[1] else None, *extra, dw_ih, dw_hh, db_ih, db_hh)


class RNNOp(_FusedRecurrentOp):
    """Elman RNN layer: ``h_t = act(x_t W_ih + b_ih + h_{t-1} W_hh + b_hh)``.

    Operands ``(x, h0, w_ih, w_hh, b_ih, b_hh)``; attrs ``batch_first``, ``nonlinearity``
    ("tanh" or "relu"). Returns the hidden state of every step, laid out like ``x``.
    """

    __slots__ = ("relu",)
    name = "rnn"
    gates = 1

    def forward(self, x, h0, w_ih, w_hh, b_ih, b_hh, batch_first=True, nonlinearity="tanh"):
        self.batch_first, self.relu = batch_first, nonlinearity == "relu"
        xt, pre, hidden = self._project(x, w_ih, w_hh, b_ih, b_hh, h0, True)
        steps, batch = xt.shape[:2]
        hs = np.empty((steps + 1, batch, hidden), pre.dtype)
        hs[0] = h0
        for t in range(steps):
            h = hs[t + 1]
            np.add(pre[t], blas_matmul(hs[t], w_hh), out=h)
            if self.relu:
                np.maximum(h, 0, out=h)
            else:
                np.tanh(h, out=h)
        self.saved = (xt, hs, w_ih, w_hh)
        out = hs[1:]
        return out.transpose(1, 0, 2) if batch_first else out

    def backward(self, g):
        xt, hs, w_ih, w_hh = self.saved
        gt = _time_major(g, self.batch_first)
        d_pre = SCRATCH.take(hs[1:].shape, hs.dtype)
        dh = np.zeros_like(hs[0])
        w_hh_t = np.ascontiguousarray(w_hh.T)  # faster in BLAS than the transposed view
        for t in range(len(d_pre) - 1, -1, -1):
            dh += gt[t]
            h = hs[t + 1]
            if self.relu:
                np.multiply(dh, h > 0, out=d_pre[t])
            else:
                np.multiply(dh, 1 - h * h, out=d_pre[t])
            dh = blas_matmul(d_pre[t], w_hh_t)
        grads = self._gradients(xt, hs, w_ih, w_hh, d_pre, d_pre, dh)
        SCRATCH.give(d_pre)
        return grads

    def composite(self, x, h0, w_ih, w_hh, b_ih, b_hh):
        return rnn_composite(x, h0, w_ih, w_hh, b_ih, b_hh, self.batch_first, self.relu)


@functools.lru_cache(maxsize=64)
def _gate_blocks(order: tuple, hidden: int, scaled: tuple = ()) -> tuple:
    """``(target, source, scale)`` slice triples that put the gate blocks of a ``(.., G*H)``
    axis in ``order``: target block ``j`` is source block ``order[j]``, to be scaled when
    ``j`` is in ``scaled``. Neighbouring blocks that stay neighbours in both orders and share
    ``scale`` make one slice (one NumPy call fewer each: ``o, i, f, g`` from ``i, f, g, o`` is
    two copies, or three with the sigmoid gates scaled, instead of four)."""
    runs: list = []
    for j, b in enumerate(order):
        scale = j in scaled
        if runs and runs[-1][1] == j and runs[-1][3] == b and runs[-1][4] == scale:
            runs[-1][1], runs[-1][3] = j + 1, b + 1
        else:
            runs.append([j, j + 1, b, b + 1, scale])
    return tuple((slice(t0 * hidden, t1 * hidden), slice(s0 * hidden, s1 * hidden), scale)
                 for t0, t1, s0, s1, scale in runs)


class LSTMOp(_FusedRecurrentOp):
    """LSTM layer with PyTorch's gates ``i, f, g, o``:
    ``c_t = f*c_{t-1} + i*g``, ``h_t = o*tanh(c_t)``.

    Operands ``(x, h0, c0, w_ih, w_hh, b_ih, b_hh)``; attr ``batch_first``. Returns
    ``seq + 1`` steps laid out like ``x``: the hidden state of every step, then the final
    cell state (an op has one output; the layer slices the two apart).

    NOTE: internally the gate blocks are reordered to ``o, i, f, g`` (undone on the weight
    gradients): the three sigmoid gates are then contiguous, so with their columns pre-scaled
    by 1/2 one ``tanh`` over the whole block activates all four gates
    (``sigmoid(z) = (1 + tanh(z/2)) / 2``), and in backward the three gates driven by the
    cell gradient (``i, f, g``) are contiguous too. Per step that is ~10 ufunc calls, not ~25.
    The reordering moves whole blocks (slices, no gather), scaling as it copies.
    """

    __slots__ = ()
    name = "lstm"
    gates = 4
    ORDER = (3, 0, 1, 2)  # o, i, f, g from PyTorch's i, f, g, o

    def _internal(self, w: np.ndarray, dtype, scaled: bool) -> np.ndarray:
        """``w``'s last axis in the internal gate order, the sigmoid gates' columns times
        1/2 when ``scaled`` (exact: a power of two)."""
        out = np.empty(w.shape, dtype)
        sigmoid_gates = (0, 1, 2) if scaled else ()
        for target, source, scale in _gate_blocks(self.ORDER, w.shape[-1] // 4, sigmoid_gates):
            if scale:
                np.multiply(w[..., source], 0.5, out=out[..., target])
            else:
                out[..., target] = w[..., source]
        return out

    def _restored(self, grad: np.ndarray) -> np.ndarray:
        """A gradient's last axis back in PyTorch's gate order."""
        out = np.empty(grad.shape, grad.dtype)
        for target, source, _ in _gate_blocks(self.ORDER, grad.shape[-1] // 4):
            out[..., source] = grad[..., target]
        return out

    def forward(self, x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first=True):
        self.batch_first = batch_first
        H = w_hh.shape[0]
        dtype = np.result_type(w_ih, w_hh)
        bias = b_ih + b_hh
        bias = self._internal(bias, np.result_type(bias, dtype), scaled=True)
        # (the bias is added in the time loop: one fewer pass over every step's activations)
        xt, acts, _ = self._project(x, self._internal(w_ih, dtype, scaled=True), w_hh, None,
                                    None, h0, False)
        if c0.shape != h0.shape:
            raise EveryOError(f"lstm: cell state shape {c0.shape} != hidden state {h0.shape}")
        steps, batch = xt.shape[:2]
        scaled_w_hh = self._internal(w_hh, dtype, scaled=True)
        hs = np.empty((steps + 2, batch, H), acts.dtype)  # h0, h_1..h_T, then c_T
        cs = np.empty((steps + 1, batch, H), acts.dtype)
        tanh_c = np.empty((steps, batch, H), acts.dtype)
        hs[0], cs[0] = h0, c0
        kernel.lstm_forward_steps(acts, scaled_w_hh, hs, cs, tanh_c, bias)
        hs[steps + 1] = cs[steps]
        self.saved = (xt, hs, cs, acts, tanh_c, w_ih, w_hh)
        out = hs[1:]
        return out.transpose(1, 0, 2) if batch_first else out

    def backward(self, g):
        xt, hs, cs, acts, tanh_c, w_ih, w_hh = self.saved
        gt = _time_major(g, self.batch_first)
        steps = acts.shape[0]
        d_pre = SCRATCH.take(acts.shape, acts.dtype)
        work = SCRATCH.take(tanh_c.shape, tanh_c.dtype)
        dc = np.array(gt[steps], copy=True)  # gradient reaching the final cell state
        w_hh_t = self._internal(w_hh, w_hh.dtype, scaled=False).T  # (a view: see the kernel)
        dh = kernel.lstm_backward_steps(gt, acts, cs, tanh_c, w_hh_t, dc, d_pre, work)
        need_c0 = self.needs_input_grad[2]
        # (the input weight in the internal order only serves dx)
        w_ih_k = self._internal(w_ih, w_ih.dtype, scaled=False) if self.needs_input_grad[0] \
            else None
        grads = self._gradients(xt, hs, w_ih_k, None, d_pre, d_pre, dh,
                                extra=(dc if need_c0 else None,))
        SCRATCH.give(d_pre, work)  # _gradients copied out what it needed
        return tuple(grad if grad is None or k < 3 else self._restored(grad)
                     for k, grad in enumerate(grads))

    def composite(self, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        return lstm_composite(x, h0, c0, w_ih, w_hh, b_ih, b_hh, self.batch_first)


class GRUOp(_FusedRecurrentOp):
    """GRU layer with PyTorch's gates ``r, z, n``; the reset gate multiplies the hidden
    projection *including* its bias: ``n = tanh(x W_in + b_in + r * (h W_hn + b_hn))``,
    ``h_t = (1 - z) * n + z * h_{t-1}``.

    Operands ``(x, h0, w_ih, w_hh, b_ih, b_hh)``; attr ``batch_first``. Returns the hidden
    state of every step, laid out like ``x``.
    """

    __slots__ = ()
    name = "gru"
    gates = 3

    def forward(self, x, h0, w_ih, w_hh, b_ih, b_hh, batch_first=True):
        self.batch_first = batch_first
        xt, acts, hidden = self._project(x, w_ih, w_hh, b_ih, b_hh, h0, False)
        steps, batch = xt.shape[:2]
        H = hidden
        hs = np.empty((steps + 1, batch, H), acts.dtype)
        hidden_n = np.empty((steps, batch, H), acts.dtype)  # h W_hn + b_hn, needed by dr
        hs[0] = h0
        for t in range(steps):
            a = acts[t]
            hp = blas_matmul(hs[t], w_hh)
            hp += b_hh
            rz = a[:, :2 * H]
            rz += hp[:, :2 * H]
            sigmoid_(rz)
            hidden_n[t] = hp[:, 2 * H:]
            n = a[:, 2 * H:]
            n += a[:, :H] * hidden_n[t]
            np.tanh(n, out=n)
            h = hs[t + 1]
            np.subtract(hs[t], n, out=h)
            h *= a[:, H:2 * H]
            h += n
        self.saved = (xt, hs, acts, hidden_n, w_ih, w_hh)
        out = hs[1:]
        return out.transpose(1, 0, 2) if batch_first else out

    def backward(self, g):
        xt, hs, acts, hidden_n, w_ih, w_hh = self.saved
        gt = _time_major(g, self.batch_first)
        steps = acts.shape[0]
        H = hs.shape[-1]
        d_pre_x = SCRATCH.take(acts.shape, acts.dtype)
        d_pre_h = SCRATCH.take(acts.shape, acts.dtype)
        dh = np.zeros_like(hs[0])
        w_hh_t = np.ascontiguousarray(w_hh.T)  # faster in BLAS than the transposed view
        for t in range(steps - 1, -1, -1):
            dh += gt[t]
            a, dx_t, dh_t = acts[t], d_pre_x[t], d_pre_h[t]
            r, z, n = a[:, :H], a[:, H:2 * H], a[:, 2 * H:]
            dn = dx_t[:, 2 * H:]
            np.multiply(dh, (1 - z) * (1 - n * n), out=dn)
            np.multiply(dn, r, out=dh_t[:, 2 * H:])
            np.multiply(dn, hidden_n[t] * r * (1 - r), out=dx_t[:, :H])
            np.multiply(dh, (hs[t] - n) * z * (1 - z), out=dx_t[:, H:2 * H])
            dh_t[:, :2 * H] = dx_t[:, :2 * H]
            dh = dh * z + blas_matmul(dh_t, w_hh_t)
        grads = self._gradients(xt, hs, w_ih, w_hh, d_pre_x, d_pre_h, dh)
        SCRATCH.give(d_pre_x, d_pre_h)
        return grads

    def composite(self, x, h0, w_ih, w_hh, b_ih, b_hh):
        return gru_composite(x, h0, w_ih, w_hh, b_ih, b_hh, self.batch_first)


OPS = {"rnn": RNNOp, "lstm": LSTMOp, "gru": GRUOp}
