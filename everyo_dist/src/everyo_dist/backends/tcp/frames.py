"""The tcp backend's wire format: fixed-size binary headers followed by raw array bytes.

Every frame starts with a 132-byte header::

    magic "EOTC" | version u8 | kind u8 | payload dtype u8 | pad | step u32 | payload bytes u64
    | fingerprint (112 bytes: sequence number, op, dtype, shape, root, kernel provider — see
      ``fingerprint.py``)

and is followed by exactly ``payload bytes`` of raw little-endian array data (or UTF-8 JSON for
the few control frames). DATA frames end with an 8-byte trailer saying whether the sender
completed the frame or gave up half way (``ring.py``). Nothing on the wire is ever unpickled or
evaluated: a header is ``struct``-decoded and validated field by field, and the payload size
must agree with the shape the header announces, so a peer cannot make a receiver allocate or
read more than the collective it claims to be part of needs.
"""

from __future__ import annotations

import enum
import json
import struct
import time
from typing import NamedTuple

import numpy as np

from everyo_dist.errors import DistributedError
from everyo_dist.fingerprint import DTYPE_CODES, DTYPE_NAMES, FINGERPRINT_SIZE, CollectiveOp, Fingerprint

MAGIC = b"EOTC"
VERSION = 3  # 2: the ring all-reduce sums in rank order (raw rows, several frames per step);
#             3: the fingerprint carries the kernel provider
_PREFIX = struct.Struct("<4sBBBxIQ")
HEADER_SIZE = _PREFIX.size + FINGERPRINT_SIZE
# Control frames (registration, peer table, abort reasons) are small JSON documents.
CONTROL_LIMIT = 64 * 1024
# A data frame carries at most the announced array, widened to float64 (ring partial sums).
_WIDEST_ITEMSIZE = 8
_NO_FINGERPRINT = Fingerprint(0, CollectiveOp.BARRIER)


class ProtocolError(DistributedError):
    """A peer sent bytes that are not a valid frame; the connection is dropped."""


class FrameKind(enum.IntEnum):
    """What a frame carries; unknown kinds are refused."""

    DATA = 1      # one step of a collective: an array chunk
    ABORT = 2     # the sender gave up on the collective; payload: JSON reason
    REGISTER = 3  # worker -> rendezvous: JSON {"rank", "world_size", "port"}
    PEERS = 4     # rendezvous -> worker: JSON {"peers": [[host, port], ...]}
    IDENTIFY = 5  # worker -> worker after the handshake: JSON {"rank"}


CONTROL_KINDS = (FrameKind.ABORT, FrameKind.REGISTER, FrameKind.PEERS, FrameKind.IDENTIFY)


class FrameHeader(NamedTuple):
    """A decoded, validated header."""

    kind: FrameKind
    payload_dtype: str | None
    step: int
    payload_bytes: int
    fingerprint: Fingerprint


DTYPE_CODE_OF = {np.dtype(name): code for name, code in DTYPE_CODES.items()}
"""Wire dtype code by ``np.dtype`` (a dict lookup: ``dtype.name`` costs microseconds)."""
BFLOAT16_CODE = 13  # compressed reductions only (wire_dtype="bfloat16"); needs ml_dtypes
try:
    import ml_dtypes

    DTYPE_CODE_OF[np.dtype(ml_dtypes.bfloat16)] = BFLOAT16_CODE
except ImportError:  # pragma: no cover - bfloat16 compression is then refused up front
    pass


def pack_data_header(payload_code: int, payload_bytes: int, fingerprint: bytes,
                     step: int) -> bytes:
    """The hot-path header of a DATA frame, from already-packed parts."""
    return _PREFIX.pack(MAGIC, VERSION, FrameKind.DATA, payload_code, step,
                        payload_bytes) + fingerprint


def split_header(raw) -> tuple:
    """``(magic, version, kind, dtype code, step, payload bytes)`` and the fingerprint bytes,
    undecoded: the receiver compares them with what it expects before decoding anything."""
    return _PREFIX.unpack_from(raw), bytes(raw[_PREFIX.size:])


def pack_header(kind: FrameKind, payload_dtype: str | None, payload_bytes: int,
                fingerprint: Fingerprint = _NO_FINGERPRINT, step: int = 0) -> bytes:
    """Encode a header.

    Example:
        >>> raw = pack_header(FrameKind.IDENTIFY, "uint8", 10)
        >>> len(raw) == HEADER_SIZE, unpack_header(raw).payload_bytes
        (True, 10)
    """
    code = DTYPE_CODES[payload_dtype] if payload_dtype is not None else 0
    return _PREFIX.pack(MAGIC, VERSION, int(kind), code, step, payload_bytes) + fingerprint.pack()


