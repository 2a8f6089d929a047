"""The LSTM's time loops, forward and backward, around the per-step hidden-state GEMM. The NumPy
references below are what ``LSTMOp`` runs unless a kernel provider (``everyo.kernels``)
supplies faster ones.

Layout (``LSTMOp``'s): gate blocks ordered ``o, i, f, g``, the sigmoid gates' pre-activations
(and their columns of ``scaled_w_hh``) scaled by 1/2, so that ``sigmoid(z) =
(1 + tanh(z/2)) / 2`` and one ``tanh`` activates all four gates. Time-major arrays.
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import Kernel, blas_matmul


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[...] = a @ b`` without allocating (float16 goes through float32 BLAS)."""
    if out.dtype == np.float16:
        out[...] = blas_matmul(a, b)
    else:
        np.matmul(a, b, out=out)
    return out


def lstm_forward_steps(acts, scaled_w_hh, hs, cs, tanh_c, bias=None) -> None:
    """Run the cell over every step: ``acts[t]`` (B, 4H) holds the input projection's
    pre-activations (plus ``bias`` (4H,), when given, added here first) and becomes the gates'
    activations; fills ``hs[1:T+1]``, ``cs[1:T+1]`` and ``tanh_c[:T]`` (``hs[0]``, ``cs[0]``
    are the initial states)."""
    if bias is not None:
        acts += bias
    steps, batch, four = acts.shape
    hidden = four // 4
    product = np.empty((batch, four), acts.dtype)
    for t in range(steps):
        a = acts[t]  # pre-activations become activations in place
        a += matmul_into(hs[t], scaled_w_hh, product)
        np.tanh(a, out=a)
        sig = a[:, :3 * hidden]
        sig += 1.0
        sig *= 0.5
        o, i, f, g = (a[:, :hidden], a[:, hidden:2 * hidden], a[:, 2 * hidden:3 * hidden],
                      a[:, 3 * hidden:])
        c = cs[t + 1]
        np.multiply(f, cs[t], out=c)
        np.multiply(i, g, out=tanh_c[t])
        c += tanh_c[t]
        np.tanh(c, out=tanh_c[t])
        np.multiply(o, tanh_c[t], out=hs[t + 1])


def lstm_backward_steps(gt, acts, cs, tanh_c, w_hh_t, dc, d_pre, work) -> np.ndarray:
    """Backpropagation through the steps: fills ``d_pre`` (T, B, 4H), the pre-activations'
    gradients; ``dc`` (B, H) enters as the final cell state's gradient and leaves as the
    initial one's; ``work`` (T, B, H) is scratch; returns the initial hidden state's gradient
    (B, H)."""
    steps, batch = acts.shape[:2]
    hidden = acts.shape[-1] // 4
    w_hh_t = np.ascontiguousarray(w_hh_t)  # NOTE: BLAS is ~30% faster per step on it than on .T
    o, i, f, gg = (acts[..., :hidden], acts[..., hidden:2 * hidden],
                   acts[..., 2 * hidden:3 * hidden], acts[..., 3 * hidden:])
    # Per-step factors, computed for all steps at once (in place: no temporaries):
    # d_pre = factor * dh for the o gate, factor * dc for i, f, g.
    factor = d_pre
    for block, gate, other in ((slice(None, hidden), o, tanh_c),
                               (slice(hidden, 2 * hidden), i, gg),
                               (slice(2 * hidden, 3 * hidden), f, cs[:steps])):
        out = factor[..., block]  # sigmoid'(z) = s * (1 - s), times the other factor
        np.subtract(1, gate, out=out)
        out *= gate
        out *= other
    out = factor[..., 3 * hidden:]  # tanh'(z) = 1 - g^2, times i
    np.multiply(gg, gg, out=out)
    np.subtract(1, out, out=out)
    out *= i
    dc_from_dh = np.multiply(tanh_c, tanh_c, out=work)
    np.subtract(1, dc_from_dh, out=dc_from_dh)
    dc_from_dh *= o
    # NOTE: each step's factors are read once, so d_pre overwrites them in place (one
    # fewer (T, B, 4H) array to allocate and page in).
    d_cell = d_pre.reshape(steps, batch, 4, hidden)[:, :, 1:]
    dh = np.zeros((batch, hidden), acts.dtype)
    scratch = np.empty_like(dh)
    for t in range(steps - 1, -1, -1):
        dh += gt[t]
        np.multiply(dh, dc_from_dh[t], out=scratch)
        dc += scratch
        d_pre[t, :, :hidden] *= dh
        d_cell[t] *= dc[:, None, :]
        dc *= f[t]
        matmul_into(d_pre[t], w_hh_t, dh)
    return dh


KERNELS = {
    "lstm_forward_steps": Kernel(lstm_forward_steps, """
        acts (T, B, 4H) pre-activations (input projection [+ biases]), gate blocks o, i, f, g
        with o, i, f pre-scaled by 1/2; scaled_w_hh (H, 4H) in the same layout; hs (T+2, B, H)
        and cs (T+1, B, H) with the initial states at index 0; tanh_c (T, B, H); bias None or
        (4H,) in acts' layout, added to every step's pre-activations before the hidden
        product (``(acts + bias) + product``, in that order). All one floating dtype (float16
        products through float32 BLAS). Overwrites acts with the activations, fills
        hs[1:T+1], cs[1:T+1] and tanh_c. Returns None."""),
    "lstm_backward_steps": Kernel(lstm_backward_steps, """
        gt (T, B, H) the outputs' gradients (any strides); acts, cs, tanh_c as
        lstm_forward_steps left them; w_hh_t (4H, H) the unscaled hidden weight, transposed
        (any strides: the op hands over a transposed view, made contiguous here once);
        dc (B, H) the final cell state's gradient, overwritten with the initial one's; d_pre
        (T, B, 4H) scratch, filled with the pre-activations' gradients; work (T, B, H)
        scratch, any contents. Returns the initial hidden state's gradient (B, H), a new
        array."""),
}
