"""The tcp ring's all-reduce, in rank order: every element is summed ``x0 + x1 + ... + x(n-1)``
in float64 (int64 for integers), divided for a mean and rounded once, exactly as
:func:`~everyo_dist.reduction.reduce_rows` does, so the flat ring agrees bit for bit with
``shm``, ``mpi`` and ``tcp_hierarchical`` at every world size.

Two schedules compute that order; each call takes the one whose busiest link carries fewer
bytes (:func:`plan`), which never changes the bits:

- **ring** (reduce-scatter, then all-gather). Chunk ``c`` travels ``c, c+1, ..., n-1, 0, ...,
  c-1`` and is finished on its owner ``c - 1``. Until the chunk passes rank 0 the ranks it
  visits cannot be added yet (they come *after* rank 0 in the sum), so it carries their raw
  rows; from rank 0 on it carries one float64 partial sum ``x0 + ... + xr`` (rank 0 sends
  ``x0`` itself, in the caller's dtype). The owner adds, in rank order, the partial sum, its
  own row and the raw rows, in one pass while the last part (the partial sum) arrives. With
  two ranks this is the classic ring (one row each way).
- **chain** (large worlds, or float64 at four ranks and more, where raw rows would outweigh
  it): the whole vector streams ``0 -> 1 -> ... -> n-1`` as a float64 partial sum, each rank
  adding its row block by block as it arrives; rank ``n - 1`` finishes it and the result
  streams on round the ring ``n-1 -> 0 -> ... -> n-2``. About ``8 + b`` bytes per element on
  every link, whatever the world size.

A vector longer than :data:`PIECE_BYTES` runs as consecutive all-reduces of pieces of it (each
with its own schedule), so that the scratch each rank keeps is bounded by one piece.

A message made of several parts (a partial sum in one dtype, raw rows in another) is sent as
one frame per part, so every part's dtype and length are validated against what the receiver
computed it must be (``Ring._check_header``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from everyo_dist.reduction import REDUCE_BLOCK, accumulator_dtype, reduce_rows

_BLOCK = 131072  # items folded at a time as they arrive: the working set stays in cache
PIECE_BYTES = 64 << 20
"""A longer vector is all-reduced piece by piece, each piece of at most this many input bytes,
so the ring's scratch (raw rows, float64 partial sums: ``Ring.scratch``, kept for the next
call) is bounded by one piece, not the vector; DistributedDataParallel's 25 MiB buckets are one
piece each. Elementwise reduction: the cut changes no bit."""
_WIDE_BYTES = 8  # a float64 (int64) partial sum


def chunk_bounds(count: int, parts: int) -> list[int]:
    """Start offsets of ``parts`` nearly equal chunks of ``count`` items, plus the end.

    Example:
        >>> chunk_bounds(10, 3)
        [0, 4, 7, 10]
    """
    base, extra = divmod(count, parts)
    bounds = [0]
    for index in range(parts):
        bounds.append(bounds[-1] + base + (1 if index < extra else 0))
    return bounds


def message_parts(chunk: int, sender: int, size: int) -> tuple[str | None, range]:
    """What ``sender`` passes on for ``chunk`` in the ring schedule: the kind of partial sum
    (``None``, ``"raw"`` = rank 0's own row, ``"wide"`` = a float64/int64 sum of ranks
    ``0 .. sender``) and the ranks whose raw rows follow it.

    Example:
        >>> message_parts(2, 3, 4), message_parts(2, 0, 4), message_parts(0, 1, 4)
        ((None, range(2, 4)), ('raw', range(2, 4)), ('wide', range(0, 0)))
    """
    if chunk > 0 and sender >= chunk:  # not yet past rank 0: raw rows only
        return None, range(chunk, sender + 1)
    return ("raw" if sender == 0 else "wide"), range(chunk, size if chunk > 0 else chunk)


@lru_cache(maxsize=256)
def link_bytes(count: int, size: int, itemsize: int) -> dict[str, int]:
    """Bytes the busiest link carries for one all-reduce of ``count`` items of ``itemsize``
    bytes over ``size`` ranks, per schedule (``"ring"`` and, from three ranks, ``"chain"``).

    Example:
        >>> link_bytes(1000, 4, 4)  # float32: 9 and 12 bytes per element
        {'ring': 9000, 'chain': 12000}
    """
    bounds = chunk_bounds(count, size)
    length = [b - a for a, b in zip(bounds, bounds[1:])]
    busiest = 0
    for rank in range(size):
        sent = 0
        for chunk in range(size):
            if chunk != (rank + 1) % size:  # reduce-scatter: every chunk but the owned one
                partial, rows = message_parts(chunk, rank, size)
                width = 0 if partial is None else itemsize if partial == "raw" else _WIDE_BYTES
                sent += length[chunk] * (width + len(rows) * itemsize)
            if chunk != (rank + 2) % size:  # all-gather: every finished chunk but one
                sent += length[chunk] * itemsize
        busiest = max(busiest, sent)
    plans = {"ring": busiest}
    if size > 2:  # link 0 -> 1: x0 and the result; 1 .. n-3: partial and result; n-2: partial
        plans["chain"] = count * max(2 * itemsize, _WIDE_BYTES + (itemsize if size > 3 else 0))
    return plans


def plan(count: int, size: int, itemsize: int) -> str:
    """The schedule with the fewer bytes on the busiest link (the ring on a tie: it finishes
    its chunks while they arrive). Depends only on its arguments, so every rank agrees.

    Example:
        >>> plan(10**6, 4, 4), plan(10**6, 4, 8), plan(10**6, 8, 4)
        ('ring', 'chain', 'chain')
    """
    plans = link_bytes(count, size, itemsize)
    return min(plans, key=lambda name: (plans[name], name != "ring"))


class Fold:
    """Reduces ``rows`` (in rank order) into ``out`` block by block as the received ones
    arrive: :func:`reduce_rows` itself, one pass over a cache-sized block of every row at a
    time, so the bits are the canonical ones.

    Args:
        rows: ``(array, frame)`` in rank order; ``frame`` is the index of the pump's incoming
            frame the array is being received into, or None for a local array.
        out: the destination (may be a received row: each block is read before it is written).
        divisor: what the sum is divided by (1 for a sum or a partial sum to pass on).

    ``work(received)`` is the pump's work callback; ``ready_bytes()`` how much of ``out`` is
    final (an outgoing frame sent while it is being computed).
    """

    __slots__ = ("rows", "incoming", "out", "divisor", "done", "scratch")

    def __init__(self, rows, out: np.ndarray, divisor: int):
        self.rows = [array for array, _ in rows]
        self.incoming = [(frame, array.itemsize) for array, frame in rows if frame is not None]
        self.out, self.divisor, self.done = out, divisor, 0
        self.scratch = np.empty(2 * min(REDUCE_BLOCK, max(out.size, 1)),
                                accumulator_dtype(out.dtype))

    def work(self, received) -> bool:
        arrived = min((received[frame] // itemsize for frame, itemsize in self.incoming),
                      default=self.out.size)
        arrived = min(arrived, self.out.size)
        if arrived <= self.done or (arrived < self.out.size and arrived - self.done < _BLOCK):
            return False  # wait for a whole block (or the end)
        start, self.done = self.done, arrived
        reduce_rows([row[start:arrived] for row in self.rows], self.out[start:arrived],
                    self.divisor, self.scratch)
        return True

    def ready_bytes(self) -> int:
        return self.done * self.out.itemsize


class _Relay:
    """Forwards an incoming frame as it arrives (bytes confirmed so far), and runs ``fold``."""

    __slots__ = ("frame", "fold", "received")

    def __init__(self, frame: int, fold: Fold | None = None):
        self.frame, self.fold, self.received = frame, fold, None

    def work(self, received) -> bool:
        self.received = received
        return self.fold.work(received) if self.fold is not None else False

    def ready_bytes(self) -> int:
        return 0 if self.received is None else self.received[self.frame]


def all_reduce(ring, flat: np.ndarray, mean: bool, out: np.ndarray) -> np.ndarray:
    """Sum (or average) ``flat`` over the ring's ranks into ``out``, in rank order.

    Args:
        ring: the rank's :class:`~everyo_dist.backends.tcp.ring.Ring` (its ``call`` set).
        flat: this rank's 1-D contribution.
        mean: divide by the number of ranks.
        out: the 1-D destination, same dtype and length, not overlapping ``flat``.
    Returns:
        ``out``, bit-identical on every rank and to :func:`reduce_rows` of all the rows.

    Example:
        >>> # inside a tcp group: all_reduce(ring, np.float32([1, 2]), True, out)
    """
    length = max(PIECE_BYTES // flat.dtype.itemsize, 1)
    for start in range(0, flat.size, length):  # a single piece up to PIECE_BYTES
        piece, result = flat[start:start + length], out[start:start + length]
        if plan(piece.size, ring.size, flat.dtype.itemsize) == "chain":
            _chain(ring, piece, mean, result)
        else:
            _ring(ring, piece, mean, result)
    return out


def _ring(ring, flat: np.ndarray, mean: bool, out: np.ndarray) -> np.ndarray:
    """The ring schedule (module docstring): ``size - 1`` reduce-scatter steps, the last one
    overlapped with the first all-gather step, then the rest of the all-gather."""
    size, rank = ring.size, ring.rank
    bounds = chunk_bounds(flat.size, size)
    widest = max(b - a for a, b in zip(bounds, bounds[1:]))
    wide = accumulator_dtype(flat.dtype)

    def chunk(array, index):
        return array[bounds[index]:bounds[index + 1]]

    held_partial, held_rows = None, []  # what the last step received, to pass on in this one
    for step in range(size - 1):
        send_chunk, recv_chunk = (rank - step) % size, (rank - step - 1) % size
        partial, _ = message_parts(send_chunk, rank, size)  # its rows: held_rows (+ own)
        own = chunk(flat, send_chunk)
        # raw rows first, the partial sum last: the owner reduces everything in one pass while
        # the last frame arrives
        outgoing = held_rows + ([own] if partial is None else
                                [own if partial == "raw" else held_partial])
        partial, rows = message_parts(recv_chunk, ring.prev, size)
        length, parity = bounds[recv_chunk + 1] - bounds[recv_chunk], step % 2
        received_rows = ring.scratch(f"rows{parity}", flat.dtype, len(rows) * widest)
        received_rows = [received_rows[i * widest:i * widest + length] for i in range(len(rows))]
        received_partial = None if partial is None else \
            ring.scratch(f"{partial}{parity}", flat.dtype if partial == "raw" else wide, length)
        incoming = received_rows + ([] if partial is None else [received_partial])
        sends = [(step * size + i, array, None) for i, array in enumerate(outgoing)]
        recvs = [(step * size + i, array) for i, array in enumerate(incoming)]
        own = chunk(flat, recv_chunk)
        if step < size - 2:
            ring.pump(sends, recvs)
            if partial is not None:  # add this rank's row: x0 + ... + x_rank, in float64
                held_partial = received_partial if partial == "wide" else \
                    ring.scratch(f"wide{parity}", wide, length)
                reduce_rows([received_partial, own], held_partial)
            held_rows = received_rows
            continue
        # Last step: the owned chunk is reduced in rank order (partial sum, own row, raw rows)
        # block by block while its last part arrives, and sent on (the first all-gather step)
        # as it is finished.
        ordered = ([] if partial is None else [(received_partial, len(rows))]) + \
            [(own, None)] + [(row, i) for i, row in enumerate(received_rows)]
        fold = Fold(ordered, chunk(out, recv_chunk), size if mean else 1)
        gather = (size - 1) * size
        ring.pump(sends + [(gather, chunk(out, recv_chunk), fold.ready_bytes)],
                  recvs + [(gather, chunk(out, (recv_chunk - 1) % size))], fold.work)
    owned = (rank + 1) % size
    for step in range(1, size - 1):
        ring.transfer((size - 1) * size + step, chunk(out, (owned - step) % size),
                      chunk(out, (owned - step - 1) % size))
    return out


def _chain(ring, flat: np.ndarray, mean: bool, out: np.ndarray) -> np.ndarray:
    """The chain schedule (module docstring): frame 0 is the partial sum streaming
    ``0 -> n-1``, frame 1 the result streaming ``n-1 -> 0 -> ... -> n-2``."""
    size, rank = ring.size, ring.rank
    wide = accumulator_dtype(flat.dtype)
    if rank == 0:
        relay = _Relay(0)
        ring.pump([(0, flat, None), (1, out, relay.ready_bytes)], [(1, out)], relay.work)
        return out
    partial = ring.scratch("chain", flat.dtype if rank == 1 else wide, flat.size)
    if rank == size - 1:
        fold = Fold([(partial, 0), (flat, None)], out, size if mean else 1)
        ring.pump([(1, out, fold.ready_bytes)], [(0, partial)], fold.work)
        return out
    acc = partial if rank > 1 else ring.scratch("wide", wide, flat.size)
    relay = _Relay(1, Fold([(partial, 0), (flat, None)], acc, 1))
    forward = [(1, out, relay.ready_bytes)] if rank < size - 2 else []
    ring.pump([(0, acc, relay.fold.ready_bytes), *forward], [(0, partial), (1, out)],
              relay.work)
    return out