def unpack_header(raw: bytes | bytearray | memoryview) -> FrameHeader:
    """Decode and validate a header; any inconsistency raises ``ProtocolError``.

    Example:
        >>> unpack_header(b"GET / HTTP/1.1" + bytes(118))
        Traceback (most recent call last):
        ...
        everyo_dist.backends.tcp.frames.ProtocolError: bad frame magic b'GET ' (not an EveryO tcp peer?)
    """
    if len(raw) != HEADER_SIZE:
        raise ProtocolError(f"a frame header is {HEADER_SIZE} bytes, got {len(raw)}")
    magic, version, kind, code, step, size = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r} (not an EveryO tcp peer?)")
    if version != VERSION:
        raise ProtocolError(f"frame version {version} is not supported (this side speaks "
                            f"{VERSION}); run the same everyo-dist version on every node")
    try:
        kind = FrameKind(kind)
    except ValueError:
        raise ProtocolError(f"unknown frame kind {kind}") from None
    if code != 0 and code not in DTYPE_NAMES:
        raise ProtocolError(f"unknown payload dtype code {code}")
    dtype = DTYPE_NAMES.get(code)
    try:
        fingerprint = Fingerprint.unpack(bytes(raw[_PREFIX.size:]))
    except DistributedError as exc:
        raise ProtocolError(f"bad frame fingerprint: {exc}") from None
    if kind in CONTROL_KINDS:
        limit, itemsize = CONTROL_LIMIT, 1
        if dtype not in (None, "uint8"):
            raise ProtocolError(f"{kind.name} frames carry bytes, not {dtype}")
    else:
        itemsize = np.dtype(dtype).itemsize if dtype else 1
        limit = (fingerprint.nbytes // max(np.dtype(fingerprint.dtype).itemsize, 1)
                 * _WIDEST_ITEMSIZE) if fingerprint.dtype else 0
    if size > limit:
        raise ProtocolError(f"{kind.name} frame announces {size} payload bytes, more than the "
                            f"{limit} its header allows")
    if size % itemsize:
        raise ProtocolError(f"{size} payload bytes is not a whole number of {dtype} items")
    if dtype is None and size:
        raise ProtocolError("a frame with a payload must name the payload dtype")
    return FrameHeader(kind, dtype, step, size, fingerprint)


def control_frame(kind: FrameKind, document: dict) -> bytes:
    """A whole control frame: header plus a JSON payload."""
    payload = json.dumps(document, separators=(",", ":")).encode()
    if len(payload) > CONTROL_LIMIT:
        raise DistributedError(f"{kind.name} message too large ({len(payload)} bytes)")
    return pack_header(kind, "uint8", len(payload)) + payload


#: The longest ABORT reason sent, in characters: JSON may spell a character in up to 12 bytes
#: (a surrogate pair), so a reason this long always fits in ``CONTROL_LIMIT``.
MAX_REASON_CHARS = 4096


def abort_frame(document: dict) -> bytes:
    """A whole ABORT frame for ``document``, its ``message`` shortened to ``MAX_REASON_CHARS``:
    a reason relayed from a peer may already be as long as a frame allows, and the prefix a
    relaying rank adds must not make its own ABORT unsendable.

    Example:
        >>> len(abort_frame({"message": "x" * CONTROL_LIMIT})) < HEADER_SIZE + CONTROL_LIMIT
        True
    """
    message = document.get("message")
    if isinstance(message, str) and len(message) > MAX_REASON_CHARS:
        cut = len(message) - MAX_REASON_CHARS
        document = {**document, "message": f"{message[:MAX_REASON_CHARS]} [... {cut} more "
                                           f"characters]"}
    return control_frame(FrameKind.ABORT, document)


def parse_control(header: FrameHeader, payload: bytes, expected: FrameKind) -> dict:
    """Decode a control frame's JSON payload, refusing anything but an object of ``expected``."""
    if header.kind == FrameKind.ABORT and expected != FrameKind.ABORT:
        reason = decode_control(payload).get("message")
        raise DistributedError(reason if isinstance(reason, str) else "(no reason given)")
    if header.kind != expected:
        raise ProtocolError(f"expected a {expected.name} frame, got {header.kind.name}")
    return decode_control(payload)


MAX_JSON_DEPTH = 4  # our documents nest at most 3 levels (the peer table's list of pairs)


