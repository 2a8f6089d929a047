"""``eo.save`` / ``eo.load`` of ``.safetensors`` files, through the safetensors library.

safetensors (the format model hubs use) holds one flat table of named arrays: a JSON header
then the raw bytes, no code and no pickle. EveryO writes and reads it with the library's NumPy
API (``safetensors.numpy``; reading is memory-mapped), bfloat16 included through ml_dtypes.
A state dict (a Module's) fits; nested states (an optimizer's) are refused by name: store
those in EveryO's ``.npz``. The library is an optional dependency:
``pip install 'everyo-core[safetensors]'``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from everyo.atomic_files import require_file, write_atomically
from everyo.errors import EveryOSerializationError
from everyo.tensor import Tensor

SUFFIX = ".safetensors"
_INSTALL = "pip install 'everyo-core[safetensors]'"


def is_safetensors_path(path: str) -> bool:
    return path.lower().endswith(SUFFIX)


def _library(action: str):
    try:
        import safetensors
        import safetensors.numpy
    except ImportError:
        raise EveryOSerializationError(f"{action}: a {SUFFIX} file needs the safetensors "
                                       f"library: {_INSTALL}") from None
    return safetensors


def _flat_arrays(obj) -> dict:
    """``obj`` (a Module or a flat mapping of names to arrays/tensors) as contiguous arrays,
    each checked to be what safetensors stores."""
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        obj = obj.state_dict()
    if not isinstance(obj, dict):
        raise EveryOSerializationError(f"save: a {SUFFIX} file holds a flat dict of arrays "
                                       f"(a state_dict), got a {type(obj).__name__}")
    arrays = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise EveryOSerializationError(f"save: key {key!r} is not a str; {SUFFIX} names "
                                           f"every array by a string")
        if isinstance(value, Tensor):
            value = value.data
        if not isinstance(value, np.ndarray):
            raise EveryOSerializationError(
                f"save: {key!r} is a {type(value).__name__}; a {SUFFIX} file holds a flat "
                f"dict of arrays (a state_dict), so save nested or non-array state as .npz")
        # NOTE: not np.ascontiguousarray, which turns a 0-d array into shape (1,)
        arrays[key] = np.array(value, order="C", copy=not value.flags.c_contiguous)
    return arrays


def save_safetensors(obj, path: str) -> None:
    """Write ``obj``'s arrays to ``path`` atomically (0o666 & ~umask, as :func:`eo.save`)."""
    safetensors = _library("save")
    arrays = _flat_arrays(obj)
    try:
        data = safetensors.numpy.save(arrays, metadata={"format": "np"})
    except (safetensors.SafetensorError, ValueError, TypeError) as exc:
        dtypes = sorted({str(a.dtype) for a in arrays.values()})
        raise EveryOSerializationError(f"save: {path}: safetensors cannot store these arrays "
                                       f"(dtypes {dtypes}): {exc}") from None
    write_atomically(path, lambda handle: handle.write(data))


def load_safetensors(path: str) -> OrderedDict:
    """The arrays of the ``.safetensors`` file at ``path``, by name, in the file's order."""
    safetensors = _library("load")
    require_file(path, "load")
    try:
        with safetensors.safe_open(path, framework="np") as handle:
            return OrderedDict((key, _tensor(handle, key, path)) for key in handle.keys())
    except (safetensors.SafetensorError, OSError, ValueError, TypeError, KeyError) as exc:
        raise EveryOSerializationError(f"load: {path} is truncated, corrupt or not a "
                                       f"safetensors file ({type(exc).__name__}: {exc})") from None


def _tensor(handle, key: str, path: str):
    """``handle``'s array ``key``; a dtype safetensors knows but NumPy has not (float8, whose
    NumPy API looks it up as ``np.float8_e4m3fn``) is refused by name."""
    try:
        return handle.get_tensor(key)
    except AttributeError:
        raise EveryOSerializationError(
            f"load: {path}: tensor {key!r} is {handle.get_slice(key).get_dtype()}, a dtype NumPy "
            f"(and so EveryO) cannot hold; convert it (e.g. to float32) before saving") from None
