"""The LSTM time loop's arguments (``lstm_forward_steps``) for the kernel tests: projected
inputs, the hidden weight, and the state buffers with a random first state."""

from __future__ import annotations

import numpy as np


def lstm_forward_arguments(rng, steps, batch, hidden, dtype):
    """``(acts, w, hs, cs, tanh_c)`` as the layer passes them (buffers zeroed past step 0)."""
    acts = (rng.standard_normal((steps, batch, 4 * hidden)) * 0.7).astype(dtype)
    w = (rng.standard_normal((hidden, 4 * hidden)) * 0.6 / np.sqrt(hidden)).astype(dtype)
    hs = np.zeros((steps + 2, batch, hidden), dtype)
    cs = np.zeros((steps + 1, batch, hidden), dtype)
    hs[0] = rng.standard_normal((batch, hidden)).astype(dtype)
    cs[0] = rng.standard_normal((batch, hidden)).astype(dtype)
    return acts, w, hs, cs, np.zeros((steps, batch, hidden), dtype)
