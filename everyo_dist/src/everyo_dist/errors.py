"""The errors data-parallel training raises. All derive from ``everyo.EveryOError``."""

from __future__ import annotations

from everyo.errors import EveryOError


class DistributedError(EveryOError):
    """Base class: a process group or ``spawn`` failed, or was configured wrongly."""


class CollectiveMismatchError(DistributedError):
    """Ranks called different collectives (or the same one on different shapes or dtypes).

    The message names what this rank called and what the other rank called, e.g.
    ``rank 0 called all_reduce_mean #3 on float32[10] but rank 1 called barrier #3``.
    """


class CollectiveTimeoutError(DistributedError, TimeoutError):
    """A collective did not complete in time; the message names the collective, its sequence
    number and the ranks that did not arrive (``.missing_ranks``)."""

    def __init__(self, message: str, missing_ranks=()):
        super().__init__(message)
        self.missing_ranks = tuple(missing_ranks)


class PeerLostError(DistributedError):
    """A peer rank disappeared in the middle of a collective (its process died, its connection
    closed); ``.rank`` is that peer."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


class WorkerError(DistributedError):
    """A worker started by ``spawn`` raised or died; raised in the parent.

    ``.rank`` is the failing worker, ``.details`` its traceback text (or how it died) and
    ``.signal`` the signal name when it was killed by one (e.g. ``"SIGKILL"``).
    """

    def __init__(self, message: str, rank: int, details: str = "", signal: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.details = details
        self.signal = signal


__all__ = ["DistributedError", "CollectiveMismatchError", "CollectiveTimeoutError",
           "PeerLostError", "WorkerError"]
