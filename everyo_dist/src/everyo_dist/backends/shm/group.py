"""The ``shm`` backend: the ranks of one machine meet in POSIX shared memory.

Two segments per group:

* the *control* segment: one 320-byte block per rank holding its arrival counter, its pid and
  two fingerprint slots (alternating, so a fast rank writing the next fingerprint never
  overwrites one a slow peer is still reading);
* the *data* segment: one slot per rank plus a result slot, each ``capacity`` bytes. It is
  created by rank 0 and replaced by a larger one when a collective needs more room (the ranks
  agree on the size because their fingerprints matched).

Synchronisation is a counter per rank: arriving at a barrier stores the next epoch in this
rank's counter (one writer per word, no locks, so a dead rank can never leave a lock held), and
waiting polls the peers' counters — spinning briefly (``SPIN_SECONDS``), then sleeping on a futex
(``everyo_dist.backends.shm.futex``) that the arriving rank wakes — until they reach the epoch, the deadline
passes, or a peer's process is found dead. x86-64 keeps stores in order, so data written
before the counter is visible to a peer that sees the counter.

``all_reduce`` is reduce-scatter style: every rank writes its vector into its slot (all but its
own chunk, which only it reads, from its own array); after a barrier each rank reduces its own
chunk of all ranks' vectors (in float64, rank order: the ``reduce_rows`` kernel) into the
result slot; after a second barrier every rank copies the whole result. Each element is reduced
exactly once, so all ranks receive the same bits. Vectors under ``SMALL_BYTES`` skip the second
barrier: every rank reduces the whole vector itself, with the same arithmetic in the same rank
order, which gives the same bits too. The next collective's fingerprint exchange is
the barrier that keeps anyone from overwriting a slot a peer is still reading.
"""

from __future__ import annotations

import ctypes
import os
import platform
import time

import numpy as np

from everyo_dist.backends.shm.futex import futex_available, futex_wait, futex_wake, low32
from everyo_dist.backends.shm.segments import (
    Segment,
    new_job_id,
    parse_name,
    process_alive,
    segment_name,
    sweep_stale_segments,
    unlink,
)
from everyo_dist.contract import Collective
from everyo_dist.cores import available_workers
from everyo_dist.errors import DistributedError
from everyo_dist.fingerprint import FINGERPRINT_SIZE
from everyo_dist.group import ProcessGroup, check_membership
from everyo_dist.reduction import REDUCE_BLOCK, reduce_rows

BLOCK = 320  # bytes of control data per rank (a whole number of cache lines)
_WORDS = BLOCK // 8
_EPOCH, _PID = 0, 1  # int64 word indices inside a rank's block
_FINGERPRINT_OFFSET = 64  # two FINGERPRINT_SIZE slots follow
assert _FINGERPRINT_OFFSET + 2 * FINGERPRINT_SIZE <= BLOCK and BLOCK % 64 == 0, \
    "the control block must hold two fingerprint slots"
MIN_CAPACITY = 1 << 16
SMALL_BYTES = 1 << 18  # below this, each rank reduces the whole vector (saves a barrier)
ALIGN = 64  # result chunks of different ranks never share a cache line

SPIN_SECONDS = 2e-4  # when every rank has a core of its own
SHARED_CORE_SPIN_SECONDS = 5e-5  # when ranks outnumber cores: spinning steals a peer's core
MAX_SLEEP = 1e-3  # polling fallback where futexes are unavailable
LIVENESS_INTERVAL = 0.2


def create_shm_group(rank: int, world_size: int, segment: str | None = None,
                     timeout: float | None = None) -> ProcessGroup:
    """Join (rank 0: create) the shared-memory group whose control segment is ``segment``.

    Args:
        rank: this process's rank.
        world_size: number of processes (all on this machine).
        segment: name of the control segment, shared by all ranks (``spawn`` passes it; with
            ``init`` it comes from ``EVERYO_SHM_SEGMENT``). Optional when ``world_size`` is 1.
        timeout: seconds each collective (and joining) may wait for the peers.
    Returns:
        A :class:`~everyo_dist.group.ProcessGroup` over an :class:`ShmTransport`.
    """
    rank, world_size, timeout = check_membership(rank, world_size, timeout)
    check_store_ordering(world_size)
    transport = ShmTransport(rank, world_size, segment,
                             Collective.starting(rank, world_size, timeout))
    return ProcessGroup(rank, world_size, transport, timeout, ranks_on_this_machine=world_size)


