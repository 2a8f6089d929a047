"""The tcp backend's data plane: two persistent connections per rank arranged in a ring.

Rank ``r`` sends only to ``next = (r + 1) % n`` and receives only from ``prev = (r - 1) % n``,
each over its own connection, so one rank never reads and writes the same socket. Every step
of a collective sends its frames and receives its frames *at the same time* (non-blocking
sockets, one ``poll`` loop): two ranks both pushing 20 MB at each other would otherwise
deadlock on full kernel buffers. The all-reduce's schedules are in ``allreduce.py``.

Every received header is checked against the collective this rank is running (its
fingerprint), so a rank that called something else is named in a ``CollectiveMismatchError``
the moment its first frame arrives. Every data frame ends with a trailer that confirms it; when a
rank fails it pads any half-sent frame, marks it aborted, sends an ABORT frame with the reason
downstream and closes both connections, so the failure travels round the ring instead of
leaving peers waiting, and no rank ever completes a collective on a half-sent frame.
"""

from __future__ import annotations

import select
import ssl
import time

import numpy as np

from everyo_dist.backends.tcp.allreduce import all_reduce
from everyo_dist.backends.tcp.frames import (
    CONTROL_LIMIT,
    DTYPE_CODE_OF,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    FrameKind,
    ProtocolError,
    abort_frame,
    check_abort_document,
    decode_control,
    recv_exact,
    split_header,
    unpack_header,
)
from everyo_dist.backends.tcp.progress import (
    HEADER,
    PAYLOAD,
    TRAILER,
    TRAILER_ABORTED,
    TRAILER_OK,
    TRAILER_SIZE,
    Incoming,
    Outgoing,
    bytes_view,
)
from everyo_dist.contract import Collective
from everyo_dist.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DistributedError,
    PeerLostError,
)
from everyo_dist.fingerprint import Fingerprint, mismatch_message

_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_EMPTY = np.empty(0, dtype=np.uint8)
_NO_STEP = 0xFFFFFFFF  # a step no frame carries: reading on only to catch an ABORT
_ABORT_SECONDS = 2.0  # how long a failing rank tries to tell the next one why
_KINDS = frozenset(int(kind) for kind in FrameKind)
_RELAYED_ERRORS = {"CollectiveMismatchError": CollectiveMismatchError,
                   "CollectiveTimeoutError": CollectiveTimeoutError,
                   "PeerLostError": PeerLostError}


def _peer_host(sock) -> str:
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return "?"


def _own_host(sock) -> str:
    try:
        return str(sock.getsockname()[0])
    except OSError:
        return "?"


