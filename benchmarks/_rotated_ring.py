"""The tcp ring's previous all-reduce, kept only so benchmarks can time it against the current
one in the same run: chunk ``c`` is summed in rotated order ``x_c + x_(c+1) + ... + x_(c-1)``
(one float64 partial sum per hop), which for three or more ranks is not the canonical rank
order and so not bit-identical to shm/mpi. Never used by everyo-dist itself.

``install(ring)`` makes ``ring.all_reduce`` this algorithm; ``uninstall(ring)`` undoes it.
"""

from __future__ import annotations

import types

import numpy as np

from everyo_dist.backends.tcp.allreduce import Fold, chunk_bounds
from everyo_dist.reduction import accumulator_dtype


def rotated_all_reduce(ring, flat: np.ndarray, mean: bool, out: np.ndarray) -> np.ndarray:
    """Ring reduce-scatter with float64 partial sums after the first hop, then all-gather."""
    size, rank = ring.size, ring.rank
    bounds = chunk_bounds(flat.size, size)
    widest = max(b - a for a, b in zip(bounds, bounds[1:]))
    incoming_raw = ring.scratch("rot_raw", flat.dtype, widest)
    wide = accumulator_dtype(flat.dtype)
    acc = ring.scratch("rot_acc", wide, widest)
    incoming_wide = ring.scratch("rot_wide", wide, widest)

    def chunk(array, index):
        return array[bounds[index]:bounds[index + 1]]

    for step in range(size - 2):
        send_index, recv_index = (rank - step) % size, (rank - step - 1) % size
        length = bounds[recv_index + 1] - bounds[recv_index]
        outgoing = chunk(flat, send_index) if step == 0 else \
            acc[:bounds[send_index + 1] - bounds[send_index]]
        incoming = (incoming_raw if step == 0 else incoming_wide)[:length]
        ring.transfer(step, outgoing, incoming)
        np.add(incoming, chunk(flat, recv_index), out=acc[:length], dtype=wide,
               casting="unsafe")
    step = size - 2
    send_index, owned = (rank - step) % size, (rank + 1) % size
    outgoing = chunk(flat, send_index) if step == 0 else \
        acc[:bounds[send_index + 1] - bounds[send_index]]
    partial = (incoming_raw if step == 0 else incoming_wide)[:bounds[owned + 1] - bounds[owned]]
    fold = Fold([(partial, 0), (chunk(flat, owned), None)], chunk(out, owned),
                size if mean else 1)
    first_gathered = (owned - 1) % size
    ring.pump([(step, outgoing, None), (step + 1, chunk(out, owned), fold.ready_bytes)],
              [(step, partial), (step + 1, chunk(out, first_gathered))], fold.work)
    for gather_step in range(1, size - 1):
        send_index, recv_index = (owned - gather_step) % size, \
            (owned - gather_step - 1) % size
        ring.transfer(step + 1 + gather_step, chunk(out, send_index), chunk(out, recv_index))
    return out


def install(ring) -> None:
    ring.all_reduce = types.MethodType(rotated_all_reduce, ring)


def uninstall(ring) -> None:
    ring.__dict__.pop("all_reduce", None)