def _nesting_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text, found without parsing it (a parser
    recurses, so a hostile ``[[[[...`` would exhaust the stack before we could refuse it)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def decode_control(payload: bytes) -> dict:
    """A control frame's JSON object: at most ``CONTROL_LIMIT`` bytes and ``MAX_JSON_DEPTH``
    levels deep, else ``ProtocolError``.

    Example:
        >>> decode_control(b'{"rank": 1}')
        {'rank': 1}
    """
    if len(payload) > CONTROL_LIMIT:
        raise ProtocolError(f"control frame payload of {len(payload)} bytes exceeds "
                            f"{CONTROL_LIMIT}")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("control frame payload is not UTF-8 JSON") from None
    if _nesting_depth(text) > MAX_JSON_DEPTH:
        raise ProtocolError(f"control frame payload nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        document = json.loads(text)
    except ValueError:
        raise ProtocolError("control frame payload is not UTF-8 JSON") from None
    if not isinstance(document, dict):
        raise ProtocolError("control frame payload is not a JSON object")
    return document




def recv_exact(sock, size: int, deadline: float, what: str = "data") -> bytes:
    """Read exactly ``size`` bytes from a blocking socket before ``deadline`` (monotonic)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out waiting for {what}")
        sock.settimeout(remaining)
        try:
            count = sock.recv_into(view[got:])
        except TimeoutError:
            raise TimeoutError(f"timed out waiting for {what}") from None
        if count == 0:
            raise ConnectionError(f"connection closed while waiting for {what} "
                                  f"({got} of {size} bytes received)")
        got += count
    return bytes(buffer)


def read_control(sock, deadline: float, expected: FrameKind) -> dict:
    """Read one control frame of kind ``expected`` from a blocking socket and decode it."""
    header = unpack_header(recv_exact(sock, HEADER_SIZE, deadline, f"a {expected.name} frame"))
    if header.kind not in CONTROL_KINDS:
        raise ProtocolError(f"expected a {expected.name} frame, got {header.kind.name}")
    payload = recv_exact(sock, header.payload_bytes, deadline, f"a {expected.name} payload")
    return parse_control(header, payload, expected)


def check_abort_document(document: dict, world_size: int) -> dict:
    """An ABORT frame's fields, each checked: a string reason, ranks inside the group.

    Raises:
        ProtocolError: naming the first field that is not what a rank of this job sends.

    Example:
        >>> check_abort_document({"message": "boom", "origin": 1}, 2)["origin"]
        1
        >>> check_abort_document({"message": "boom", "rank": 7}, 2)
        Traceback (most recent call last):
        ...
        everyo_dist.backends.tcp.frames.ProtocolError: ABORT field 'rank' is 7, not a rank in 0..1
    """
    if not isinstance(document.get("message"), str):
        raise ProtocolError(f"ABORT reason must be a string, got "
                            f"{type(document.get('message')).__name__}")
    if not isinstance(document.get("error", ""), str):
        raise ProtocolError("ABORT field 'error' must be a string")

    def is_rank(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < world_size

    for field in ("origin", "rank"):
        value = document.get(field)
        if value is not None and not is_rank(value):
            raise ProtocolError(f"ABORT field {field!r} is {value!r}, not a rank in "
                                f"0..{world_size - 1}")
    missing = document.get("missing_ranks", [])
    if not isinstance(missing, list) or len(missing) > world_size \
            or not all(is_rank(r) for r in missing):
        raise ProtocolError(f"ABORT field 'missing_ranks' must list ranks in "
                            f"0..{world_size - 1}")
    return document


def check_peer_table(document: dict, world_size: int) -> list[tuple[str, int]]:
    """A PEERS frame's table, checked: one ``[host, port]`` pair per rank, each a non-empty
    host string and a port in 1..65535.

    Raises:
        ProtocolError: naming what is wrong with the table.

    Example:
        >>> check_peer_table({"peers": [["127.0.0.1", 5000], ["127.0.0.1", 5001]]}, 2)
        [('127.0.0.1', 5000), ('127.0.0.1', 5001)]
        >>> try:
        ...     check_peer_table({"peers": [["127.0.0.1", 5000]]}, 2)
        ... except ProtocolError as error:
        ...     print(error)
        the peer table must list 2 [host, port] pairs, got [['127.0.0.1', 5000]]
    """
    peers = document.get("peers")

    def is_pair(entry) -> bool:
        return isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) \
            and bool(entry[0]) and isinstance(entry[1], int) \
            and not isinstance(entry[1], bool) and 0 < entry[1] < 65536

    if not isinstance(peers, list) or len(peers) != world_size \
            or not all(is_pair(entry) for entry in peers):
        raise ProtocolError(f"the peer table must list {world_size} [host, port] pairs, got "
                            f"{peers!r:.200}")
    return [(host, port) for host, port in peers]
