"""Which ranks share a machine, and whether the hierarchical all-reduce moves fewer bytes.

Pure functions (no sockets), so the rule that picks the algorithm is easy to read and test.
"""

from __future__ import annotations

from everyo_dist.backends.tcp.allreduce import chunk_bounds, link_bytes
from everyo_dist.errors import DistributedError


def machines_of(local_ranks) -> list[range]:
    """The ranks of each machine, from every rank's local rank (index = global rank).

    A machine's ranks must be contiguous and numbered ``0 .. k-1`` locally, as ``everyo-run``
    numbers them (``rank = node_rank * nproc_per_node + local_rank``).

    Args:
        local_ranks: every rank's local rank, in rank order.
    Returns:
        One ``range`` of global ranks per machine, in order.

    Example:
        >>> machines_of([0, 1, 0, 1, 2])
        [range(0, 2), range(2, 5)]
    """
    starts = []
    for rank, local in enumerate(local_ranks):
        if local == 0:
            starts.append(rank)
        elif rank == 0 or local != local_ranks[rank - 1] + 1:
            raise DistributedError(
                f"tcp_hierarchical needs the ranks of a machine to be contiguous with local "
                f"ranks 0, 1, ...; rank {rank} has local rank {local} but rank {rank - 1} has "
                f"{local_ranks[rank - 1] if rank else 'none'} (every rank's local ranks: "
                f"{list(local_ranks)})")
    return [range(start, stop) for start, stop in zip(starts, [*starts[1:], len(local_ranks)])]


def flat_ring_bytes(count: int, world_size: int, itemsize: int) -> int:
    """Bytes the busiest link of the flat tcp ring carries for one all-reduce of ``count``
    items, with the schedule it picks (``allreduce.plan``).

    Example:
        >>> flat_ring_bytes(1000, 4, 4), flat_ring_bytes(1000, 8, 4)
        (9000, 12000)
    """
    return min(link_bytes(count, world_size, itemsize).values())


def hierarchical_bytes(count: int, machine_sizes, itemsize: int) -> int:
    """Bytes the busiest leader sends in the hierarchical all-reduce of ``count`` items.

    Leader ``i`` owns slice ``i``. In step ``s`` (``0 .. M-2``) it sends to the next leader the
    raw rows, for slice ``i - s - 1``, of leaders ``i - s .. i``; then the leaders ring-gather
    the ``M - 1`` reduced slices they do not own.

    Example:
        >>> hierarchical_bytes(1000, [2, 2], 4), flat_ring_bytes(1000, 4, 4)
        (6000, 9000)
    """
    machines = len(machine_sizes)
    bounds = chunk_bounds(count, machines)
    length = [b - a for a, b in zip(bounds, bounds[1:])]
    busiest = 0
    for me in range(machines):
        sent = 0
        for step in range(machines - 1):
            slice_index = (me - step - 1) % machines
            rows = sum(machine_sizes[(me - t) % machines] for t in range(step + 1))
            sent += rows * length[slice_index] * itemsize
        for step in range(machines - 1):
            sent += length[(me - step) % machines] * itemsize
        busiest = max(busiest, sent)
    return busiest


def hierarchy_pays(count: int, machine_sizes, itemsize: int) -> bool:
    """Whether the hierarchical all-reduce sends fewer bytes over the busiest link than the
    flat ring: true for two machines of two ranks each, false once raw rows outweigh what the
    flat ring sends (e.g. machines of 2, 1 and 1 ranks, or float64 on two machines of 3).

    Example:
        >>> hierarchy_pays(10**6, [2, 2], 4), hierarchy_pays(10**6, [2, 1, 1], 4)
        (True, False)
    """
    if len(machine_sizes) == 1:
        return True  # no network at all: shared memory only
    world_size = sum(machine_sizes)
    return hierarchical_bytes(count, machine_sizes, itemsize) < \
        flat_ring_bytes(count, world_size, itemsize)
