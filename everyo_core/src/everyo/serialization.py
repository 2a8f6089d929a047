"""``eo.save`` / ``eo.load``: nested dicts/lists of arrays in a plain ``.npz``, never pickle
(a path ending in ``.safetensors`` is a flat state dict in that format instead: see
:mod:`everyo.safetensors_format`).

The tree's structure (keys, lists, scalars, strings) is stored as a JSON document inside the
archive; every array is its own ``.npy`` member. Loading reads each member's header itself and
accepts only the numeric dtypes :func:`save` writes, with exactly the bytes the header declares
(never pickle, never an allocation the file does not back), so a checkpoint from anywhere can
be opened without running code.

A dtype that ``.npy`` cannot describe without pickle (``bfloat16``, which NumPy knows only
through ml_dtypes) is stored as its raw 16-bit payload (``uint16``) with the dtype's name in the
structure; such a file is written as format version 2, which older readers refuse rather than
hand back integers.
"""

from __future__ import annotations

import io
import json
import math
import re
import tokenize
import zipfile
import zlib
from collections import OrderedDict

import numpy as np

from everyo.atomic_files import (
    STALE_AFTER_SECONDS,
    file_path,
    remove_stale_temporaries,
    require_file,
    write_atomically,
)
from everyo.devices import check_device
from everyo.dtypes import BFLOAT16
from everyo.errors import EveryOError, EveryOSerializationError
from everyo.safetensors_format import is_safetensors_path, load_safetensors, save_safetensors
from everyo.tensor import Tensor

FORMAT = "everyo-npz"
VERSION = 2
_STRUCTURE_KEY = "__everyo_structure__"
#: dtype -> the unsigned integer dtype its payload is stored as (format version 2).
_RAW_PAYLOAD = {BFLOAT16: np.dtype(np.uint16)}
_RAW_PREFIX = "r"  # archive members holding a raw payload are named r0, r1, ...
_RAW_BY_NAME = {dtype.name: (dtype, payload) for dtype, payload in _RAW_PAYLOAD.items()}
__all__ = ["MAX_NESTING", "STALE_AFTER_SECONDS", "load", "remove_stale_temporaries", "save"]


#: How deep a saved object may nest (dicts and lists inside each other); a file whose
#: structure nests deeper is refused before its JSON is parsed.
MAX_NESTING = 100
#: Each nesting level is at most this many JSON levels ({"dict": [[key, node]]}).
_JSON_LEVELS_PER_NESTING = 3
#: The structure document's largest size, and how far the archive's members may expand
#: beyond the file's own size (eo.save stores them uncompressed).
MAX_STRUCTURE_BYTES = 64 << 20
MAX_EXPANSION_BYTES = 256 << 20
_NODE_KINDS = ("array", "value", "dict", "list", "tuple")


class _Corrupt(ValueError):
    """A file's structure is not what :func:`save` writes."""


def _encode(value, arrays: dict, where: str, open_containers: tuple = ()):
    if hasattr(value, "state_dict") and callable(value.state_dict):
        value = value.state_dict()
    if isinstance(value, Tensor):
        value = value.data
    if isinstance(value, np.ndarray):
        return _encode_array(value, arrays, where)
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if not isinstance(value, (dict, list, tuple)):
        raise EveryOSerializationError(f"save: {where} is a {type(value).__name__}; only "
                                       f"arrays, tensors, numbers, strings, None, dicts and "
                                       f"lists are stored")
    if any(value is c for c in open_containers):
        raise EveryOSerializationError(f"save: {where} contains itself (a cycle); a "
                                       f"checkpoint is a tree")
    if len(open_containers) >= MAX_NESTING:
        raise EveryOSerializationError(f"save: {where} is nested deeper than {MAX_NESTING} "
                                       f"levels")
    inner = (*open_containers, value)
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise EveryOSerializationError(f"save: key {k!r} in {where} is not a str or int")
            items.append([k, _encode(v, arrays, f"{where}[{k!r}]", inner)])
        return {"dict": items}
    kind = "list" if isinstance(value, list) else "tuple"
    return {kind: [_encode(v, arrays, f"{where}[{i}]", inner) for i, v in enumerate(value)]}


def _encode_array(value: np.ndarray, arrays: dict, where: str) -> dict:
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


