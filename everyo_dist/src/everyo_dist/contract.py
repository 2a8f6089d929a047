"""The contract between :class:`~everyo_dist.group.ProcessGroup` and a backend's transport.

``ProcessGroup`` implements the public collectives once, with the checks every backend shares
(input validation, the fingerprint exchange that catches ranks calling different collectives,
a deadline per collective, "a failed group stays failed"). What moves the bytes is a
*transport*, an object with these methods, all called on flat, C-contiguous, non-empty arrays
whose shape and dtype every rank has already agreed on:

``exchange_fingerprints(call, packed) -> list[bytes]``
    Give this rank's ``FINGERPRINT_SIZE`` bytes to every peer and return every rank's,
    indexed by rank. It must not return before every rank contributed: it is also the barrier.
``all_reduce(call, flat, mean, out) -> None``
    Write into ``out`` the float64 rank-order sum of every rank's ``flat`` (divided by
    ``world_size`` when ``mean``) in ``out.dtype``, bit-identical on every rank:
    :func:`everyo_dist.reduction.reduce_rows` is the arithmetic. ``out`` may be ``flat``
    itself, so peers must not read this rank's ``flat`` once this call returns.
``broadcast(call, flat, src) -> ndarray``
    Rank ``src``'s ``flat`` on every rank (the others pass an array of the right size).
``all_gather(call, flat) -> ndarray``
    A ``(world_size, flat.size)`` array whose row ``r`` is rank ``r``'s ``flat``.
``close() -> None``
    Release sockets, shared memory, ...; called once.

and a ``name`` attribute (the backend's registered name). Every method receives the
:class:`Collective` being run: its deadline, and the errors to raise with the collective named.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from everyo_dist.errors import CollectiveTimeoutError, PeerLostError
from everyo_dist.fingerprint import Fingerprint


@dataclass
class Collective:
    """One collective call as a transport sees it.

    Attributes:
        rank: the calling rank.
        world_size: the group's size.
        timeout: seconds the collective may wait for its peers.
        deadline: ``time.monotonic()`` value after which it must give up.
        fingerprint: what was called (None while the group is being formed).

    Example:
        >>> call = Collective.starting(rank=0, world_size=2, timeout=5.0)
        >>> call.describe(), 0 < call.remaining() <= 5.0
        ('start-up', True)
    """

    rank: int
    world_size: int
    timeout: float
    deadline: float
    fingerprint: Fingerprint | None = None

    @classmethod
    def starting(cls, rank: int, world_size: int, timeout: float) -> "Collective":
        """The pseudo-collective of forming a group: its deadline starts now."""
        return cls(rank, world_size, timeout, time.monotonic() + timeout)

    def remaining(self) -> float:
        """Seconds left before the deadline (negative once it passed)."""
        return self.deadline - time.monotonic()

    def describe(self) -> str:
        """What was called, for error messages (``"all_reduce_mean #3 of float32 (10,)"``)."""
        return self.fingerprint.describe() if self.fingerprint is not None else "start-up"

    def timeout_error(self, missing_ranks, waited_for: str = "") -> CollectiveTimeoutError:
        """The error for peers ``missing_ranks`` that did not arrive before the deadline."""
        missing = sorted(int(r) for r in missing_ranks)
        detail = f" ({waited_for})" if waited_for else ""
        return CollectiveTimeoutError(
            f"{self.describe()} timed out after {self.timeout:g}s on rank {self.rank}{detail}: "
            f"rank{'s' if len(missing) != 1 else ''} {', '.join(map(str, missing))} did not "
            f"arrive. Every rank must call the same collectives in the same order.",
            missing,
        )

    def peer_lost_error(self, rank: int, detail: str = "") -> PeerLostError:
        """The error for a peer that vanished (died, disconnected) during the collective."""
        what = self.describe() if self.fingerprint is not None else "collective"
        return PeerLostError(f"{what}: rank {rank} was lost{': ' + detail if detail else ''}",
                             rank)


class Transport(Protocol):
    """What a backend implements (see this module's docstring for each method's duty)."""

    name: str

    def exchange_fingerprints(self, call: Collective, packed: bytes) -> list[bytes]: ...

    def all_reduce(self, call: Collective, flat: np.ndarray, mean: bool,
                   out: np.ndarray) -> None: ...

    def broadcast(self, call: Collective, flat: np.ndarray, src: int) -> np.ndarray: ...

    def all_gather(self, call: Collective, flat: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...