# NOTE: the protocol publishes data by storing a counter after it, which is only safe where the
# CPU keeps stores (and loads) in order, as x86-64 does. NumPy gives Python no memory fence, so
# on weakly ordered CPUs (aarch64, ...) a peer could read a slot before the data lands: refuse
# there, loudly, rather than risk silently wrong gradients.
TOTAL_STORE_ORDER_MACHINES = ("x86_64", "amd64", "AMD64", "i686", "i386")


def check_store_ordering(world_size: int, machine: str | None = None) -> None:
    """Refuse a multi-rank shm group on a CPU whose memory model the protocol does not cover."""
    machine = machine or platform.machine()
    if world_size > 1 and machine not in TOTAL_STORE_ORDER_MACHINES:
        raise DistributedError(
            f"the shm backend needs x86-64 store ordering and this machine is {machine!r}; "
            f"use backend='tcp' on 127.0.0.1 (spawn(..., backend='tcp')) instead"
        )


class ShmTransport:
    """Moves the collectives of the ranks of one machine through POSIX shared memory.

    Args:
        rank: this process's rank.
        world_size: number of ranks.
        segment: the control segment's name (see :func:`create_shm_group`).
        joining: the start-up pseudo-collective whose deadline bounds joining the group.
        creator_pid: the pid of rank 0's process when the caller knows it: the others then
            fail as soon as it exits without creating the segment, not at the timeout. (The
            pid in a name a launcher chose need not be rank 0's, so it is not used for this.)
    """

    name = "shm"

    def __init__(self, rank: int, world_size: int, segment: str | None, joining: Collective,
                 creator_pid: int | None = None):
        self.rank, self.world_size = rank, world_size
        if segment is None:
            if world_size != 1:
                raise DistributedError("an shm group of several ranks needs the name of its "
                                       "shared segment (segment=..., or EVERYO_SHM_SEGMENT)")
            segment = segment_name(new_job_id(), "ctl")
        parsed = parse_name(segment)
        if parsed is None:
            raise DistributedError(f"shm segment names look like 'everyo-<pid>-<job>-<part>' "
                                   f"(see everyo_dist.backends.shm.segments), got {segment!r}")
        self.segment = segment
        self._words = None
        self._anchor = None
        self._address = 0
        self._control: Segment | None = None
        self._job = parsed[1]
        self._epoch = 0
        self._spin = SHARED_CORE_SPIN_SECONDS
        self._capacity = 0
        self._generation = 0
        self._published = 0  # the epoch of the last publish()
        self._data: Segment | None = None
        self._scratch = np.empty(2 * REDUCE_BLOCK, np.float64)
        self._control = self._open_control(segment, joining, creator_pid)
        self._words = self._control.buf.cast("q")
        self._my_word = rank * _WORDS + _EPOCH
        self._peer_words = [r * _WORDS + _EPOCH for r in range(world_size) if r != rank]
        self._words[rank * _WORDS + _PID] = os.getpid()
        # the control segment's address, for futexes (the ctypes view is dropped on close)
        self._anchor = ctypes.c_char.from_buffer(self._control.buf) if futex_available() \
            and world_size > 1 else None
        self._address = ctypes.addressof(self._anchor) if self._anchor is not None else 0
        try:
            self._arrive_and_wait(joining, "joining the group")
        except BaseException:
            self._release()
            raise
        if rank == 0:
            unlink(segment)  # every rank has it mapped; nothing may leak from here on
        self._pids = [self._words[r * _WORDS + _PID] for r in range(world_size)]
        self._spin = SPIN_SECONDS if world_size <= available_workers() \
            else SHARED_CORE_SPIN_SECONDS

    def _open_control(self, name: str, joining: Collective,
                      creator_pid: int | None) -> Segment:
        size = self.world_size * BLOCK
        if self.rank == 0:
            sweep_stale_segments()
            try:
                return Segment(name, size, create=True)
            except FileExistsError:
                pass  # created by the spawn parent
        next_check = time.monotonic() + LIVENESS_INTERVAL
        while True:  # peers may start before rank 0 created it
            try:
                control = Segment(name, size, create=False)
                if control.size == size:
                    return control
                control.close()
            except (FileNotFoundError, ValueError):  # ValueError: created, not yet sized
                pass
            if joining.remaining() <= 0:
                raise joining.timeout_error([0], f"shared segment {name} never appeared")
            if creator_pid is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + LIVENESS_INTERVAL  # dead: fail now, not later
                if not process_alive(creator_pid):
                    raise joining.peer_lost_error(
                        0, f"the process that creates the shared segment {name} (pid "
                           f"{creator_pid}) exited before creating it")
            time.sleep(0.01)

    # -- synchronisation ---------------------------------------------------------------------
    def _arrive_and_wait(self, call: Collective, waiting_for: str) -> None:
        self._wait_for_peers(call, self._arrive(), waiting_for)

    def _arrive(self) -> int:
        """Store this rank's next epoch (waking peers that sleep on it); returns the epoch."""
        self._epoch += 1
        self._words[self._my_word] = self._epoch
        if self._address:
            futex_wake(self._address + 8 * self._my_word)
        return self._epoch

    def _wait_for_peers(self, call: Collective, epoch: int, waiting_for: str) -> None:
        """Return once every peer has reached ``epoch``; bounded by the deadline, and a peer
        found dead is named at once."""
        words = self._words
        pending = [i for i in self._peer_words if words[i] < epoch]
        if not pending:
            return
        start = time.monotonic()
        while time.monotonic() - start < self._spin:  # a peer a few microseconds behind
            pending = [i for i in pending if words[i] < epoch]
            if not pending:
                return
        sleep = 0.0
        next_check = start + LIVENESS_INTERVAL
        while True:
            pending = [i for i in pending if words[i] < epoch]
            if not pending:
                return
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LIVENESS_INTERVAL
                self._check_peers_alive(call, [i // _WORDS for i in pending], waiting_for)
                if now >= call.deadline:
                    raise call.timeout_error([i // _WORDS for i in pending], waiting_for)
            if self._address:
                seen = words[pending[0]]
                if seen < epoch:
                    futex_wait(self._address + 8 * pending[0], low32(seen),
                               max(next_check - now, 1e-3))
            else:
                sleep = min(MAX_SLEEP, sleep * 2 or 5e-5)
                time.sleep(sleep)

    def _check_peers_alive(self, call: Collective, ranks, waiting_for: str) -> None:
        pids = getattr(self, "_pids", None) or [
            self._words[r * _WORDS + _PID] for r in range(self.world_size)]
        for rank in ranks:
            if pids[rank] and not process_alive(pids[rank]):
                raise call.peer_lost_error(rank, f"its process (pid {pids[rank]}) exited "
                                                  f"while this rank waited for {waiting_for}")

    def exchange_fingerprints(self, call: Collective, packed: bytes) -> list[bytes]:
        slot = _FINGERPRINT_OFFSET + ((self._epoch + 1) % 2) * FINGERPRINT_SIZE
        buf = self._control.buf
        mine = self.rank * BLOCK + slot
        buf[mine:mine + FINGERPRINT_SIZE] = packed
        self._arrive_and_wait(call, "the fingerprint exchange")
        return [bytes(buf[r * BLOCK + slot:r * BLOCK + slot + FINGERPRINT_SIZE])
                for r in range(self.world_size)]

    # -- the data segment --------------------------------------------------------------------
    def _ensure_capacity(self, call: Collective, nbytes: int) -> None:
        """Make every slot hold ``nbytes``; all ranks call this with the same value."""
        if nbytes <= self._capacity:
            return
        capacity = max(nbytes, 2 * self._capacity, MIN_CAPACITY)
        capacity = -(-capacity // 4096) * 4096
        self._generation += 1
        name = segment_name(self._job, f"d{self._generation}", owner_pid=self._pids[0])
        size = (self.world_size + 1) * capacity
        data = Segment(name, size, create=True) if self.rank == 0 else None
        try:
            self._arrive_and_wait(call, "rank 0 to allocate shared memory")
            if data is None:
                data = Segment(name, size, create=False)
            self._arrive_and_wait(call, "every rank to map the new shared memory")
        except BaseException:  # a peer died or timed out: its name must not outlive rank 0
            if self.rank == 0:
                unlink(name)
            if data is not None:
                data.close()
            raise
        if self.rank == 0:
            unlink(name)
        if self._data is not None:
            self._data.close()
        self._data, self._capacity = data, capacity

    def _slot(self, index: int, dtype, count: int) -> np.ndarray:
        """Slot ``index`` (``world_size`` is the result slot) viewed as ``count`` ``dtype``s."""
        return np.frombuffer(self._data.buf, dtype=dtype, count=count,
                             offset=index * self._capacity)

    def _chunk(self, rank: int, count: int, itemsize: int) -> tuple[int, int]:
        """The element range of the result that ``rank`` reduces."""
        step = max(ALIGN // itemsize, 1)
        per_rank = -(-count // (self.world_size * step)) * step
        return min(rank * per_rank, count), min((rank + 1) * per_rank, count)

    # -- primitives --------------------------------------------------------------------------
    def all_reduce(self, call: Collective, flat: np.ndarray, mean: bool,
                   out: np.ndarray) -> None:
        divisor = self.world_size if mean else 1
        if self.world_size == 1:
            reduce_rows([flat], out, divisor, self._scratch)
            return
        self._ensure_capacity(call, flat.nbytes)
        slots = [self._slot(r, flat.dtype, flat.size) for r in range(self.world_size)]
        if flat.nbytes <= SMALL_BYTES:  # latency-bound: every rank reduces it all, one barrier
            np.copyto(slots[self.rank], flat)
            self._arrive_and_wait(call, "every rank to write its vector")
            reduce_rows(slots, out, divisor, self._scratch)
            return
        low, high = self._chunk(self.rank, flat.size, flat.dtype.itemsize)
        # the peers read only their own chunks of this rank's slot; this rank reads its own
        # chunk straight from flat (flat may be out: the reduction reads an element of every
        # row before it writes that element)
        mine = slots[self.rank]
        mine[:low] = flat[:low]
        mine[high:] = flat[high:]
        self._arrive_and_wait(call, "every rank to write its vector")
        rows = [flat[low:high] if r == self.rank else slot[low:high]
                for r, slot in enumerate(slots)]
        result = self._slot(self.world_size, flat.dtype, flat.size)
        # own chunk straight into out, then (still in cache) into the result slot for the peers
        reduce_rows(rows, out[low:high], divisor, self._scratch)
        result[low:high] = out[low:high]
        self._arrive_and_wait(call, "every rank to reduce its chunk")
        out[:low] = result[:low]
        out[high:] = result[high:]

    # -- pieces for a transport built on this one (tcp_hierarchical) ----------------------
    def publish(self, call: Collective, flat: np.ndarray, share_own: bool = True,
                wait: bool = True) -> list[np.ndarray]:
        """Write ``flat`` into this rank's slot (unless ``share_own`` is False: no peer reads
        it) and return every rank's vector in rank order (views of the slots, no copy), valid
        until this group's next collective. Also sizes the result slot.

        With ``wait=False`` it returns at once, before the peers' slots may be read: call
        :meth:`wait_for_publish` first (meanwhile this rank can use its own vector).
        """
        self._ensure_capacity(call, flat.nbytes)
        slots = [self._slot(r, flat.dtype, flat.size) for r in range(self.world_size)]
        if share_own:
            np.copyto(slots[self.rank], flat)
        else:
            slots[self.rank] = flat
        self._published = self._arrive()
        if wait:
            self.wait_for_publish(call)
        return slots

    def wait_for_publish(self, call: Collective) -> None:
        """Wait until every rank has published (see :meth:`publish`)."""
        self._wait_for_peers(call, self._published, "every rank to write its vector")

    def result_slot(self, dtype, count: int) -> np.ndarray:
        """The result slot as ``count`` ``dtype``s (sized by the last :meth:`publish`)."""
        return self._slot(self.world_size, dtype, count)

    def wait_for(self, call: Collective, what: str) -> None:
        """A barrier of this group; ``what`` names what the waiting ranks wait for."""
        self._arrive_and_wait(call, what)

    def broadcast(self, call: Collective, flat: np.ndarray, src: int) -> np.ndarray:
        if self.world_size == 1:
            return flat.copy()
        self._ensure_capacity(call, flat.nbytes)
        result = self._slot(self.world_size, flat.dtype, flat.size)
        if self.rank == src:
            np.copyto(result, flat)
        self._arrive_and_wait(call, f"rank {src} to write the broadcast")
        return result.copy()

    def all_gather(self, call: Collective, flat: np.ndarray) -> np.ndarray:
        if self.world_size == 1:
            return flat.reshape(1, -1).copy()
        self._ensure_capacity(call, flat.nbytes)
        np.copyto(self._slot(self.rank, flat.dtype, flat.size), flat)
        self._arrive_and_wait(call, "every rank to write its array")
        gathered = np.empty((self.world_size, flat.size), flat.dtype)
        for rank in range(self.world_size):
            gathered[rank] = self._slot(rank, flat.dtype, flat.size)
        return gathered

    def close(self) -> None:
        self._release()

    def _release(self) -> None:
        self._anchor, self._address = None, 0
        if self._words is not None:
            try:
                self._words.release()
            except BufferError:
                pass
            self._words = None
        for segment in (self._data, self._control):
            if segment is not None:
                segment.close()
        self._data = self._control = None