def _decode(node, archive):
    """The object ``node`` describes; every node is checked to be one :func:`_encode`
    writes (depth was bounded before parsing)."""
    if not isinstance(node, dict):
        raise _Corrupt(f"a node is a {type(node).__name__}, not an object")
    kinds = [kind for kind in _NODE_KINDS if kind in node]
    if len(kinds) != 1 or set(node) - {kinds[0], "dtype"} or ("dtype" in node
                                                              and kinds[0] != "array"):
        raise _Corrupt(f"a node has the keys {sorted(node)}")
    kind, body = kinds[0], node[kinds[0]]
    if kind == "array":
        return _decode_array(node, archive)
    if kind == "value":
        if body is not None and not isinstance(body, (bool, int, float, str)):
            raise _Corrupt(f"a value is a {type(body).__name__}")
        return body
    if not isinstance(body, list):
        raise _Corrupt(f"a {kind} node holds a {type(body).__name__}, not a list")
    if kind != "dict":
        items = [_decode(v, archive) for v in body]
        return items if kind == "list" else tuple(items)
    decoded = OrderedDict()
    for item in body:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                and not isinstance(item[0], bool)):
            raise _Corrupt(f"a dict item is {str(item)[:40]}, not a [key, node] pair")
        if item[0] in decoded:
            raise _Corrupt(f"a dict names the key {str(item[0])[:40]!r} twice")
        decoded[item[0]] = _decode(item[1], archive)
    return decoded


def _decode_array(node: dict, archive: dict) -> np.ndarray:
    ref = node["array"]
    if not isinstance(ref, str) or ref not in archive:
        raise _Corrupt(f"an array node names {str(ref)[:40]!r}, which the archive lacks")
    array = archive[ref]
    if array is None:  # eo.save stores each array once: one shared by two names would alias
        raise _Corrupt(f"array {ref} is named by two nodes")
    archive[ref] = None
    if "dtype" not in node:
        return array
    dtype, payload = _RAW_BY_NAME.get(node["dtype"], (None, None)) if isinstance(
        node["dtype"], str) else (None, None)
    if dtype is None or array.dtype != payload:
        raise _Corrupt(f"array {ref} claims dtype {str(node['dtype'])[:40]!r} with a "
                       f"{array.dtype} payload")
    return array.view(dtype)


def _json_depth(text: str) -> int:
    """How deep the JSON ``text`` nests, found without parsing it (strings removed)."""
    code = np.frombuffer(re.sub(r'"(?:[^"\\]|\\.)*"', '""', text).encode(), dtype=np.uint8)
    steps = (np.isin(code, (ord("{"), ord("["))).astype(np.int64)
             - np.isin(code, (ord("}"), ord("]"))))
    return int(np.cumsum(steps).max(initial=0))


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
    path = file_path(path, "save")
    if is_safetensors_path(path):
        save_safetensors(obj, path)
        return
    arrays: dict = {}
    tree = _encode(obj, arrays, "the object")
    # NOTE: version 1 unless a raw payload needs version 2, so such files stay readable by
    # EveryO releases that predate bfloat16.
    version = VERSION if any(ref.startswith(_RAW_PREFIX) for ref in arrays) else 1
    structure = {"format": FORMAT, "version": version, "tree": tree}
    arrays[_STRUCTURE_KEY] = np.frombuffer(json.dumps(structure).encode(), dtype=np.uint8)
    write_atomically(path, lambda handle: np.savez(handle, **arrays))


def load(path, map_location=None, *, weights_only=None):
    """Read what :func:`save` wrote; raises ``EveryOSerializationError`` on a damaged,
    crafted or foreign file (its size, nesting and every node are checked).

    ``map_location`` and ``weights_only`` are ``torch.load``'s, accepted so that its calls
    port unchanged: EveryO's arrays live on the CPU (``None``, ``"cpu"``, a
    ``torch.device("cpu")``, a dict mapping devices to the CPU, or a function are accepted;
    another target device is refused by name), and a file is never unpickled, so it is
    weights only either way (``weights_only`` must be None or a bool).
    """
    _check_torch_load_options(map_location, weights_only)
    path = file_path(path, "load")
    if is_safetensors_path(path):
        return load_safetensors(path)
    require_file(path, "load")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        archive = _read_archive(raw)
        return _decode(_read_structure(archive.pop(_STRUCTURE_KEY)), archive)
    # NOTE: zipfile raises NotImplementedError (an unknown compression method) and
    # RuntimeError (an encrypted member) for flags a damaged header may carry
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError,
            json.JSONDecodeError, NotImplementedError, RuntimeError, zlib.error) as exc:
        raise EveryOSerializationError(
            f"load: {path} is truncated, corrupt or not an EveryO checkpoint ({exc})"
        ) from exc


