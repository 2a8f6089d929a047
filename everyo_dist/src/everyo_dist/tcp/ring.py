"""The tcp backend's data plane: two persistent connections per rank arranged in a ring.

Rank ``r`` sends only to ``next = (r + 1) % n`` and receives only from ``prev = (r - 1) % n``,
each over its own connection, so one rank never reads and writes the same socket. Every step
of a collective sends one frame and receives one frame *at the same time* (non-blocking
sockets, one ``select`` loop): two ranks both pushing 20 MB at each other would otherwise
deadlock on full kernel buffers.

Every received header is checked against the collective this rank is running (its
fingerprint), so a rank that called something else is named in a ``CollectiveMismatchError``
the moment its first frame arrives. When a rank fails it sends an ABORT frame downstream (if it
is between frames) and closes both connections, so the failure travels round the ring instead
of leaving peers waiting.
"""

from __future__ import annotations

import json
import select
import ssl
import time

import numpy as np

from everyo_dist.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DistributedError,
    PeerLostError,
)
from everyo_dist.tcp.frames import (
    HEADER_SIZE,
    FrameKind,
    ProtocolError,
    control_frame,
    pack_header,
    recv_exact,
    unpack_header,
)

_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_EMPTY = np.empty(0, dtype=np.uint8)
_RELAYED_ERRORS = {"CollectiveMismatchError": CollectiveMismatchError,
                   "CollectiveTimeoutError": CollectiveTimeoutError,
                   "PeerLostError": PeerLostError}


def chunk_bounds(count: int, parts: int) -> list[int]:
    """Start offsets of ``parts`` nearly equal chunks of ``count`` items, plus the end.

    Example:
        >>> chunk_bounds(10, 3)
        [0, 4, 7, 10]
    """
    base, extra = divmod(count, parts)
    bounds = [0]
    for index in range(parts):
        bounds.append(bounds[-1] + base + (1 if index < extra else 0))
    return bounds


