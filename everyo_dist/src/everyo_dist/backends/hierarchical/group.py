"""``tcp_hierarchical``: all-reduce through shared memory inside each machine and a tcp ring of
one leader per machine between machines, bit-identical to the canonical reduction.

With ``M`` machines, leader ``i`` (local rank 0 of machine ``i``) owns slice ``i`` of the
vector. An all-reduce runs in four steps:

1. inside each machine every rank publishes its raw vector in shared memory (no partial sums);
2. the leaders pass raw rows round their ring: in step ``s`` leader ``i`` sends the next leader
   the rows of leaders ``i - s .. i`` for slice ``i - s - 1``, so after ``M - 1`` steps each
   owner holds the raw rows of *every* rank for its slice and reduces them with
   :func:`~everyo_dist.reduction.reduce_rows`, in rank order: the canonical arithmetic;
3. the leaders ring-gather the reduced slices (in the result's dtype), the first hop sent
   block by block while the owner is still reducing;
4. each leader broadcasts the result inside its machine through shared memory.

Raw rows cost ``k`` times the input's bytes per machine, so the hierarchy pays only for few
ranks per machine and few machines (``layout.hierarchy_pays``); otherwise the same call runs on
the flat tcp ring every rank also joined, which sums in rank order too: the same bits. Barrier, broadcast and
all-gather always use the flat ring. The pieces are the shm and tcp backends' own: the shared
segments, the authenticated ring with its validated frames and ABORT relay, and the reduction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from everyo_dist.backends.hierarchical.layout import hierarchy_pays, machines_of
from everyo_dist.backends.shm.group import ShmTransport, check_store_ordering
from everyo_dist.backends.shm.segments import new_job_id, segment_name, unlink
from everyo_dist.backends.tcp.allreduce import chunk_bounds
from everyo_dist.backends.tcp.auth import DEFAULT_HANDSHAKE_TIMEOUT, token_key
from everyo_dist.backends.tcp.group import _connect_ring, create_tcp_group
from everyo_dist.backends.tcp.ring import Ring
from everyo_dist.backends.tcp.sockets import listen
from everyo_dist.backends.tcp.tls import tls_contexts_from_environment
from everyo_dist.contract import Collective
from everyo_dist.errors import DistributedError
from everyo_dist.group import ProcessGroup, SingleRankTransport, check_membership
from everyo_dist.reduction import REDUCE_BLOCK, accumulator_dtype, reduce_rows

NAME = "tcp_hierarchical"
HIERARCHY_CHOICES = ("auto", "always", "never")
_HOST_BYTES = 64  # a leader's address, NUL-padded, in the start-up all-gather


@dataclass
class SubgroupCollective(Collective):
    """A collective as a sub-group (one machine's shm group, the leaders' ring) runs it: the
    sub-group numbers its members ``0, 1, ...``; the errors built here name global ranks."""

    ranks: tuple = ()
    where: str = ""

    @classmethod
    def of(cls, call: Collective, ranks, where: str = "") -> "SubgroupCollective":
        return cls(call.rank, call.world_size, call.timeout, call.deadline, call.fingerprint,
                   tuple(ranks), where)

    def describe(self) -> str:
        return f"{super().describe()} ({self.where})" if self.where else super().describe()

    def timeout_error(self, missing_ranks, waited_for: str = ""):
        return super().timeout_error([self.ranks[r] for r in missing_ranks], waited_for)

    def peer_lost_error(self, rank: int, detail: str = ""):
        return super().peer_lost_error(self.ranks[rank], detail)


def _leaders_note(machines) -> str:
    """How the leaders' ring numbers its members, for its error messages."""
    return "ring of machine leaders, position = rank: " + ", ".join(
        f"{index} = {machine.start}" for index, machine in enumerate(machines))


class _SliceFinisher:
    """Reduces the owned slice block by block inside the ring's send loop, so the first
    all-gather hop sends the slice while it is being reduced."""

    __slots__ = ("rows", "out", "divisor", "done", "scratch")

    def __init__(self, rows, out, divisor):
        self.rows, self.out, self.divisor, self.done = rows, out, divisor, 0
        self.scratch = np.empty(2 * REDUCE_BLOCK, accumulator_dtype(out.dtype))

    def work(self, received) -> bool:
        if self.done >= self.out.size:
            return False
        start, self.done = self.done, min(self.done + REDUCE_BLOCK, self.out.size)
        reduce_rows([row[start:self.done] for row in self.rows], self.out[start:self.done],
                    self.divisor, self.scratch)
        return True

    def ready_bytes(self) -> int:
        return self.done * self.out.itemsize


