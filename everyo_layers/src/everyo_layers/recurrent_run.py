"""Running one direction of one recurrent layer over batch-first input, with optional
per-sample lengths (PyTorch's packed-sequence results) — all with the fused ops and core ops,
so gradients (and the engine's second derivatives) need nothing new.

Variable lengths: the samples are sorted by decreasing length and the sequence is cut at every
distinct length; each piece is one fused-op call over the samples still running, started from
their state at the end of the previous piece. Total work is the sum of the lengths (as packed
sequences), one op call per distinct length. Outputs past a sample's length are zero and its
final state is the state after its last real step.

Reverse direction: each sample's real steps are reversed in place (``t -> length - 1 - t``),
run forwards, and the outputs reversed back with the same index.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, concatenate, dispatch, zeros


def check_lengths(label: str, lengths, batch: int, steps: int) -> np.ndarray:
    """``lengths`` as an int array of one entry in ``[1, steps]`` per sample, or an error."""
    try:
        data = np.asarray(lengths.data if hasattr(lengths, "data") else lengths)
    except (TypeError, ValueError):  # ragged nesting and the like
        data = np.asarray(None)
    if data.dtype.kind not in "iu" or data.shape != (batch,):
        raise EveryOError(f"{label}: lengths must be {batch} integers (one per sample), got "
                          f"{data.dtype.name} array of shape {data.shape}")
    if data.size and (data.max() > steps or data.min() < 1):
        raise EveryOError(f"{label}: lengths must be between 1 and the sequence length {steps}, "
                          f"got {data.min()}..{data.max()}")
    return data.astype(np.int64)


def reverse_index(lengths: np.ndarray, steps: int) -> tuple:
    """Advanced index reversing each sample's first ``length`` steps (the rest stay put)."""
    t = np.arange(steps)
    within = t[None, :] < lengths[:, None]
    time = np.where(within, lengths[:, None] - 1 - t[None, :], t[None, :])
    return np.arange(len(lengths))[:, None], time


def reverse_steps(x, lengths):
    """``x`` (B, T, ...) with each sample's real steps reversed."""
    if lengths is None:
        return x[:, ::-1]
    return x[reverse_index(lengths, x.shape[1])]


def _call(op: str, x, states: list, params: tuple, attrs: dict, has_cell: bool,
          reversed_outputs: bool = False):
    """One fused-op call: ``(outputs (B, T, H), final states)``; with ``reversed_outputs`` the
    outputs come last step first (one slice: no separate reversal, whose gradient would be
    one more scatter into zeros)."""
    steps = x.shape[1]
    out = dispatch(op, x, *states, *params, batch_first=True, **attrs)
    outputs = out[:, steps - 1::-1] if reversed_outputs else \
        (out[:, :steps] if has_cell else out)
    if has_cell:  # the op appends the final cell state as one more step
        return outputs, [out[:, steps - 1], out[:, steps]]
    return outputs, [out[:, steps - 1]]


def run_direction(op: str, x, states: list, params: tuple, attrs: dict, has_cell: bool,
                  lengths=None, reverse: bool = False):
    """Run one direction over batch-first ``x`` from ``states`` (each (B, H)); ``reverse``:
    over ``x``'s steps in reverse order, the outputs put back in ``x``'s order.

    Returns:
        ``(outputs (B, T, H), final states)``; with ``lengths``, outputs are zero past each
        sample's length and the final states are taken at each sample's last real step.
    """
    if reverse:
        source = reverse_steps(x, lengths)
        if lengths is None:
            return _call(op, source, states, params, attrs, has_cell, reversed_outputs=True)
        outputs, finals = run_direction(op, source, states, params, attrs, has_cell, lengths)
        return reverse_steps(outputs, lengths), finals
    if lengths is None or not len(lengths):  # an empty batch has nothing to cut by length
        return _call(op, x, states, params, attrs, has_cell)
    batch, steps = x.shape[:2]
    order = np.argsort(-lengths, kind="stable")
    inverse = np.argsort(order)
    sorted_lengths = lengths[order]
    xs = x[order]
    states = [s[order] for s in states]
    pieces, finished, start = [], [], 0
    for stop in np.unique(sorted_lengths):
        running = int(np.count_nonzero(sorted_lengths > start))
        out, states = _call(op, xs[:running, start:stop], [s[:running] for s in states],
                            params, attrs, has_cell)
        if running < batch:  # the samples already done output zeros
            out = concatenate([out, zeros(batch - running, stop - start, out.shape[2],
                                          dtype=out.dtype)], axis=0)
        pieces.append(out)
        still = int(np.count_nonzero(sorted_lengths > stop))
        finished.append([s[still:running] for s in states])
        start = int(stop)
    if start < steps:
        pieces.append(zeros(batch, steps - start, pieces[0].shape[2], dtype=pieces[0].dtype))
    outputs = concatenate(pieces, axis=1) if len(pieces) > 1 else pieces[0]
    # finished pieces come shortest first, i.e. from the end of the sorted order
    finals = [concatenate([part[k] for part in reversed(finished)], axis=0)
              if len(finished) > 1 else finished[0][k] for k in range(len(finished[0]))]
    return outputs[inverse], [f[inverse] for f in finals]