def _bytes_view(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B") if array.size else memoryview(b"")


_BLOCK = 32768  # float64 items: the reduction's working set stays in L2 cache


def _finish(partial: np.ndarray, own: np.ndarray, divisor: int, out: np.ndarray) -> None:
    """``out = cast((partial + own) / divisor)`` computed in float64, block by block."""
    acc = np.empty(min(_BLOCK, out.size), dtype=np.float64)
    for start in range(0, out.size, _BLOCK):
        stop = min(start + _BLOCK, out.size)
        block = acc[:stop - start]
        np.add(partial[start:stop], own[start:stop], out=block, dtype=np.float64)
        if divisor != 1:
            np.divide(block, divisor, out=block)
        np.copyto(out[start:stop], block, casting="unsafe")


class Ring:
    """The send/receive connections of one rank, and the collectives built on them.

    Args:
        group: the owning ``TCPProcessGroup`` (for its rank, current fingerprint, deadline and
            error builders).
        to_next: connected, authenticated socket to rank ``(rank + 1) % world_size``.
        from_prev: connected, authenticated socket from rank ``(rank - 1) % world_size``.
    """

    def __init__(self, group, to_next, from_prev):
        self.group = group
        self.rank, self.size = group.rank, group.world_size
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.to_next, self.from_prev = to_next, from_prev
        for sock in (to_next, from_prev):
            sock.setblocking(False)
        self._between_frames = True  # False while a frame to next is half sent
        self._buffers: dict[str, np.ndarray] = {}
        self._gather_writes = False

    # -- collectives -----------------------------------------------------------------------
    def barrier(self) -> None:
        """``size - 1`` empty steps: after them every rank has heard from every other."""
        for step in range(self.size - 1):
            self.transfer(step, _EMPTY, np.empty(0, np.uint8))

    def all_reduce(self, flat: np.ndarray, mean: bool) -> np.ndarray:
        """Ring reduce-scatter in float64, then ring all-gather of the finished chunks.

        Chunk ``c`` starts on rank ``c`` and collects one addend per hop, so it is summed
        exactly once, on its owner ``c - 1``, and copied everywhere else: bit-identical on all
        ranks. The first hop carries the caller's dtype, later hops float64 partial sums.
        """
        out = np.empty_like(flat)
        bounds = chunk_bounds(flat.size, self.size)
        widest = max(b - a for a, b in zip(bounds, bounds[1:]))
        incoming_raw = self._scratch("raw", flat.dtype, widest)
        if self.size > 2:
            acc = self._scratch("acc", np.float64, widest)
            incoming_f64 = self._scratch("f64", np.float64, widest)

        def chunk(array, index):
            return array[bounds[index]:bounds[index + 1]]

        last = self.size - 2
        for step in range(self.size - 1):
            send_index, recv_index = (self.rank - step) % self.size, (self.rank - step - 1) % self.size
            length = bounds[recv_index + 1] - bounds[recv_index]
            if step == 0:
                outgoing = chunk(flat, send_index)
            else:
                outgoing = acc[:bounds[send_index + 1] - bounds[send_index]]
            incoming = (incoming_raw if step == 0 else incoming_f64)[:length]
            self.transfer(step, outgoing, incoming)
            if step < last:
                np.add(incoming, chunk(flat, recv_index), out=acc[:length], dtype=np.float64)
            else:  # the chunk this rank owns is complete: finish it straight into ``out``
                owned = recv_index
                _finish(incoming, chunk(flat, owned), self.size if mean else 1, chunk(out, owned))
        offset = self.size - 1
        for step in range(self.size - 1):
            send_index, recv_index = (owned - step) % self.size, (owned - step - 1) % self.size
            self.transfer(offset + step, chunk(out, send_index), chunk(out, recv_index))
        return out

    def broadcast(self, flat: np.ndarray, src: int) -> np.ndarray:
        """Pass ``src``'s array round the ring; the rank before ``src`` does not forward it."""
        if self.rank == src:
            self.transfer(0, flat, None)
            return flat.copy()
        out = np.empty_like(flat)
        self.transfer(0, None, out)
        if self.next != src:
            self.transfer(0, out, None)
        return out

    def all_gather(self, flat: np.ndarray) -> np.ndarray:
        """Ring all-gather: each step forwards the row received in the previous one."""
        out = np.empty((self.size, flat.size), dtype=flat.dtype)
        out[self.rank] = flat
        for step in range(self.size - 1):
            self.transfer(step, out[(self.rank - step) % self.size],
                          out[(self.rank - step - 1) % self.size])
        return out

    def _scratch(self, name: str, dtype, length: int) -> np.ndarray:
        """A reusable work buffer: allocating (and page-faulting) tens of MB per call would
        cost as much as the transfer itself."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < length:
            buffer = self._buffers[name] = np.empty(length, dtype=dtype)
        return buffer[:length]

    # -- one step --------------------------------------------------------------------------
    def transfer(self, step: int, send: np.ndarray | None, recv: np.ndarray | None) -> None:
        """Send ``send`` to next while receiving into ``recv`` from prev (either may be None)."""
        fingerprint = self.group._current
        pending = []
        if send is not None:
            header = pack_header(FrameKind.DATA, send.dtype.name, send.nbytes, fingerprint, step)
            pending = [memoryview(header), _bytes_view(send)]
            self._between_frames = False
        header_buffer = bytearray(HEADER_SIZE)
        target = memoryview(header_buffer) if recv is not None else None
        reading_header = True
        while pending or target is not None:
            progressed = False
            if pending:
                try:
                    if self._gather_writes:  # header and payload in one system call
                        sent = self.to_next.sendmsg(pending)
                    else:
                        sent = self.to_next.send(pending[0])
                except _WOULD_BLOCK:
                    sent = 0
                except OSError as exc:
                    raise self.group._peer_lost_error(
                        self.next, f"sending to it failed ({exc}); it probably died") from None
                if sent:
                    progressed = True
                    while sent:
                        taken = min(sent, len(pending[0]))
                        pending[0] = pending[0][taken:]
                        sent -= taken
                        if not len(pending[0]):
                            pending.pop(0)
                    while pending and not len(pending[0]):
                        pending.pop(0)
                    if not pending:
                        self._between_frames = True
            if target is not None:
                try:
                    got = self.from_prev.recv_into(target)
                except _WOULD_BLOCK:
                    got = None
                except OSError as exc:
                    raise self.group._peer_lost_error(
                        self.prev, f"its connection failed ({exc}); it probably died") from None
                if got == 0 and len(target):
                    raise self.group._peer_lost_error(
                        self.prev, "it closed its connection mid-collective; it probably died")
                if got:
                    progressed = True
                    target = target[got:]
                if target is not None and not len(target):
                    if reading_header:
                        reading_header = False
                        target = self._check_header(header_buffer, step, recv)
                    else:
                        target = None
            if not progressed and (pending or target is not None):
                self._wait(bool(pending), target is not None)

    def _wait(self, sending: bool, receiving: bool) -> None:
        remaining = self.group._remaining()
        if remaining <= 0:
            who = self.prev if receiving else self.next
            what = f"waiting for data from rank {self.prev}" if receiving else \
                f"rank {self.next} is not reading what this rank sends"
            raise self.group._timeout_error([who], what)
        if receiving and isinstance(self.from_prev, ssl.SSLSocket) and self.from_prev.pending():
            return  # decrypted bytes already buffered: select would not see them
        select.select([self.from_prev] if receiving else [], [self.to_next] if sending else [],
                      [], min(remaining, 0.5))

    def _check_header(self, raw: bytearray, step: int, recv: np.ndarray) -> memoryview | None:
        """Validate prev's header against this collective; return where its payload goes."""
        mine = self.group._current
        try:
            header = unpack_header(raw)
        except ProtocolError as exc:
            raise DistributedError(f"{mine.describe()}: rank {self.prev} sent an invalid "
                                   f"frame: {exc}") from None
        if header.kind == FrameKind.ABORT:
            raise self._relayed_abort(header.payload_bytes)
        if header.kind != FrameKind.DATA:
            raise DistributedError(f"{mine.describe()}: rank {self.prev} sent an unexpected "
                                   f"{header.kind.name} frame")
        if header.fingerprint != mine:
            raise CollectiveMismatchError(
                f"rank {self.rank} called {mine.describe()} but rank {self.prev} called "
                f"{header.fingerprint.describe()}")
        if header.step != step or header.payload_dtype != recv.dtype.name \
                or header.payload_bytes != recv.nbytes:
            raise DistributedError(
                f"{mine.describe()}: rank {self.prev} sent step {header.step} with "
                f"{header.payload_bytes} bytes of {header.payload_dtype}, expected step {step} "
                f"with {recv.nbytes} bytes of {recv.dtype.name} (corrupted stream?)")
        return _bytes_view(recv) if recv.nbytes else None

    def _relayed_abort(self, size: int) -> Exception:
        """Turn an ABORT frame from prev into the error it reports (its class kept)."""
        mine = self.group._current
        try:
            self.from_prev.setblocking(True)
            document = json.loads(recv_exact(self.from_prev, size, time.monotonic() + 2.0,
                                             "the abort reason"))
        except (OSError, ValueError) as exc:
            return self.group._peer_lost_error(self.prev, f"it aborted ({exc})")
        message = f"{document.get('message', '?')} (relayed by rank {self.prev})"
        kind = _RELAYED_ERRORS.get(document.get("error"), DistributedError)
        if kind is PeerLostError:
            return PeerLostError(message, document.get("rank"))
        if kind is CollectiveTimeoutError:
            return CollectiveTimeoutError(message, document.get("missing_ranks", ()))
        if kind is DistributedError:
            message = f"{mine.describe() if mine else 'collective'}: rank " \
                      f"{document.get('origin', self.prev)} failed: {message}"
        return kind(message)

    # -- teardown --------------------------------------------------------------------------
    def abort(self, error: BaseException) -> None:
        """Tell next why this rank gives up (when between frames), then close both ends."""
        if self._between_frames and self.size > 1:
            document = {"error": type(error).__name__, "message": str(error),
                        "origin": self.rank, "rank": getattr(error, "rank", None),
                        "missing_ranks": list(getattr(error, "missing_ranks", ()))}
            try:
                self.to_next.setblocking(True)
                self.to_next.settimeout(1.0)
                self.to_next.sendall(control_frame(FrameKind.ABORT, document))
            except (OSError, TypeError, ValueError):
                pass
        self.close()

    def close(self) -> None:
        for sock in (self.to_next, self.from_prev):
            try:
                sock.close()
            except OSError:
                pass
