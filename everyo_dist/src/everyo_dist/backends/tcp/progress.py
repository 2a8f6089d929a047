"""Progress through the frames one ``Ring.pump`` call sends and receives: which frame, which
part of it (header, payload, trailer), and how many bytes of it have moved."""

from __future__ import annotations

import numpy as np

from everyo_dist.backends.tcp.frames import DTYPE_CODE_OF, HEADER_SIZE, pack_data_header

# Every DATA frame ends with a trailer: complete, or aborted by a sender that failed mid-frame.
TRAILER_OK, TRAILER_ABORTED = b"EOTE\x01\x00\x00\x00", b"EOTE\x02\x00\x00\x00"
TRAILER_SIZE = len(TRAILER_OK)
HEADER, PAYLOAD, TRAILER = 0, 1, 2  # what the receiver is reading


def bytes_view(array: np.ndarray) -> memoryview:
    # through a uint8 view: the buffer protocol has no format for ml_dtypes' bfloat16
    return memoryview(array.view(np.uint8)) if array.size else memoryview(b"")



class Outgoing:
    """The frames being sent to next, and how much of the current one has gone out."""

    __slots__ = ("frames", "packed", "index", "header", "payload", "sent", "trailer",
                 "available")

    def __init__(self, frames, packed: bytes):
        self.frames, self.packed, self.index = frames, packed, 0
        self.header = None  # the current frame's unsent header (None: not started)
        self.payload, self.sent, self.trailer, self.available = memoryview(b""), 0, None, 0

    @property
    def finished(self) -> bool:
        return self.index >= len(self.frames)

    def views(self) -> list:
        """What may be written now: rest of the header, ready payload, trailer when due."""
        if self.finished:
            return []
        step, array, ready = self.frames[self.index]
        if self.header is None:
            self.payload = bytes_view(array)
            self.header = memoryview(pack_data_header(DTYPE_CODE_OF[array.dtype], array.nbytes,
                                                      self.packed, step))
            self.trailer, self.sent = memoryview(TRAILER_OK), 0
        self.available = len(self.payload) if ready is None else ready()
        views = [self.header] if len(self.header) else []
        if self.available > self.sent:
            views.append(self.payload[self.sent:self.available])
        if self.available == len(self.payload):
            views.append(self.trailer)
        return views

    def advance(self, sent: int) -> None:
        """Account for ``sent`` bytes written, header first, then payload, then trailer."""
        take = min(sent, len(self.header))
        self.header, sent = self.header[take:], sent - take
        take = min(sent, self.available - self.sent)
        self.sent, sent = self.sent + take, sent - take
        self.trailer = self.trailer[sent:]
        if not len(self.trailer):
            self.index, self.header = self.index + 1, None

    def unsent(self) -> tuple[bytes, int, int]:
        """(the rest of the header, payload bytes, trailer bytes) of the current frame not
        yet sent."""
        if self.header is None:
            return b"", 0, 0
        return bytes(self.header), len(self.payload) - self.sent, len(self.trailer)


class Incoming:
    """The frames being received from prev: which one, which part of it, how many bytes."""

    __slots__ = ("frames", "index", "header", "trailer", "target", "phase", "received")

    def __init__(self, frames):
        self.frames, self.index = frames, 0
        self.header, self.trailer = bytearray(HEADER_SIZE), bytearray(TRAILER_SIZE)
        self.target, self.phase = memoryview(self.header), HEADER
        self.received = [0] * len(frames)

    @property
    def finished(self) -> bool:
        return self.index >= len(self.frames)

    def advance(self, got: int) -> None:
        self.target = self.target[got:]
        if self.phase == PAYLOAD:
            # the last byte only counts once the trailer confirms the frame, so nothing
            # computed from an aborted frame is ever passed on as final
            limit = max(self.frames[self.index][1].nbytes - 1, 0)
            self.received[self.index] = min(self.received[self.index] + got, limit)

    def start_payload(self, destination: memoryview | None) -> None:
        """The header checked out: read the payload into ``destination`` (None: empty)."""
        if destination is None or not len(destination):
            self.start_trailer()
        else:
            self.phase, self.target = PAYLOAD, destination

    def start_trailer(self) -> None:
        self.phase, self.target = TRAILER, memoryview(self.trailer)

    def next_frame(self) -> None:
        self.received[self.index] = self.frames[self.index][1].nbytes
        self.index += 1
        self.phase, self.target = HEADER, memoryview(self.header)
