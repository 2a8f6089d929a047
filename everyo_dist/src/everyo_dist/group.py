"""``ProcessGroup``: what a worker uses to talk to its peers, whatever the backend.

The public methods (``barrier``, ``all_reduce_sum``, ``all_reduce_mean``, ``broadcast``,
``all_gather``) live here once, with the checks every backend shares: input validation, the
fingerprint exchange that catches ranks calling different collectives, the per-collective
deadline, and "a group that failed once stays failed". A backend supplies the transport that
moves the bytes (:mod:`everyo_dist.contract`).
"""

from __future__ import annotations

import time

import numpy as np

from everyo_dist.contract import Collective, Transport
from everyo_dist.errors import DistributedError
from everyo_dist.fingerprint import CollectiveOp, Fingerprint, check_fingerprints
from everyo_dist.recycling import ResultBuffers

DEFAULT_TIMEOUT = 300.0
"""Seconds a collective waits for its peers by default: generous, but never forever."""
MAX_TIMEOUT = 365 * 24 * 3600.0
"""The longest timeout accepted (a year): socket and futex waits cannot express infinity."""

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

    Backends create it around their transport (see :mod:`everyo_dist.contract`); use it as a
    context manager to close it.

    Args:
        rank: this process's rank.
        world_size: number of processes.
        transport: the backend's transport, already connected to its peers.
        timeout: seconds a collective may wait (default ``DEFAULT_TIMEOUT``).
        ranks_on_this_machine: how many of the group's ranks share this machine (for the BLAS
            oversubscription warning); 1 when unknown.
    """

    def __init__(self, rank: int, world_size: int, transport: Transport,
                 timeout: float | None = None, ranks_on_this_machine: int = 1):
        self.rank, self.world_size, self.timeout = check_membership(rank, world_size, timeout)
        self.transport = transport
        self.backend = transport.name
        self.ranks_on_this_machine = ranks_on_this_machine
        self._seq = 0
        self._results = ResultBuffers()
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
        self._run(Fingerprint.of(self._seq, CollectiveOp.BARRIER), lambda call: None)

    def all_reduce_sum(self, array, out: np.ndarray | None = None) -> np.ndarray:
        """Element-wise sum over ranks, accumulated in float64, returned in the input's dtype.

        Args:
            array: a NumPy array, ``eo.Tensor`` (its ``.data``) or number; floating or integer.
                Integers are summed exactly (in int64), wrapping like NumPy's own sums
                when the result overflows the dtype.
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
        result = self._run(fingerprint, lambda call: self.transport.broadcast(call, flat, int(src))
                           if flat.size else flat.copy())
        return result.reshape(shape)

    def all_gather(self, array) -> np.ndarray:
        """Every rank's array, stacked on a new leading axis.

        Returns:
            An array of shape ``(world_size, *array.shape)``; row ``r`` came from rank ``r``.
        """
        flat, shape = self._flatten(array, CollectiveOp.ALL_GATHER)
        fingerprint = Fingerprint.of(self._seq, CollectiveOp.ALL_GATHER, flat.reshape(shape))
        result = self._run(fingerprint, lambda call: self.transport.all_gather(call, flat)
                           if flat.size else np.empty((self.world_size, 0), flat.dtype))
        return result.reshape((self.world_size, *shape))

    def mark_failed(self, error: BaseException) -> None:
        """Refuse every later collective of this rank, naming ``error``, as after a failed
        collective: something that ran between collectives (a communication hook) failed on
        this rank, which may have skipped collectives its peers are waiting in, so its next
        ones (same op, same shape) would pair with theirs and mix other steps' data."""
        if self._failure is None:
            self._failure = error

    def close(self) -> None:
        """Release the group's resources. Idempotent; collectives afterwards raise."""
        if not self._closed:
            self._closed = True
            self.transport.close()

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
            self._run(fingerprint, lambda call: None)
            return np.empty(shape, flat.dtype) if out is None else out
        result = self._results.like(flat) if out is None else out.reshape(-1)
        self._run(fingerprint, lambda call: self.transport.all_reduce(call, flat, mean, result))
        return result.reshape(shape) if out is None else out

    def _flatten(self, array, op: CollectiveOp) -> tuple[np.ndarray, tuple[int, ...]]:
        """The input as a 1-D C-contiguous array, plus its shape."""
        data = array
        if not isinstance(data, np.ndarray) and isinstance(getattr(data, "data", None),
                                                           np.ndarray):
            data = data.data  # an eo.Tensor
        if not isinstance(data, np.ndarray):
            data = np.asarray(data)
            if data.dtype == np.float64 and not isinstance(array, np.generic):
                # Python floats follow EveryO's float32 default; beyond its range they become
                # ±inf (IEEE) without NumPy's warning, an exception under -W error
                with np.errstate(over="ignore"):
                    data = data.astype(np.float32)
        if not data.dtype.isnative:  # the wire and the dtype codes are native-order only
            data = data.astype(data.dtype.newbyteorder("="))
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
        call = Collective(self.rank, self.world_size, self.timeout,
                          time.monotonic() + self.timeout, fingerprint)
        self._seq += 1
        try:
            packed = self.transport.exchange_fingerprints(call, fingerprint.pack())
            check_fingerprints(fingerprint, self.rank, packed)
            return primitive(call)
        except BaseException as exc:
            self._failure = exc
            raise


def check_membership(rank, world_size, timeout) -> tuple[int, int, float]:
    """Validated ``(rank, world_size, timeout)``; ``timeout=None`` is ``DEFAULT_TIMEOUT``.

    Example:
        >>> check_membership(1, 2, None)
        (1, 2, 300.0)
    """
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) \
            or world_size < 1:
        raise DistributedError(f"world_size must be a positive integer, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
            or not 0 <= rank < world_size:
        raise DistributedError(f"rank must be an integer in [0, {world_size}), got {rank!r}")
    return int(rank), int(world_size), check_timeout(timeout)


def check_timeout(timeout) -> float:
    """A validated timeout in seconds (``None`` is ``DEFAULT_TIMEOUT``): positive, at most a
    year; NaN and infinity are refused.

    Example:
        >>> check_timeout("2.5")
        2.5
    """
    try:
        timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    except (TypeError, ValueError):
        raise DistributedError(f"timeout must be a number of seconds, got {timeout!r}") from None
    if not 0 < timeout <= MAX_TIMEOUT:  # (False for NaN)
        raise DistributedError(f"timeout must be a positive number of seconds, at most "
                               f"{MAX_TIMEOUT:g} (a year), got {timeout}")
    return timeout


class SingleRankTransport:
    """The transport of a group of one: every collective returns the rank's own data."""

    def __init__(self, name: str):
        self.name = name

    def exchange_fingerprints(self, call: Collective, packed: bytes) -> list[bytes]:
        return [packed]

    def all_reduce(self, call: Collective, flat: np.ndarray, mean: bool,
                   out: np.ndarray) -> None:
        np.copyto(out, flat, casting="unsafe")

    def broadcast(self, call: Collective, flat: np.ndarray, src: int) -> np.ndarray:
        return flat.copy()

    def all_gather(self, call: Collective, flat: np.ndarray) -> np.ndarray:
        return flat.reshape(1, -1).copy()

    def close(self) -> None:
        """Nothing to release."""