class HierarchicalTransport:
    """The transport: a flat tcp transport (every rank), an shm transport per machine, and a
    tcp :class:`Ring` between the machines' leaders (leaders only)."""

    name = NAME

    def __init__(self, rank: int, flat, machines: list[range], shm: ShmTransport | None,
                 leaders: Ring | None, hierarchy: str = "auto"):
        self.rank, self._flat, self._shm, self._leaders = rank, flat, shm, leaders
        self._hierarchy = hierarchy
        self._machines = machines
        self._sizes = [len(m) for m in machines]
        self.machine = next(m for m in machines if rank in m)
        self._index = machines.index(self.machine)
        self.rendezvous = None  # the TCPRendezvousServer this rank hosts, if any
        self._world_size = sum(self._sizes)
        self._buffers: dict[tuple, np.ndarray] = {}

    def _local(self, call: Collective) -> SubgroupCollective:
        return SubgroupCollective.of(call, self.machine)

    def exchange_fingerprints(self, call: Collective, packed: bytes) -> list[bytes]:
        # The flat ring checks fingerprints in every frame it receives (and runs barriers);
        # inside a machine the shm exchange checks them and is the barrier that keeps a fast
        # rank from overwriting a slot a peer still reads.
        fingerprints = self._flat.exchange_fingerprints(call, packed)
        if self._shm is not None:
            local = self._telling_leaders(self._shm.exchange_fingerprints, self._local(call),
                                          packed)
            fingerprints = [*fingerprints[:self.machine.start], *local,
                            *fingerprints[self.machine.stop:]]
        return fingerprints

    def all_reduce(self, call: Collective, flat: np.ndarray, mean: bool,
                   out: np.ndarray) -> None:
        if self._hierarchy == "never" or (self._hierarchy == "auto" and not hierarchy_pays(
                flat.size, self._sizes, flat.dtype.itemsize)):
            self._flat.all_reduce(call, flat, mean, out)
            return
        if len(self._machines) == 1:
            self._shm.all_reduce(self._local(call), flat, mean, out)
            return
        self._telling_leaders(self._reduce_in_steps, call, flat, mean, out)

    def _telling_leaders(self, step, *args):
        """Run ``step``; if it fails on a leader, the other leaders learn why now (an ABORT
        frame round their ring) instead of at their timeout."""
        try:
            return step(*args)
        except BaseException as exc:
            if self._leaders is not None:  # ranks in the ABORT frame must be ring positions,
                self._leaders.abort(DistributedError(  # so the reason travels as text
                    f"{type(exc).__name__} on rank {self.rank}: {exc}"))
            raise

    def _reduce_in_steps(self, call: Collective, flat: np.ndarray, mean: bool,
                         out: np.ndarray) -> None:
        leads = self._leaders is not None
        if self._shm is None:  # a machine of one rank: no shared memory
            self._reduce_between_machines(call, [flat], self._world_size if mean else 1, out)
            return
        local = self._local(call)
        # The leader reads its own row in place (nobody else needs it) and sends it while the
        # machine's other ranks are still publishing theirs; it builds the result in out,
        # whose fresh pages then fault while the network is the bottleneck anyway.
        rows = self._shm.publish(local, flat, share_own=not leads, wait=not leads)
        result = self._shm.result_slot(out.dtype, out.size)
        if leads:
            self._reduce_between_machines(call, rows, self._world_size if mean else 1, out,
                                          lambda: self._shm.wait_for_publish(local))
            np.copyto(result, out)
        else:
            out.fill(0)  # fault out's pages in while the leaders work (flat is published)
        self._shm.wait_for(local, f"rank {self.machine.start} to write the result")
        if not leads:
            np.copyto(out, result)

    def _reduce_between_machines(self, call: Collective, rows, divisor: int,
                                 out: np.ndarray, rows_ready=None) -> None:
        """Steps 2 and 3 on a leader: ``rows`` are its machine's raw vectors, of which only
        its own (``rows[0]``) may be read before ``rows_ready()`` returned."""
        machines, me, ring = len(self._machines), self._index, self._leaders
        ring.call = SubgroupCollective.of(call, [m.start for m in self._machines],
                                          _leaders_note(self._machines))
        bounds = chunk_bounds(out.size, machines)
        world = self._world_size

        def part(array, index):
            return array[bounds[index]:bounds[index + 1]]

        # received[m]: machine m's raw rows for the slice being forwarded (double buffered:
        # a step sends what the previous one received while receiving the next slice)
        received: dict[int, list[np.ndarray]] = {}
        for step in range(machines - 1):
            send_slice, recv_slice = (me - step - 1) % machines, (me - step - 2) % machines
            sends = []
            for t in range(step + 1):
                machine = (me - step + t) % machines
                blocks = [part(row, send_slice) for row in rows] if machine == me \
                    else received[machine]
                sends += [(step * world + self._machines[machine][j], block, None)
                          for j, block in enumerate(blocks)]
            incoming, recvs = {}, []
            for t in range(step + 1):
                machine = (me - 1 - step + t) % machines
                length = bounds[recv_slice + 1] - bounds[recv_slice]
                incoming[machine] = [self._scratch(step % 2, machine, j, out.dtype, length)
                                     for j in range(self._sizes[machine])]
                recvs += [(step * world + self._machines[machine][j], block)
                          for j, block in enumerate(incoming[machine])]
            if step == 0 and rows_ready is not None:  # this leader's own row first
                ring.pump(sends[:1], recvs[:1])
                rows_ready()
                sends, recvs = sends[1:], recvs[1:]
            ring.pump(sends, recvs)
            received = incoming
        # every rank's raw rows of the owned slice, in rank order: the canonical reduction
        ordered = []
        for machine in range(machines):
            ordered += [part(row, me) for row in rows] if machine == me else received[machine]
        finisher = _SliceFinisher(ordered, part(out, me), divisor)
        base = (machines - 1) * world
        first = (me - 1) % machines
        ring.pump([(base, part(out, me), finisher.ready_bytes)], [(base, part(out, first))],
                  finisher.work)
        while finisher.work(None):  # a zero-length slice never asks for work
            pass
        for step in range(1, machines - 1):
            ring.transfer(base + step, part(out, (me - step) % machines),
                          part(out, (me - step - 1) % machines))

    def _scratch(self, parity: int, machine: int, row: int, dtype, length: int) -> np.ndarray:
        """A reusable receive buffer: allocating tens of MB per call costs page faults."""
        key = (parity, machine, row)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.dtype != dtype or buffer.size < length:
            buffer = self._buffers[key] = np.empty(length, dtype)
        return buffer[:length]

    def broadcast(self, call: Collective, flat: np.ndarray, src: int) -> np.ndarray:
        return self._flat.broadcast(call, flat, src)

    def all_gather(self, call: Collective, flat: np.ndarray) -> np.ndarray:
        return self._flat.all_gather(call, flat)

    def close(self) -> None:
        for part in (self._leaders, self._shm, self._flat, self.rendezvous):
            if part is not None:
                part.close()


