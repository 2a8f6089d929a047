"""``eo.save`` / ``eo.load``: nested dicts/lists of arrays in a plain ``.npz``, never pickle.

The tree's structure (keys, lists, scalars, strings) is stored as a JSON document inside the
archive; every array is its own ``.npy`` member. Loading uses ``allow_pickle=False``, so a
checkpoint from anywhere can be opened without running code.

A dtype that ``.npy`` cannot describe without pickle (``bfloat16``, which NumPy knows only
through ml_dtypes) is stored as its raw 16-bit payload (``uint16``) with the dtype's name in the
structure; such a file is written as format version 2, which older readers refuse rather than
hand back integers.
"""

from __future__ import annotations

import io
import json
import os
import socket
import tempfile
import time
import zipfile
from collections import OrderedDict

import numpy as np

from everyo.dtypes import BFLOAT16
from everyo.errors import EveryOSerializationError
from everyo.tensor import Tensor

FORMAT = "everyo-npz"
VERSION = 2
_STRUCTURE_KEY = "__everyo_structure__"
#: dtype -> the unsigned integer dtype its payload is stored as (format version 2).
_RAW_PAYLOAD = {BFLOAT16: np.dtype(np.uint16)}
_RAW_PREFIX = "r"  # archive members holding a raw payload are named r0, r1, ...
_RAW_BY_NAME = {dtype.name: (dtype, payload) for dtype, payload in _RAW_PAYLOAD.items()}


def _encode(value, arrays: dict, where: str):
    if hasattr(value, "state_dict") and callable(value.state_dict):
        value = value.state_dict()
    if isinstance(value, Tensor):
        value = value.data
    if isinstance(value, np.ndarray):
        payload = _RAW_PAYLOAD.get(value.dtype)
        if payload is not None:
            ref = f"{_RAW_PREFIX}{len(arrays)}"
            # NOTE: not np.ascontiguousarray, which turns a 0-d array into shape (1,)
            arrays[ref] = np.array(value, order="C", copy=not value.flags.c_contiguous).view(payload)
            return {"array": ref, "dtype": value.dtype.name}
        if value.dtype.kind not in "biufc":
            raise EveryOSerializationError(f"save: {where} has dtype {value.dtype}, which cannot "
                                           f"be stored without pickle")
        ref = f"a{len(arrays)}"
        arrays[ref] = value
        return {"array": ref}
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise EveryOSerializationError(f"save: key {k!r} in {where} is not a str or int")
            items.append([k, _encode(v, arrays, f"{where}[{k!r}]")])
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]}
    raise EveryOSerializationError(f"save: {where} is a {type(value).__name__}; only arrays, "
                                   f"tensors, numbers, strings, None, dicts and lists are stored")


def _decode(node, archive):
    if "array" in node:
        array = archive[node["array"]]
        if "dtype" not in node:
            return array
        dtype, payload = _RAW_BY_NAME.get(node["dtype"], (None, None))
        if dtype is None or array.dtype != payload:
            raise ValueError(f"array {node['array']} claims dtype {node['dtype']!r} with a "
                             f"{array.dtype} payload")
        return array.view(dtype)
    if "value" in node:
        return node["value"]
    if "dict" in node:
        return OrderedDict((k, _decode(v, archive)) for k, v in node["dict"])
    if "list" in node:
        return [_decode(v, archive) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, archive) for v in node["tuple"])
    raise ValueError(f"unknown node {sorted(node)}")


_HOST = socket.gethostname().replace("-", "_")
#: A temporary file this old is abandoned whoever wrote it (another host, an older EveryO).
STALE_AFTER_SECONDS = 3600.0


def remove_stale_temporaries(directory: str) -> list:
    """Delete the ``.everyo-*.tmp`` files that killed saves left in ``directory``.

    A temporary file is stale when it names a process of this host that no longer runs, or
    when it is older than :data:`STALE_AFTER_SECONDS`; a save still running (here or on
    another host sharing the directory) keeps its file. Returns the removed paths.
    """
    removed = []
    now = time.time()
    for name in os.listdir(directory):
        if not (name.startswith(".everyo-") and name.endswith(".tmp")):
            continue
        full = os.path.join(directory, name)
        owner = name[len(".everyo-"):].split("-", 1)[0]
        pid, _, host = owner.partition("@")
        try:
            dead = host == _HOST and pid.isdigit() and not _process_alive(int(pid))
            if dead or now - os.path.getmtime(full) > STALE_AFTER_SECONDS:
                os.unlink(full)
                removed.append(full)
        except OSError:  # gone already (another save cleaned it), or not ours to remove
            continue
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def save(obj, path) -> None:
    """Write ``obj`` (a state dict, a module, nested dicts/lists of arrays) to ``path``.

    The file is written to a temporary file beside ``path`` and renamed over it, so a crash
    never leaves a half-written checkpoint.

    Example:
        >>> import everyo as eo, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "w.npz")
        >>> eo.save({"w": np.arange(3.0), "step": 7}, path)
        >>> eo.load(path)["step"]
        7
    """
    path = os.fspath(path)
    arrays: dict = {}
    tree = _encode(obj, arrays, "the object")
    # NOTE: version 1 unless a raw payload needs version 2, so such files stay readable by
    # EveryO releases that predate bfloat16.
    version = VERSION if any(ref.startswith(_RAW_PREFIX) for ref in arrays) else 1
    structure = {"format": FORMAT, "version": version, "tree": tree}
    arrays[_STRUCTURE_KEY] = np.frombuffer(json.dumps(structure).encode(), dtype=np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(directory)
    fd, tmp = tempfile.mkstemp(prefix=f".everyo-{os.getpid()}@{_HOST}-", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(path):
    """Read what :func:`save` wrote; raises ``EveryOSerializationError`` on a damaged file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"load: no such file: {path}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            archive = {name: npz[name] for name in npz.files}
        structure = json.loads(archive.pop(_STRUCTURE_KEY).tobytes().decode())
        if structure.get("format") != FORMAT:
            raise ValueError(f"format {structure.get('format')!r} is not {FORMAT!r}")
        if structure.get("version", 0) > VERSION:
            raise ValueError(f"written by a newer EveryO (format version {structure['version']})")
        return _decode(structure["tree"], archive)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError,
            json.JSONDecodeError) as exc:
        raise EveryOSerializationError(
            f"load: {path} is truncated, corrupt or not an EveryO checkpoint ({exc})"
        ) from exc
