"""How a worker's return value travels back to the ``spawn`` parent.

Arrays, numbers, strings, bytes, None and lists/tuples/dicts of them use a small tagged binary
format (arrays through ``numpy.lib.format`` with ``allow_pickle=False``), so the parent rebuilds
them without unpickling. Any other object falls back to pickle: acceptable only because the
bytes come from the parent's own child over a private pipe, never from a network.
"""

from __future__ import annotations

import io
import pickle
import struct

import numpy as np

_LENGTH = struct.Struct("<Q")


def _encode(value, out: io.BytesIO) -> None:
    if value is None:
        out.write(b"N")
    elif isinstance(value, bool):
        out.write(b"T" if value else b"F")
    elif isinstance(value, int) and -(2 ** 63) <= value < 2 ** 63:
        out.write(b"i" + struct.pack("<q", value))
    elif isinstance(value, float):
        out.write(b"f" + struct.pack("<d", value))
    elif isinstance(value, str):
        data = value.encode("utf-8")
        out.write(b"s" + _LENGTH.pack(len(data)) + data)
    elif isinstance(value, bytes):
        out.write(b"b" + _LENGTH.pack(len(value)) + value)
    elif isinstance(value, np.ndarray) and not value.dtype.hasobject:
        out.write(b"a")
        np.lib.format.write_array(out, value, allow_pickle=False)
    elif type(value) in (list, tuple):
        out.write((b"l" if type(value) is list else b"t") + _LENGTH.pack(len(value)))
        for item in value:
            _encode(item, out)
    elif type(value) is dict and all(isinstance(key, str) for key in value):
        out.write(b"d" + _LENGTH.pack(len(value)))
        for key, item in value.items():
            _encode(key, out)
            _encode(item, out)
    else:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(b"p" + _LENGTH.pack(len(data)) + data)


def encode(value) -> bytes:
    """Serialise a worker's return value.

    Example:
        >>> decode(encode([np.arange(3), {"loss": 0.5}]))
        [array([0, 1, 2]), {'loss': 0.5}]
    """
    out = io.BytesIO()
    _encode(value, out)
    return out.getvalue()


def _read(stream: io.BytesIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise ValueError("truncated worker result")
    return data


def _decode(stream: io.BytesIO):
    tag = _read(stream, 1)
    if tag == b"N":
        return None
    if tag in (b"T", b"F"):
        return tag == b"T"
    if tag == b"i":
        return struct.unpack("<q", _read(stream, 8))[0]
    if tag == b"f":
        return struct.unpack("<d", _read(stream, 8))[0]
    if tag in (b"s", b"b", b"p"):
        data = _read(stream, _LENGTH.unpack(_read(stream, 8))[0])
        return data.decode("utf-8") if tag == b"s" else data if tag == b"b" else pickle.loads(data)
    if tag == b"a":
        return np.lib.format.read_array(stream, allow_pickle=False)
    if tag in (b"l", b"t"):
        items = [_decode(stream) for _ in range(_LENGTH.unpack(_read(stream, 8))[0])]
        return items if tag == b"l" else tuple(items)
    if tag == b"d":
        count = _LENGTH.unpack(_read(stream, 8))[0]
        return {_decode(stream): _decode(stream) for _ in range(count)}
    raise ValueError(f"unknown tag {tag!r} in a worker result")


def decode(data: bytes):
    """Rebuild what :func:`encode` serialised."""
    return _decode(io.BytesIO(data))