def _check_torch_load_options(map_location, weights_only) -> None:
    if weights_only is not None and not isinstance(weights_only, bool):
        raise EveryOError(f"load: weights_only must be None, True or False, got "
                          f"{weights_only!r}")
    if map_location is None or callable(map_location):
        return  # (a function remaps storages: every EveryO array is on the CPU already)
    targets = map_location.values() if isinstance(map_location, dict) else [map_location]
    for target in targets:
        check_device(target, "load(map_location=...)")


def _read_archive(raw: bytes) -> dict:
    """Every member of the archive ``raw``, after bounding what they expand to; each is an
    ``.npy`` array of a dtype :func:`save` writes, whose header is checked against its data
    before anything is allocated."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        members = archive.infolist()
        expanded = sum(info.file_size for info in members)
        if expanded > len(raw) + MAX_EXPANSION_BYTES:
            raise _Corrupt(f"its members would expand to {expanded} bytes from a file of "
                           f"{len(raw)}")
        arrays: dict = {}
        for info in members:
            name = info.filename
            if not name.endswith(".npy") or name[:-4] in arrays:
                raise _Corrupt(f"its member {name[:60]!r} is not one .npy array (a name "
                               f"without .npy, or one given twice)")
            arrays[name[:-4]] = _read_member(archive.read(info), name)
    if _STRUCTURE_KEY not in arrays:
        raise _Corrupt("it has no EveryO structure")
    return arrays


def _read_member(data: bytes, name: str) -> np.ndarray:
    """The array in the ``.npy`` bytes ``data`` (a native-order, writable copy)."""
    handle = io.BytesIO(data)
    try:
        # (a version 3.0 header differs from 2.0 only in its text's encoding)
        read_header = (np.lib.format.read_array_header_1_0
                       if np.lib.format.read_magic(handle) == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran_order, dtype = read_header(handle)
    # NOTE: NumPy's header parser raises tokenize.TokenError (not a ValueError) on an
    # unbalanced header, and what ast.literal_eval and np.dtype raise on a crafted one
    except (ValueError, TypeError, SyntaxError, OverflowError, EOFError,
            tokenize.TokenError) as exc:
        raise _Corrupt(f"member {name[:60]} has an unreadable array header ({exc})") from exc
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        raise _Corrupt(f"its member {name[:60]!r} has dtype {dtype}, which eo.save never "
                       f"writes")
    declared = math.prod(shape) * dtype.itemsize
    if declared != len(data) - handle.tell():
        raise _Corrupt(f"its member {name[:60]!r} declares shape {shape[:8]} ({declared} "
                       f"bytes) but holds {len(data) - handle.tell()} bytes of data")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=handle.tell())
    array = flat.reshape(shape, order="F" if fortran_order else "C")
    return array.astype(dtype.newbyteorder("="), order="K", copy=True)


def _read_structure(member: np.ndarray) -> dict:
    if member.dtype != np.uint8 or member.ndim != 1 or member.size > MAX_STRUCTURE_BYTES:
        raise _Corrupt(f"its structure is a {member.dtype} array of shape {member.shape}, not "
                       f"a JSON document of at most {MAX_STRUCTURE_BYTES} bytes")
    text = member.tobytes().decode()
    limit = _JSON_LEVELS_PER_NESTING * MAX_NESTING + 4
    if _json_depth(text) > limit:
        raise _Corrupt(f"its structure nests deeper than {MAX_NESTING} levels")
    structure = json.loads(text)
    if not isinstance(structure, dict) or structure.get("format") != FORMAT:
        found = structure.get("format") if isinstance(structure, dict) else structure
        raise _Corrupt(f"format {str(found)[:40]!r} is not {FORMAT!r}")
    version = structure.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or "tree" not in structure:
        raise _Corrupt(f"its structure has version {version!r} and keys {sorted(structure)}")
    if version < 1:
        raise _Corrupt(f"its format version is {version}")
    if version > VERSION:
        raise _Corrupt(f"written by a newer EveryO (format version {version})")
    return structure["tree"]