class Ring:
    """The send/receive connections of one rank, and the collectives built on them.

    Args:
        rank: this rank.
        size: the group's size (at least 2).
        to_next: connected, authenticated socket to rank ``(rank + 1) % size``.
        from_prev: connected, authenticated socket from rank ``(rank - 1) % size``.
        ranks: the group rank of each ring position, for messages, when the ring is a
            sub-group (the leaders' ring of ``tcp_hierarchical``); by default position = rank.

    Before each collective the transport sets :attr:`call` to the running
    :class:`~everyo_dist.contract.Collective` (its fingerprint, deadline and error builders).
    """

    def __init__(self, rank: int, size: int, to_next, from_prev, ranks=None):
        self.rank, self.size = rank, size
        # NOTE: errors built by the call (call.peer_lost_error, ...) map positions themselves;
        # only the text this class writes needs the group ranks
        self._rank_of = tuple(ranks) if ranks is not None else tuple(range(size))
        self.call: Collective | None = None
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.to_next, self.from_prev = to_next, from_prev
        for sock in (to_next, from_prev):
            sock.setblocking(False)
        self._outgoing: Outgoing | None = None  # the frames to next of the last pump
        self._hosts = {self.next: _peer_host(to_next), self.prev: _peer_host(from_prev),
                       self.rank: _own_host(to_next)}
        self._buffers: dict[str, np.ndarray] = {}
        self._packed, self._packed_for = b"", None  # the running collective's fingerprint
        self._gather_writes = not isinstance(to_next, ssl.SSLSocket)  # TLS has no sendmsg

    # -- collectives -----------------------------------------------------------------------
    def barrier(self) -> None:
        """``size - 1`` empty steps: after them every rank has heard from every other."""
        for step in range(self.size - 1):
            self.transfer(step, _EMPTY, np.empty(0, np.uint8))

    def all_reduce(self, flat: np.ndarray, mean: bool, out: np.ndarray) -> np.ndarray:
        """Sum (or average) ``flat`` over the ranks into ``out``, in rank order: see
        :mod:`everyo_dist.backends.tcp.allreduce`. ``out`` must not overlap ``flat``."""
        return all_reduce(self, flat, mean, out)

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

    def scratch_bytes(self) -> int:
        """Bytes of work buffers this ring keeps between collectives (bounded by one piece of
        an all-reduce: see ``allreduce.PIECE_BYTES``)."""
        return sum(buffer.nbytes for buffer in self._buffers.values())

    def scratch(self, name: str, dtype, length: int) -> np.ndarray:
        """A reusable work buffer: allocating (and page-faulting) tens of MB per call would
        cost as much as the transfer itself."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < length:
            buffer = self._buffers[name] = np.empty(length, dtype=dtype)
        return buffer[:length]

    # -- moving frames ---------------------------------------------------------------------
    def transfer(self, step: int, send: np.ndarray | None, recv: np.ndarray | None) -> None:
        """Send ``send`` to next while receiving into ``recv`` from prev (either may be None)."""
        self.pump([(step, send, None)] if send is not None else [],
                  [(step, recv)] if recv is not None else [])

    def pump(self, sends, recvs, work=None) -> None:
        """Send frames to next and receive frames from prev, in order, all at once.

        Args:
            sends: ``(step, array, ready)`` per outgoing frame; ``ready`` is None or a callable
                giving how many payload bytes may be sent so far (a frame computed while it
                is being sent).
            recvs: ``(step, array)`` per incoming frame; the payload lands in ``array``.
            work: optional ``work(received) -> bool``, called every round with the payload
                bytes received so far per incoming frame; returns whether it did something.
        """
        fingerprint = self.call.fingerprint
        if fingerprint is not self._packed_for:  # pack once per collective, not per step
            self._packed, self._packed_for = fingerprint.pack(), fingerprint
        outgoing = self._outgoing = Outgoing(sends, self._packed)
        incoming = Incoming(recvs)
        while not (outgoing.finished and incoming.finished):
            progressed = work(incoming.received) if work is not None else False
            views = outgoing.views()
            if views:
                try:
                    progressed = self._send(outgoing, views) or progressed
                except PeerLostError as error:
                    raise self._cause_upstream(incoming, error) from None
            if not incoming.finished:
                progressed = self._receive(incoming) or progressed
            if not progressed and (views or not incoming.finished):
                self._wait(bool(views), not incoming.finished)
        self._outgoing = None  # kept only for abort(); it holds views of the caller's arrays

    def _send(self, outgoing: "Outgoing", views: list) -> bool:
        """One non-blocking write of ``views`` to next; whether anything went out."""
        try:
            if self._gather_writes and len(views) > 1:  # one system call
                sent = self.to_next.sendmsg(views)
            else:
                sent = self.to_next.send(views[0])
        except _WOULD_BLOCK:
            return False
        except OSError as exc:
            raise self._link_error(self.next, f"sending to it failed ({exc})") from None
        if sent:
            outgoing.advance(sent)
        return bool(sent)

    def _cause_upstream(self, incoming: "Incoming", error: PeerLostError) -> Exception:
        """Sending to next failed. Next may have stopped because a rank further round the ring
        failed, whose ABORT is travelling towards this rank from prev: wait briefly for it, so
        the error names the rank that failed first rather than next (which only gave up)."""
        deadline = time.monotonic() + min(_ABORT_SECONDS, max(self.call.remaining(), 0.0))
        while time.monotonic() < deadline:
            if incoming.finished:  # read on: an ABORT header, if one comes
                incoming = Incoming([(_NO_STEP, _EMPTY)])
            try:
                if not self._receive(incoming):
                    poller = select.poll()
                    poller.register(self.from_prev, select.POLLIN)
                    poller.poll(50)
            except DistributedError as cause:
                relayed = getattr(cause, "relayed", False)
                if relayed and getattr(cause, "rank", None) != self.next:
                    return cause
                break  # prev broke too, or reports next itself: this rank's view says it
        return error

    def _receive(self, incoming: "Incoming") -> bool:
        """One non-blocking read from prev into the frame being received; whether anything
        was received or a frame completed."""
        target = incoming.target
        try:
            got = self.from_prev.recv_into(target) if len(target) else 0
        except _WOULD_BLOCK:
            got = None
        except OSError as exc:
            raise self._link_error(self.prev, f"its connection failed ({exc})") from None
        if got == 0 and len(target):
            raise self._link_error(self.prev, "it closed its connection mid-collective")
        if got:
            incoming.advance(got)
        if len(incoming.target):
            return bool(got)
        step, array = incoming.frames[incoming.index]
        if incoming.phase == HEADER:
            incoming.start_payload(self._check_header(incoming.header, step, array))
        elif incoming.phase == PAYLOAD:
            incoming.start_trailer()
        elif incoming.phase == TRAILER:
            self._check_trailer(incoming.trailer)
            incoming.next_frame()
            return True
        return bool(got)

    def _link_error(self, peer: int, what: str) -> PeerLostError:
        """The error for a broken connection, naming the link and its likely cause."""
        return self.call.peer_lost_error(
            peer, f"{what}: the link between rank {self._rank_of[self.rank]} "
                  f"({self._hosts[self.rank]}) and rank {self._rank_of[peer]} "
                  f"({self._hosts[peer]}) broke. Most likely rank {self._rank_of[peer]}'s "
                  f"process died or was stopped, or the network between the two hosts failed")

    def _check_trailer(self, raw: bytearray) -> None:
        """A frame counts only when its trailer says it is complete; an aborting sender
        pads its half-sent frame and marks it aborted, and its ABORT frame follows."""
        if raw == TRAILER_OK:
            return
        mine = self.call.fingerprint
        if raw == TRAILER_ABORTED:
            self.from_prev.setblocking(True)
            try:
                header = unpack_header(recv_exact(self.from_prev, HEADER_SIZE,
                                                  time.monotonic() + _ABORT_SECONDS, "ABORT"))
            except (OSError, ProtocolError) as exc:
                raise self.call.peer_lost_error(self.prev, f"it aborted ({exc})") from None
            if header.kind == FrameKind.ABORT:
                raise self._relayed_abort(header.payload_bytes)
        raise DistributedError(f"{mine.describe()}: rank {self._rank_of[self.prev]} sent a "
                               f"frame with an invalid trailer {bytes(raw)!r} (corrupted stream?)")

    def _wait(self, sending: bool, receiving: bool) -> None:
        remaining = self.call.remaining()
        if remaining <= 0:
            who = self.prev if receiving else self.next
            what = f"waiting for data from rank {self._rank_of[self.prev]}" if receiving \
                else f"rank {self._rank_of[self.next]} is not reading what this rank sends"
            raise self.call.timeout_error([who], what)
        if receiving and isinstance(self.from_prev, ssl.SSLSocket) and self.from_prev.pending():
            return  # decrypted bytes already buffered: select would not see them
        # poll, not select: select fails on descriptors above 1023 (a busy process has them)
        poller = select.poll()
        if receiving:
            poller.register(self.from_prev, select.POLLIN)
        if sending:
            poller.register(self.to_next, select.POLLOUT)
        poller.poll(min(remaining, 0.5) * 1000)

    def _check_header(self, raw: bytearray, step: int, recv: np.ndarray) -> memoryview | None:
        """Validate prev's header against this collective; return where its payload goes.

        The expected header is known exactly (same fingerprint bytes, this step, the payload
        size and dtype this rank computed), so anything else is refused before a payload byte
        is read; only a mismatch is decoded, to name what the other rank called.
        """
        mine = self.call.fingerprint
        (magic, version, kind, code, their_step, size), fingerprint = split_header(raw)
        if magic != MAGIC or version != VERSION or kind not in _KINDS:
            try:
                unpack_header(raw)
            except ProtocolError as exc:
                raise DistributedError(f"{mine.describe()}: rank {self._rank_of[self.prev]} "
                                       f"sent an invalid frame: {exc}") from None
        if kind == FrameKind.ABORT and size <= CONTROL_LIMIT:
            raise self._relayed_abort(size)
        if kind != FrameKind.DATA:
            raise DistributedError(f"{mine.describe()}: rank {self._rank_of[self.prev]} sent "
                                   f"an unexpected frame (kind {kind}, {size} bytes)")
        if fingerprint != self._packed:
            try:
                theirs = Fingerprint.unpack(fingerprint)
            except DistributedError as exc:
                theirs = f"something unreadable ({exc})"
            raise CollectiveMismatchError(mismatch_message(mine, self._rank_of[self.rank], theirs,
                                                           self._rank_of[self.prev]))
        if their_step != step or code != DTYPE_CODE_OF[recv.dtype] or size != recv.nbytes:
            raise DistributedError(
                f"{mine.describe()}: rank {self._rank_of[self.prev]} sent step {their_step} "
                f"with {size} bytes (dtype code {code}), expected step {step} with {recv.nbytes} bytes of "
                f"{recv.dtype.name} (corrupted stream?)")
        return bytes_view(recv) if recv.nbytes else None

    def _relayed_abort(self, size: int) -> Exception:
        """Turn an ABORT frame from prev into the error it reports (its class kept)."""
        mine = self.call.fingerprint
        try:
            self.from_prev.setblocking(True)
            document = check_abort_document(
                decode_control(recv_exact(self.from_prev, size, time.monotonic() + 2.0,
                                          "the abort reason")), self.size)
        except (OSError, ProtocolError) as exc:
            return self.call.peer_lost_error(self.prev, f"it aborted ({exc})")
        message = f"{document['message']} (relayed by rank {self._rank_of[self.prev]})"
        kind = _RELAYED_ERRORS.get(document.get("error"), DistributedError)
        if kind is PeerLostError:
            error = PeerLostError(message, document.get("rank"))
        elif kind is CollectiveTimeoutError:
            error = CollectiveTimeoutError(message, document.get("missing_ranks", []))
        else:
            if kind is DistributedError:
                origin = document.get("origin")
                message = f"{mine.describe() if mine else 'collective'}: rank " \
                          f"{self._rank_of[self.prev if origin is None else origin]} failed: " \
                          f"{message}"
            error = kind(message)
        error.relayed = True  # another rank's failure, not this rank's view of its links
        return error

    # -- teardown --------------------------------------------------------------------------
    def abort(self, error: BaseException) -> None:
        """Tell next why this rank gives up, then close both ends.

        A frame to next may be half sent; its header is completed as it was, its payload
        padded with zeros and its trailer marks it aborted (so next never uses it), then the
        ABORT frame follows: the reason reaches the rest of the ring instead of a bare
        "connection closed" that would blame this rank.
        """
        if self.size > 1:
            document = {"error": type(error).__name__, "message": str(error),
                        "origin": self.rank, "rank": getattr(error, "rank", None),
                        "missing_ranks": list(getattr(error, "missing_ranks", ()))}
            try:
                self.to_next.setblocking(True)
                self.to_next.settimeout(_ABORT_SECONDS)
                header, body, trailer = self._outgoing.unsent() if self._outgoing \
                    else (b"", 0, 0)
                if header or body or trailer == TRAILER_SIZE:  # mid-frame: pad it, mark it
                    # NOTE: the header as it was (zeros there would read as another
                    # collective's fingerprint, a false CollectiveMismatchError), then zeros
                    self.to_next.sendall(header)
                    filler = bytes(min(body, 1 << 20))
                    deadline = time.monotonic() + _ABORT_SECONDS
                    while body > 0 and time.monotonic() < deadline:
                        body -= self.to_next.send(filler[:body])
                    if body <= 0:
                        self.to_next.sendall(TRAILER_ABORTED)
                        trailer = 0
                if body <= 0 and trailer == 0:
                    self.to_next.sendall(abort_frame(document))
            except (OSError, TypeError, ValueError):
                pass
        self.close()

    def close(self) -> None:
        for sock in (self.to_next, self.from_prev):
            try:
                sock.close()
            except OSError:
                pass