def _leader_address(rank: int, record, address) -> tuple[str, int]:
    """Leader ``rank``'s ``(host, port)`` from its start-up record, checked: a peer's bytes
    never reach ``connect`` (or a decoder) unvalidated."""
    host = bytes(address).rstrip(b"\0")
    port = int(record[1])
    if not 0 < port < 65536 or not host or not host.isascii() or b"\0" in host:
        raise DistributedError(f"tcp_hierarchical: leader rank {rank} sent an invalid "
                               f"address {host!r}:{port} in the start-up exchange")
    return host.decode("ascii"), port


def _check_same_hierarchy(records) -> None:
    """Every rank must run each all-reduce the same way: a rank on the flat ring and one in
    the hierarchy would wait on different connections until the timeout, so a mixed
    ``hierarchy=`` is refused at start-up, on every rank, with every rank's choice."""
    choices = [int(r[4]) for r in records]
    if len(set(choices)) > 1:
        raise DistributedError(
            "tcp_hierarchical: every rank must pass the same hierarchy=, got " + ", ".join(
                f"rank {rank}: {HIERARCHY_CHOICES[c]!r}" if 0 <= c < len(HIERARCHY_CHOICES)
                else f"rank {rank}: invalid ({c})" for rank, c in enumerate(choices)))


