"""What every collective announces before any data moves: sequence number, op, dtype, shape.

Ranks compare fingerprints before trusting each other's bytes, so a rank that skipped a
collective, called a different one, or passed a different shape gets an immediate
``CollectiveMismatchError`` instead of a hang or silently mixed-up data. The encoding is a fixed
80-byte ``struct`` (no pickle): backends can put it on a wire or in shared memory as is.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple, Sequence

import numpy as np

from everyo_dist.errors import CollectiveMismatchError, DistributedError

MAX_DIMS = 8

# seq (u64), op (u8), dtype code (u8), ndim (u8), pad, root (i32), MAX_DIMS dims (i64)
_LAYOUT = struct.Struct(f"<QBBBxi{MAX_DIMS}q")
FINGERPRINT_SIZE = _LAYOUT.size


class CollectiveOp(enum.IntEnum):
    """The collectives a process group offers; the value is the wire code."""

    BARRIER = 1
    ALL_REDUCE_SUM = 2
    ALL_REDUCE_MEAN = 3
    BROADCAST = 4
    ALL_GATHER = 5

    @property
    def label(self) -> str:
        return self.name.lower()


# Code 0 means "no array" (barrier). Codes are part of the wire format: append, never renumber.
DTYPE_CODES: dict[str, int] = {
    "bool": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "uint32": 6, "int32": 7,
    "uint64": 8, "int64": 9, "float16": 10, "float32": 11, "float64": 12,
}
DTYPE_NAMES: dict[int, str] = {code: name for name, code in DTYPE_CODES.items()}


class Fingerprint(NamedTuple):
    """One rank's description of the collective it is entering.

    Example:
        >>> fp = Fingerprint.of(7, CollectiveOp.ALL_REDUCE_MEAN, np.zeros((2, 3), "float32"))
        >>> fp.describe()
        'all_reduce_mean #7 on float32[2, 3]'
        >>> Fingerprint.unpack(fp.pack()) == fp
        True
    """

    seq: int
    op: CollectiveOp
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    root: int = 0

    @classmethod
    def of(cls, seq: int, op: CollectiveOp, array: np.ndarray | None = None,
           root: int = 0) -> "Fingerprint":
        """The fingerprint of collective number ``seq`` applied to ``array``."""
        if array is None:
            return cls(seq, op, None, None, root)
        dtype = array.dtype.name
        if dtype not in DTYPE_CODES:
            raise DistributedError(f"{op.label} does not support dtype {dtype}; supported: "
                                   f"{', '.join(DTYPE_CODES)}")
        if array.ndim > MAX_DIMS:
            raise DistributedError(f"{op.label} supports arrays of up to {MAX_DIMS} dimensions, "
                                   f"got shape {array.shape}; reshape it first")
        return cls(seq, op, dtype, tuple(int(d) for d in array.shape), root)

    def pack(self) -> bytes:
        """The fixed-size binary form (``FINGERPRINT_SIZE`` bytes)."""
        shape = self.shape or ()
        dims = list(shape) + [0] * (MAX_DIMS - len(shape))
        dtype_code = DTYPE_CODES[self.dtype] if self.dtype is not None else 0
        ndim = len(shape) if self.shape is not None else 255  # 255: no array
        return _LAYOUT.pack(self.seq, int(self.op), dtype_code, ndim, self.root, *dims)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> "Fingerprint":
        """Decode :meth:`pack`'s bytes; refuses anything malformed (it may come off a wire)."""
        if len(data) != FINGERPRINT_SIZE:
            raise DistributedError(f"a fingerprint is {FINGERPRINT_SIZE} bytes, got {len(data)}")
        seq, op, dtype_code, ndim, root, *dims = _LAYOUT.unpack(data)
        try:
            op = CollectiveOp(op)
        except ValueError:
            raise DistributedError(f"unknown collective op code {op} in a fingerprint") from None
        if ndim == 255:
            return cls(seq, op, None, None, root)
        if ndim > MAX_DIMS or dtype_code not in DTYPE_NAMES or any(d < 0 for d in dims):
            raise DistributedError(f"malformed fingerprint (ndim={ndim}, dtype code={dtype_code})")
        return cls(seq, op, DTYPE_NAMES[dtype_code], tuple(dims[:ndim]), root)

    @property
    def nbytes(self) -> int:
        """Size of the array this collective carries (0 for a barrier)."""
        if self.shape is None:
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def describe(self) -> str:
        """Human-readable form used in error messages."""
        text = f"{self.op.label} #{self.seq}"
        if self.shape is not None:
            text += f" on {self.dtype}[{', '.join(map(str, self.shape))}]"
        if self.op == CollectiveOp.BROADCAST:
            text += f" from rank {self.root}"
        return text


def check_fingerprints(mine: Fingerprint, rank: int, packed: Sequence[bytes]) -> None:
    """Raise ``CollectiveMismatchError`` unless every rank's fingerprint equals ``mine``.

    Args:
        mine: this rank's fingerprint.
        rank: this rank.
        packed: every rank's packed fingerprint, indexed by rank.

    Example:
        >>> a = Fingerprint.of(0, CollectiveOp.BARRIER)
        >>> b = Fingerprint.of(0, CollectiveOp.ALL_GATHER, np.zeros(3))
        >>> try:
        ...     check_fingerprints(a, 0, [a.pack(), b.pack()])
        ... except CollectiveMismatchError as error:
        ...     print(error)
        rank 0 called barrier #0 but rank 1 called all_gather #0 on float64[3]
    """
    mine_packed = mine.pack()
    for other_rank, other in enumerate(packed):
        if other_rank != rank and bytes(other) != mine_packed:
            theirs = Fingerprint.unpack(other)
            raise CollectiveMismatchError(
                f"rank {rank} called {mine.describe()} but rank {other_rank} called "
                f"{theirs.describe()}"
            )
