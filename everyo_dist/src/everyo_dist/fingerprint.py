"""What every collective announces before any data moves: sequence number, op, dtype, shape,
and the kernel provider the rank computes with.

Ranks compare fingerprints before trusting each other's bytes, so a rank that skipped a
collective, called a different one, or passed a different shape gets an immediate
``CollectiveMismatchError`` instead of a hang or silently mixed-up data; so does a rank whose
kernels (``everyo.kernels.fingerprint()``: ``EVERYO_KERNELS``, the provider's version) differ,
since its replica of a data-parallel model would drift from the others' bit by bit. The
encoding is a fixed 112-byte ``struct`` (no pickle): backends can put it on a wire or in shared
memory as is.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from typing import NamedTuple, Sequence

import numpy as np

from everyo.kernels import KERNELS_ENV
from everyo.kernels import fingerprint as kernels_fingerprint
from everyo.kernels import kernel as _kernel_table
from everyo_dist.errors import CollectiveMismatchError, DistributedError

MAX_DIMS = 8
KERNELS_BYTES = 32
"""Room for the kernel fingerprint: printable ASCII, NUL-padded (longer texts are shortened
to a prefix plus a hash of the whole, so two different texts never look alike)."""

# seq (u64), op (u8), dtype code (u8), ndim (u8), pad, root (i32), MAX_DIMS dims (i64),
# kernel fingerprint (KERNELS_BYTES of ASCII)
_LAYOUT = struct.Struct(f"<QBBBxi{MAX_DIMS}q{KERNELS_BYTES}s")
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


def kernels_field(text: str) -> str:
    """``text`` as the fingerprint's kernel field: printable ASCII (anything else becomes
    ``?``), at most ``KERNELS_BYTES`` long; a longer text keeps a prefix and a hash of the
    whole.

    Example:
        >>> kernels_field("numba 0.68.1")
        'numba 0.68.1'
        >>> len(kernels_field("x" * 100)) == KERNELS_BYTES
        True
    """
    text = "".join(c if " " <= c <= "~" else "?" for c in str(text))
    if len(text) > KERNELS_BYTES:
        digest = hashlib.sha256(text.encode("ascii")).hexdigest()[:8]
        text = f"{text[:KERNELS_BYTES - 9]}~{digest}"
    return text


_current = [None, ""]  # the kernel selection last read, and its field


def current_kernels() -> str:
    """This process's kernel fingerprint (``everyo.kernels.fingerprint()``) as the fingerprint's
    field; read again whenever the selection changes (``EVERYO_KERNELS``, ``kernels.use``, a
    provider installed), otherwise one attribute read.

    Example:
        >>> import everyo.kernels as K
        >>> with K.use("numpy"):
        ...     current_kernels()
        'numpy'
    """
    chosen = _kernel_table.chosen
    if chosen is None or chosen is not _current[0]:
        text = kernels_field(kernels_fingerprint())
        _current[:] = _kernel_table.chosen, text
        return text
    return _current[1]


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
    kernels: str = ""  # the kernel provider (current_kernels()); "" in control frames

    @classmethod
    def of(cls, seq: int, op: CollectiveOp, array: np.ndarray | None = None,
           root: int = 0) -> "Fingerprint":
        """The fingerprint of collective number ``seq`` applied to ``array``, computed with
        this process's kernels."""
        if array is None:
            return cls(seq, op, None, None, root, current_kernels())
        dtype = array.dtype.name
        if dtype not in DTYPE_CODES:
            raise DistributedError(f"{op.label} does not support dtype {dtype}; supported: "
                                   f"{', '.join(DTYPE_CODES)}")
        if array.ndim > MAX_DIMS:
            raise DistributedError(f"{op.label} supports arrays of up to {MAX_DIMS} dimensions, "
                                   f"got shape {array.shape}; reshape it first")
        return cls(seq, op, dtype, tuple(int(d) for d in array.shape), root, current_kernels())

    def pack(self) -> bytes:
        """The fixed-size binary form (``FINGERPRINT_SIZE`` bytes)."""
        shape = self.shape or ()
        dims = list(shape) + [0] * (MAX_DIMS - len(shape))
        dtype_code = DTYPE_CODES[self.dtype] if self.dtype is not None else 0
        ndim = len(shape) if self.shape is not None else 255  # 255: no array
        kernels = self.kernels
        if not (len(kernels) <= KERNELS_BYTES and kernels.isascii() and kernels.isprintable()):
            raise DistributedError(f"a fingerprint's kernel field is printable ASCII of at most "
                                   f"{KERNELS_BYTES} characters (see kernels_field), got "
                                   f"{kernels!r}")
        return _LAYOUT.pack(self.seq, int(self.op), dtype_code, ndim, self.root, *dims,
                            kernels.encode("ascii"))

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> "Fingerprint":
        """Decode :meth:`pack`'s bytes; refuses anything malformed (it may come off a wire)."""
        if len(data) != FINGERPRINT_SIZE:
            raise DistributedError(f"a fingerprint is {FINGERPRINT_SIZE} bytes, got {len(data)}")
        seq, op, dtype_code, ndim, root, *dims, raw_kernels = _LAYOUT.unpack(data)
        try:
            op = CollectiveOp(op)
        except ValueError:
            raise DistributedError(f"unknown collective op code {op} in a fingerprint") from None
        kernels = raw_kernels.rstrip(b"\0")
        if not all(0x20 <= byte <= 0x7E for byte in kernels):
            raise DistributedError(f"malformed fingerprint: the kernel field {raw_kernels!r} is "
                                   f"not printable ASCII padded with NUL bytes")
        kernels = kernels.decode("ascii")
        if ndim == 255:
            return cls(seq, op, None, None, root, kernels)
        if ndim > MAX_DIMS or dtype_code not in DTYPE_NAMES or any(d < 0 for d in dims):
            raise DistributedError(f"malformed fingerprint (ndim={ndim}, dtype code={dtype_code})")
        return cls(seq, op, DTYPE_NAMES[dtype_code], tuple(dims[:ndim]), root, kernels)

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
            raise CollectiveMismatchError(mismatch_message(mine, rank, Fingerprint.unpack(other),
                                                           other_rank))


def mismatch_message(mine: Fingerprint, rank: int, theirs: Fingerprint | str,
                     other_rank: int) -> str:
    """What a ``CollectiveMismatchError`` says when rank ``other_rank`` announced ``theirs``
    (a :class:`Fingerprint`, or a description of unreadable bytes) where ``rank`` announced
    ``mine``.

    Example:
        >>> a = Fingerprint(3, CollectiveOp.BARRIER, kernels="numba 0.68.1")
        >>> message = mismatch_message(a, 0, a._replace(kernels="numpy"), 1)
        >>> message.split(";")[0]
        "rank 0 computes with kernels 'numba 0.68.1' but rank 1 with 'numpy'"
    """
    if isinstance(theirs, str):
        return f"rank {rank} called {mine.describe()} but rank {other_rank} called {theirs}"
    kernels = ""
    if theirs.kernels != mine.kernels:
        kernels = (f"rank {rank} computes with kernels {mine.kernels!r} but rank {other_rank} "
                   f"with {theirs.kernels!r}; set {KERNELS_ENV} the same on every rank "
                   f"(everyo.kernels.fingerprint() tells what a rank uses)")
        if theirs._replace(kernels=mine.kernels) == mine:
            return kernels
        kernels = f"; also, {kernels}"
    return (f"rank {rank} called {mine.describe()} but rank {other_rank} called "
            f"{theirs.describe()}{kernels}")
