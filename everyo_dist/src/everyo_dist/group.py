"""``ProcessGroup``: what a worker uses to talk to its peers, and what every backend subclasses.

The public methods (``barrier``, ``all_reduce_sum``, ``all_reduce_mean``, ``broadcast``,
``all_gather``) live here once, with the checks every backend shares: input validation, the
fingerprint exchange that catches ranks calling different collectives, the per-collective
deadline, and "a group that failed once stays failed". A backend implements only the few
primitives below, on flat contiguous non-empty arrays whose shape and dtype all ranks have
already agreed on (the fingerprints matched):

``_exchange_fingerprints(packed) -> list[bytes]``
    Give this rank's ``FINGERPRINT_SIZE`` bytes to every peer and return every rank's, indexed
    by rank. It must not return before every rank has contributed, so it is also the barrier.
``_all_reduce(flat, mean) -> ndarray``
    Sum ``flat`` over ranks *in float64*, divide by ``world_size`` when ``mean``, and return the
    result cast to ``flat.dtype``; bit-identical on every rank.
``_all_reduce_into(flat, mean, out)`` (optional)
    The same, written into the flat array ``out``; the default copies ``_all_reduce``'s result.
    A backend overrides it to save that copy (``out=`` uses it). ``out`` may be ``flat``
    itself, so a backend must not let peers read this rank's ``flat`` once this rank returns.
``_broadcast(flat, src) -> ndarray``
    Return rank ``src``'s ``flat`` on every rank (others pass an array of the right size).
``_all_gather(flat) -> ndarray``
    Return a ``(world_size, flat.size)`` array whose row ``r`` is rank ``r``'s ``flat``.
``_close()``
    Release sockets, shared memory, ...; called once.

While a collective runs, ``self._current`` is its :class:`Fingerprint` and
``self._deadline`` its ``time.monotonic()`` deadline; :meth:`_timeout_error` and
:meth:`_peer_lost_error` build the errors backends raise, with the collective named.
"""

from __future__ import annotations

import time

import numpy as np

from everyo_dist.errors import (
    CollectiveTimeoutError,
    DistributedError,
    PeerLostError,
)
from everyo_dist.fingerprint import CollectiveOp, Fingerprint, check_fingerprints

DEFAULT_TIMEOUT = 300.0
"""Seconds a collective waits for its peers by default: generous, but never forever."""

_REDUCIBLE_KINDS = "fiu"  # float, signed and unsigned integer