def create_hierarchical_group(rank: int, world_size: int, local_rank: int | None = None,
                              master_addr: str | None = None, master_port: int | None = None,
                              token: str | None = None, timeout: float | None = None,
                              tls_cert: str | None = None, tls_key: str | None = None,
                              tls_ca: str | None = None,
                              handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                              hierarchy: str = "auto", wire_dtype: str | None = None,
                              serve_rendezvous: bool = False) -> ProcessGroup:
    """The ``"tcp_hierarchical"`` backend factory (``everyo-run --backend tcp_hierarchical``).

    Every rank first joins the flat tcp ring (same rendezvous and options as ``"tcp"``); the
    ranks then learn which of them share a machine from their local ranks, each machine's
    ranks join a shared-memory group, and the machines' leaders (local rank 0) connect a ring
    of their own, authenticated like every tcp connection.

    Args:
        rank: this process's rank; a machine's ranks must be contiguous.
        world_size: number of ranks.
        local_rank: rank among the processes of this machine (``EVERYO_LOCAL_RANK``, set by
            ``everyo-run``); None means every rank is on its own machine.
        master_addr, master_port, token, timeout, tls_cert, tls_key, tls_ca,
            handshake_timeout: as for ``"tcp"`` (TLS covers the leaders' ring too).
        hierarchy: ``"auto"`` (default) runs each all-reduce hierarchically when that sends
            fewer bytes over the busiest link (``layout.hierarchy_pays``), else on the flat
            ring; ``"always"`` and ``"never"`` force one (for measurements). Every rank
            must pass the same (see docs/distributed.md for the bits of each).
        wire_dtype: refused unless None: this backend always sends exact values (use
            ``"tcp"`` for wire compression).
        serve_rendezvous: host the rendezvous on this rank, as for ``"tcp"``.
    Returns:
        A :class:`~everyo_dist.group.ProcessGroup` whose ``backend`` is ``"tcp_hierarchical"``.

    Example:
        >>> import everyo.distributed as dist
        >>> group = dist.init(backend="tcp_hierarchical")  # doctest: +SKIP
    """
    rank, world_size, timeout = check_membership(rank, world_size, timeout)
    local_rank = _check_options(rank, local_rank, hierarchy, wire_dtype)
    contexts = tls_contexts_from_environment(os.environ, tls_cert, tls_key, tls_ca)
    flat = create_tcp_group(rank, world_size, master_addr, master_port, token, timeout,
                            tls_cert, tls_key, tls_ca, handshake_timeout,
                            serve_rendezvous=serve_rendezvous)
    if world_size == 1:
        flat.close()
        return ProcessGroup(rank, 1, SingleRankTransport(NAME), timeout)
    machines, shm, leaders = _join_machines(flat, local_rank, hierarchy, token, timeout,
                                            handshake_timeout, contexts)
    transport = HierarchicalTransport(rank, flat.transport, machines, shm, leaders, hierarchy)
    transport.rendezvous = flat.rendezvous
    return ProcessGroup(rank, world_size, transport, timeout,
                        ranks_on_this_machine=len(transport.machine))


def _check_options(rank: int, local_rank, hierarchy: str, wire_dtype) -> int:
    """The checked local rank; the options this backend refuses, named."""
    if wire_dtype is not None:
        raise DistributedError(f"tcp_hierarchical sends exact values and has no wire "
                               f"compression (wire_dtype={wire_dtype!r}); use backend='tcp' "
                               f"for it, or unset EVERYO_WIRE_DTYPE")
    if hierarchy not in HIERARCHY_CHOICES:
        raise DistributedError(f"hierarchy must be one of {', '.join(HIERARCHY_CHOICES)}, "
                               f"got {hierarchy!r}")
    local_rank = 0 if local_rank is None else int(local_rank)
    if not 0 <= local_rank <= rank:
        raise DistributedError(f"rank {rank}: local rank must be in 0..{rank}, got {local_rank}")
    return local_rank


def _join_machines(flat, local_rank: int, hierarchy: str, token, timeout: float,
                   handshake_timeout: float, contexts):
    """On the flat ring, learn which ranks share a machine; join its shm group and (leaders)
    the leaders' ring. ``(machines, shm transport or None, leaders' Ring or None)``; on any
    failure the flat group is closed and a leader's segment unlinked."""
    rank, world_size = flat.rank, flat.world_size
    server_context, client_context = contexts if contexts else (None, None)
    listener = leaders = None
    leads = local_rank == 0
    job = new_job_id() if leads else "0"
    try:
        host = flat.transport.local_host()
        listener = listen(host, 0) if leads else None
        record = np.int64([local_rank, listener.getsockname()[1] if leads else 0,
                           int(job, 16), os.getpid(), HIERARCHY_CHOICES.index(hierarchy)])
        records = flat.all_gather(record)
        _check_same_hierarchy(records)
        address = np.zeros(_HOST_BYTES, np.uint8)
        address[:len(host)] = np.frombuffer(host.encode("ascii"), np.uint8)
        addresses = flat.all_gather(address)
        machines = machines_of([int(r[0]) for r in records])
        machine = next(m for m in machines if rank in m)
        joining = Collective.starting(rank, world_size, timeout)
        if leads and len(machines) > 1:
            peers = [_leader_address(m.start, records[m.start], addresses[m.start])
                     for m in machines]
            to_next, from_prev = _connect_ring(
                machines.index(machine), len(machines), peers, listener, token_key(token),
                joining.deadline, handshake_timeout, client_context, server_context)
            leaders = Ring(machines.index(machine), len(machines), to_next, from_prev,
                           ranks=[m.start for m in machines])
        shm = None
        if len(machine) > 1:
            check_store_ordering(len(machine))
            leader = records[machine.start]
            name = segment_name(f"{int(leader[2]):012x}", "ctl", owner_pid=int(leader[3]))
            shm = ShmTransport(local_rank, len(machine), name,
                               SubgroupCollective.of(joining, machine), int(leader[3]))
        return machines, shm, leaders
    except BaseException:
        for part in (leaders, flat):
            if part is not None:
                part.close()
        if leads:  # a failed join must not leave the segment behind
            unlink(segment_name(job, "ctl"))
        raise
    finally:
        if listener is not None:
            listener.close()
