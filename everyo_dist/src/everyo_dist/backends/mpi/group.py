"""The ``mpi`` backend: a ``ProcessGroup`` on MPI's ``COMM_WORLD`` through mpi4py.

Run under ``mpiexec -n N python train.py`` and call ``eo.distributed.init(backend="mpi")``;
rank and size come from MPI. ``mpi4py.MPI`` is imported only inside :func:`create_mpi_group`,
because importing it initialises MPI, which must never happen to someone who did not ask for it.

Reductions do not use ``MPI_Allreduce``: MPI may add the ranks' contributions in a different
order on different ranks (recursive doubling), which breaks bit-identical results. Instead each
rank receives one chunk from everybody (``Alltoallv``), adds the rows in rank order in float64
(the same arithmetic as every EveryO backend), and the finished chunks are shared with
``Allgatherv``. The fingerprint exchange that opens every collective is non-blocking and polled
against the group's deadline, so a rank that never arrives is a timeout, not a hang; once the
fingerprints match, the data moves with MPI's blocking algorithms. An uncaught exception on
any rank calls ``MPI_Abort``, so the job ends instead of leaving the others waiting.
"""

from __future__ import annotations

import sys
import time
import traceback

import numpy as np

from everyo_dist.contract import Collective
from everyo_dist.errors import CollectiveTimeoutError, DistributedError
from everyo_dist.fingerprint import FINGERPRINT_SIZE
from everyo_dist.group import ProcessGroup
from everyo_dist.reduction import reduce_rows

_SPIN_SECONDS = 1.0  # busy-poll this long before sleeping between polls
_hook_installed = False


def create_mpi_group(timeout: float | None = None, abort_on_exception: bool = True) -> ProcessGroup:
    """The ``"mpi"`` backend factory behind ``eo.distributed.init(backend="mpi")``.

    Args:
        timeout: seconds a collective may wait (``EVERYO_TIMEOUT``); then it raises.
        abort_on_exception: install a ``sys.excepthook`` that prints the traceback and calls
            ``MPI_Abort``, so one failing rank ends the whole job.
    Returns:
        A :class:`~everyo_dist.group.ProcessGroup` over ``MPI.COMM_WORLD``.
    """
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistributedError("the mpi backend needs mpi4py and an MPI library: "
                               "pip install 'everyo-dist[mpi]'") from None
    if abort_on_exception:
        _install_abort_hook(MPI)
    comm = MPI.COMM_WORLD
    return ProcessGroup(comm.Get_rank(), comm.Get_size(), MPITransport(MPI, comm), timeout)


def _install_abort_hook(MPI) -> None:
    global _hook_installed
    if _hook_installed:
        return
    previous = sys.excepthook

    def abort_job(kind, value, tb):
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"[rank {rank}] uncaught exception, aborting the MPI job:\n"
                         + "".join(traceback.format_exception(kind, value, tb)))
        sys.stderr.flush()
        time.sleep(0.2)  # NOTE: let mpiexec forward the traceback before Abort tears down I/O
        try:
            MPI.COMM_WORLD.Abort(1)
        finally:
            previous(kind, value, tb)

    sys.excepthook = abort_job
    _hook_installed = True


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


class MPITransport:
    """Moves collectives over an mpi4py communicator (``COMM_WORLD`` by default)."""

    name = "mpi"

    def __init__(self, MPI, comm):
        self._MPI, self._comm = MPI, comm
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()

    def _wait(self, call: Collective, request, what: str) -> None:
        """Poll ``request`` until done or the collective's deadline passes.

        MPICH moves a non-blocking collective forward only inside MPI calls, so this polls
        without sleeping (as MPI's own blocking calls do) and only backs off once a peer is
        clearly late.
        """
        patient_until = time.monotonic() + _SPIN_SECONDS
        while not request.Test():
            now = time.monotonic()
            if now > patient_until:
                if now > call.deadline:
                    raise CollectiveTimeoutError(
                        f"{call.describe()} timed out after {call.timeout:g}s on rank {self.rank} "
                        f"(in MPI {what}); MPI does not report which ranks did not arrive. "
                        f"Every rank must call the same collectives in the same order.")
                time.sleep(1e-3)

    def exchange_fingerprints(self, call: Collective, packed: bytes) -> list[bytes]:
        mine = np.frombuffer(packed, dtype=np.uint8)
        gathered = np.empty((self.world_size, FINGERPRINT_SIZE), dtype=np.uint8)
        self._wait(call, self._comm.Iallgather([mine, self._MPI.BYTE], [gathered, self._MPI.BYTE]),
                   "Iallgather of fingerprints")
        return [row.tobytes() for row in gathered]

    def all_reduce(self, call: Collective, flat: np.ndarray, mean: bool,
                   out: np.ndarray) -> None:
        size, rank, item = self.world_size, self.rank, flat.dtype.itemsize
        if size == 1:
            reduce_rows([flat], out, 1)
            return
        base, extra = divmod(flat.size, size)
        counts = np.array([base + (r < extra) for r in range(size)], dtype=np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        mine = int(counts[rank])
        rows = np.empty((size, mine), dtype=flat.dtype)  # my chunk, as sent by every rank
        BYTE = self._MPI.BYTE
        # The fingerprints matched, so every rank is inside this same collective: the data
        # moves with MPI's (faster) blocking algorithms.
        self._comm.Alltoallv(
            [_as_bytes(flat), ((counts * item).tolist(), (displs * item).tolist()), BYTE],
            [_as_bytes(rows), ([mine * item] * size, [r * mine * item for r in range(size)]),
             BYTE])
        start = int(displs[rank])
        reduce_rows(rows, out[start:start + mine], size if mean else 1)
        self._comm.Allgatherv(self._MPI.IN_PLACE,
                              [_as_bytes(out), ((counts * item).tolist(),
                                                (displs * item).tolist()), BYTE])

    def broadcast(self, call: Collective, flat: np.ndarray, src: int) -> np.ndarray:
        out = flat.copy() if self.rank == src else np.empty_like(flat)
        self._comm.Bcast([_as_bytes(out), self._MPI.BYTE], root=src)
        return out

    def all_gather(self, call: Collective, flat: np.ndarray) -> np.ndarray:
        out = np.empty((self.world_size, flat.size), dtype=flat.dtype)
        self._comm.Allgather([_as_bytes(flat), self._MPI.BYTE], [_as_bytes(out), self._MPI.BYTE])
        return out

    def close(self) -> None:
        """``COMM_WORLD`` lives until the interpreter exits: nothing to release."""