class ProcessGroup:
    """The ranks of one data-parallel job and the collectives between them.

    Every rank must call the same collectives in the same order with the same shapes and
    dtypes; a violation raises ``CollectiveMismatchError`` on every rank. Each collective waits
    at most ``timeout`` seconds, then raises ``CollectiveTimeoutError`` naming the ranks that
    did not arrive. After any failure the group refuses further collectives.

    Attributes:
        rank: this process's index, ``0 <= rank < world_size``.
        world_size: number of processes in the group.
        is_main: ``rank == 0``; the rank that logs and saves.
        backend: the backend's registered name (``"shm"``, ``"tcp"``, ``"mpi"``, ...).
        timeout: seconds a collective may wait for its peers.

    Subclasses call ``super().__init__(rank, world_size, timeout)`` and implement the
    primitives described in this module's docstring. Use as a context manager to close it.
    """

    backend = "abstract"

    def __init__(self, rank: int, world_size: int, timeout: float | None = None):
        if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) \
                or world_size < 1:
            raise DistributedError(f"world_size must be a positive integer, got {world_size!r}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < world_size:
            raise DistributedError(f"rank must be an integer in [0, {world_size}), got {rank!r}")
        timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        if not timeout > 0:
            raise DistributedError(f"timeout must be a positive number of seconds, got {timeout}")
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.timeout = timeout
        self._seq = 0
        self._current: Fingerprint | None = None
        self._deadline = float("inf")
        self._failure: BaseException | None = None
        self._closed = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("failed" if self._failure else "open")
        return (f"<{type(self).__name__} backend={self.backend!r} rank={self.rank} "
                f"world_size={self.world_size} {state}>")

    # -- public collectives ----------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every rank has called ``barrier()``."""
        self._run(Fingerprint.of(self._seq, CollectiveOp.BARRIER), lambda: None)

    def all_reduce_sum(self, array, out: np.ndarray | None = None) -> np.ndarray:
        """Element-wise sum over ranks, accumulated in float64, returned in the input's dtype.

        Args:
            array: a NumPy array, ``eo.Tensor`` (its ``.data``) or number; floating or integer.
                Integers are summed in float64, exactly while the sums stay below 2**53.
            out: optional C-contiguous array of the same shape and dtype to write the result
                into (may be ``array`` itself: an in-place reduction).
        Returns:
            A new array (or ``out``) of the input's shape and dtype, bit-identical on every
            rank.
        """
        return self._reduce(array, CollectiveOp.ALL_REDUCE_SUM, out)

    def all_reduce_mean(self, array, out: np.ndarray | None = None) -> np.ndarray:
        """Element-wise mean over ranks (float64 sum divided by ``world_size``).

        Args:
            array: a floating NumPy array, ``eo.Tensor`` or number.
            out: as for :meth:`all_reduce_sum`.
        Returns:
            A new array (or ``out``) of the input's shape and dtype, bit-identical on every
            rank.

        Example:
            >>> import everyo.distributed as dist
            >>> with dist.init(backend="shm", rank=0, world_size=1) as group:
            ...     group.all_reduce_mean(np.float32([1, 2]))
            array([1., 2.], dtype=float32)
        """
        return self._reduce(array, CollectiveOp.ALL_REDUCE_MEAN, out)

    def broadcast(self, array, src: int = 0) -> np.ndarray:
        """Rank ``src``'s array, on every rank (the others pass an array of the same shape and
        dtype, whose values are ignored).

        Returns:
            A new array (a copy on ``src`` too).
        """
        if isinstance(src, bool) or not isinstance(src, (int, np.integer)) \
                or not 0 <= src < self.world_size:
            raise DistributedError(f"broadcast src must be a rank in [0, {self.world_size}), "
                                   f"got {src!r}")
        flat, shape = self._flatten(array, CollectiveOp.BROADCAST)
        fingerprint = Fingerprint.of(self._seq, CollectiveOp.BROADCAST, flat.reshape(shape),
                                     root=int(src))
        result = self._run(fingerprint, lambda: self._broadcast(flat, int(src))
                           if flat.size else flat.copy())
        return result.reshape(shape)

    def all_gather(self, array) -> np.ndarray:
        """Every rank's array, stacked on a new leading axis.

        Returns:
            An array of shape ``(world_size, *array.shape)``; row ``r`` came from rank ``r``.
        """
        flat, shape = self._flatten(array, CollectiveOp.ALL_GATHER)
        fingerprint = Fingerprint.of(self._seq, CollectiveOp.ALL_GATHER, flat.reshape(shape))
        result = self._run(fingerprint, lambda: self._all_gather(flat) if flat.size
                           else np.empty((self.world_size, 0), flat.dtype))
        return result.reshape((self.world_size, *shape))

    def close(self) -> None:
        """Release the group's resources. Idempotent; collectives afterwards raise."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- shared machinery ------------------------------------------------------------------------
    def _reduce(self, array, op: CollectiveOp, out: np.ndarray | None) -> np.ndarray:
        flat, shape = self._flatten(array, op)
        if out is not None and not (isinstance(out, np.ndarray) and out.shape == shape
                                    and out.dtype == flat.dtype and out.flags.c_contiguous
                                    and out.flags.writeable):
            raise DistributedError(
                f"{op.label}: out must be a writable C-contiguous {flat.dtype} array of shape "
                f"{shape}, got {getattr(out, 'dtype', type(out).__name__)} "
                f"{getattr(out, 'shape', '')}")
        if flat.dtype.kind not in _REDUCIBLE_KINDS:
            raise DistributedError(f"{op.label} needs a numeric array, got dtype {flat.dtype}")
        if op == CollectiveOp.ALL_REDUCE_MEAN and flat.dtype.kind != "f":
            raise DistributedError(f"all_reduce_mean of an integer array ({flat.dtype}) would "
                                   f"truncate; cast it to a floating dtype first")
        fingerprint = Fingerprint.of(self._seq, op, flat.reshape(shape))
        mean = op == CollectiveOp.ALL_REDUCE_MEAN
        if flat.size == 0:  # agreed on by the fingerprints; nothing to move
            self._run(fingerprint, lambda: None)
            return np.empty(shape, flat.dtype) if out is None else out
        if out is None:
            result = self._run(fingerprint, lambda: self._all_reduce(flat, mean))
            return result.reshape(shape)
        self._run(fingerprint, lambda: self._all_reduce_into(flat, mean, out.reshape(-1)))
        return out

    def _flatten(self, array, op: CollectiveOp) -> tuple[np.ndarray, tuple[int, ...]]:
        """The input as a 1-D C-contiguous array, plus its shape."""
        data = array
        if not isinstance(data, np.ndarray) and isinstance(getattr(data, "data", None),
                                                           np.ndarray):
            data = data.data  # an eo.Tensor
        if not isinstance(data, np.ndarray):
            data = np.asarray(data)
            if data.dtype == np.float64 and not isinstance(array, np.generic):
                data = data.astype(np.float32)  # Python floats follow EveryO's float32 default
        return np.ascontiguousarray(data).reshape(-1), data.shape

    def _run(self, fingerprint: Fingerprint, primitive):
        """Exchange and check fingerprints, then run the backend primitive, under a deadline."""
        if self._closed:
            raise DistributedError(f"{fingerprint.describe()} on a closed process group")
        if self._failure is not None:
            raise DistributedError(
                f"{fingerprint.describe()} refused: this process group failed earlier "
                f"({type(self._failure).__name__}: {self._failure}); create a new group"
            ) from self._failure
        self._current = fingerprint
        self._deadline = time.monotonic() + self.timeout
        self._seq += 1
        try:
            packed = self._exchange_fingerprints(fingerprint.pack())
            check_fingerprints(fingerprint, self.rank, packed)
            return primitive()
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            self._current = None

    def _remaining(self) -> float:
        """Seconds left before the running collective's deadline (may be negative)."""
        return self._deadline - time.monotonic()

    def _timeout_error(self, missing_ranks, waited_for: str = "") -> CollectiveTimeoutError:
        """The error for a collective whose peers ``missing_ranks`` did not arrive in time."""
        current = self._current.describe() if self._current else "start-up"
        missing = sorted(int(r) for r in missing_ranks)
        detail = f" ({waited_for})" if waited_for else ""
        return CollectiveTimeoutError(
            f"{current} timed out after {self.timeout:g}s on rank {self.rank}{detail}: "
            f"rank{'s' if len(missing) != 1 else ''} {', '.join(map(str, missing))} did not "
            f"arrive. Every rank must call the same collectives in the same order.",
            missing,
        )

    def _peer_lost_error(self, rank: int, detail: str = "") -> PeerLostError:
        """The error for a peer that vanished (died, disconnected) during a collective."""
        current = self._current.describe() if self._current else "collective"
        extra = f": {detail}" if detail else ""
        return PeerLostError(f"{current}: rank {rank} was lost{extra}", rank)

    # -- backend primitives (see the module docstring) -------------------------------------------
    def _exchange_fingerprints(self, packed: bytes) -> list[bytes]:
        raise NotImplementedError(f"{type(self).__name__} must implement _exchange_fingerprints")

    def _all_reduce(self, flat: np.ndarray, mean: bool) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must implement _all_reduce")

    def _all_reduce_into(self, flat: np.ndarray, mean: bool, out: np.ndarray) -> None:
        np.copyto(out, self._all_reduce(flat, mean))

    def _broadcast(self, flat: np.ndarray, src: int) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must implement _broadcast")

    def _all_gather(self, flat: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must implement _all_gather")

    def _close(self) -> None:
        """Release backend resources; the default has none."""


def reduce_rows_f64(rows, mean: bool, dtype, out: np.ndarray | None = None,
                    scratch: np.ndarray | None = None) -> np.ndarray:
    """The reference reduction every backend must match: add ``rows`` in rank order in
    float64, divide by their count when ``mean``, cast to ``dtype``.

    Args:
        rows: a sequence of equally long 1-D arrays, one per rank, in rank order.
        mean: divide the sum by ``len(rows)``.
        dtype: the result's dtype.
        out: optional destination of that dtype and length.
        scratch: optional float64 work array at least twice as long as a row (saves
            allocations when called block by block).
    Returns:
        The reduced 1-D array (``out`` when given).

    Example:
        >>> import numpy as np
        >>> reduce_rows_f64([np.float32([1, 2]), np.float32([2, 4])], True, "float32")
        array([1.5, 3. ], dtype=float32)
    """
    length = len(rows[0])
    if scratch is None or len(scratch) < 2 * length:
        scratch = np.empty(2 * length, np.float64)
    acc, widened = scratch[:length], scratch[length:2 * length]
    np.copyto(acc, rows[0], casting="unsafe")
    for row in rows[1:]:
        if row.dtype != np.float64:  # widening first, then a plain float64 add, is faster
            np.copyto(widened, row, casting="unsafe")  # than NumPy's mixed-type add
            row = widened
        np.add(acc, row, out=acc)
    count = len(rows)
    if mean and count & (count - 1) == 0:  # x * (1/2**k) rounds exactly like x / 2**k
        np.multiply(acc, 1.0 / count, out=acc)
    elif mean:
        np.divide(acc, count, out=acc)
    if out is None:
        return acc.astype(dtype)
    np.copyto(out, acc, casting="unsafe")
    return out
