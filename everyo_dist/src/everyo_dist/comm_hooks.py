"""Communication hooks of ``DistributedDataParallel`` (``register_comm_hook``), PyTorch's.

A hook is called once per bucket and step as ``hook(state, bucket)``; ``bucket`` is a
:class:`GradBucket` whose :meth:`~GradBucket.buffer` is this rank's flat gradient vector of the
bucket, and the hook returns the reduced vector (same length and dtype) that becomes every
parameter's ``.grad``. Hooks are synchronous: what they return is the result (PyTorch's return
a future). Every rank must register the same hook with an equivalent state.

The built-ins: :func:`allreduce_hook` (the default: the exact mean), :func:`fp16_compress_hook`
and :func:`bf16_compress_hook` (16-bit on the wire, as the tcp backend's ``wire_dtype=``), and
PowerSGD (:mod:`everyo_dist.powersgd`).
"""

from __future__ import annotations

import numpy as np

from everyo_dist.errors import DistributedError
from everyo_dist.powersgd import PowerSGDState, powerSGD_hook
from everyo_dist.reduction import reduce_rows

BFLOAT16 = np.dtype("bfloat16")  # (registered with NumPy by everyo, through ml_dtypes)

__all__ = ["GradBucket", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "PowerSGDState", "powerSGD_hook"]


class GradBucket:
    """What a hook receives: one bucket's gradients on this rank.

    ``buffer()`` is the flat vector (the bucket's dtype; a hook may modify it in place),
    ``parameters()`` the bucket's parameters in buffer order, ``gradients()`` views of the
    buffer shaped as each parameter, ``offsets()`` where each starts, ``index()`` the bucket's
    position (0 goes out first) and ``is_last()`` whether it is the step's last bucket.
    """

    __slots__ = ("_index", "_buffer", "_params", "_offsets", "_last")

    def __init__(self, index: int, buffer: np.ndarray, params: list, offsets: list,
                 last: bool):
        self._index, self._buffer, self._params = index, buffer, list(params)
        self._offsets, self._last = list(offsets), last

    def index(self) -> int:
        return self._index

    def buffer(self) -> np.ndarray:
        return self._buffer

    def parameters(self) -> list:
        return list(self._params)

    def offsets(self) -> list:
        return self._offsets[:-1]

    def gradients(self) -> list:
        return [self._buffer[start:stop].reshape(p.data.shape)
                for p, start, stop in zip(self._params, self._offsets, self._offsets[1:])]

    def is_last(self) -> bool:
        return self._last


def _group_of(state, hook_name: str):
    if not callable(getattr(state, "all_reduce_mean", None)):
        raise DistributedError(f"{hook_name}: its state must be the process group "
                               f"(register_comm_hook(group, {hook_name})), got "
                               f"{type(state).__name__}")
    return state


def allreduce_hook(state, bucket: GradBucket) -> np.ndarray:
    """The default: the exact mean over the ranks of ``state`` (a process group), reduced in
    float64 in rank order, bit for bit what ``average_gradients`` gives."""
    return _group_of(state, "allreduce_hook").all_reduce_mean(bucket.buffer())


def fp16_compress_hook(state, bucket: GradBucket) -> np.ndarray:
    """The mean with every rank's gradients rounded to float16 on the wire (half the bytes of
    float32): added in float64, rounded once to float16, then widened to the bucket's dtype.
    Bit for bit the tcp backend's ``wire_dtype="float16"``, on every backend. Values beyond
    float16's range become ±inf (no warning), as a float16 cast does."""
    group = _group_of(state, "fp16_compress_hook")
    buffer = bucket.buffer()
    with np.errstate(over="ignore"):
        compressed = buffer.astype(np.float16)
    return group.all_reduce_mean(compressed, out=compressed).astype(buffer.dtype)


def bf16_compress_hook(state, bucket: GradBucket) -> np.ndarray:
    """The mean with every rank's gradients rounded to bfloat16 on the wire (float32's range,
    8 significant bits). The process groups carry no bfloat16, so each rank's 16 bits travel
    in an ``all_gather`` (2 bytes per element per rank) and every rank adds the rows in rank
    order in float64 (``reduce_rows``, the backends' own arithmetic), rounds once to bfloat16
    and widens to the bucket's dtype: the same bits on every rank and every backend."""
    group = _group_of(state, "bf16_compress_hook")
    buffer = bucket.buffer()
    with np.errstate(over="ignore"):
        compressed = buffer.astype(BFLOAT16)
    rows = group.all_gather(compressed.view(np.uint16)).view(BFLOAT16)
    reduced = np.empty(buffer.size, BFLOAT16)
    reduce_rows(list(rows), reduced, len(rows))
    return reduced.astype(buffer.dtype)


def call_hook(hook, state, bucket, last: bool) -> None:
    """Run ``hook`` on ``bucket`` (an internal :class:`~everyo_dist.buckets.Bucket`) and
    write what it returns into the bucket's result, checked first: the same length and dtype
    as the buffer, or an error naming the hook and the bucket (on every rank, since every rank
    runs the same hook on the same layout)."""
    buffer = bucket.inputs()
    result = hook(state, GradBucket(bucket.index, buffer, bucket.params, bucket.offsets, last))
    result = getattr(result, "data", result) if not isinstance(result, np.ndarray) else result
    name = getattr(hook, "__name__", type(hook).__name__)
    if not isinstance(result, np.ndarray):
        raise DistributedError(f"communication hook {name} returned a "
                               f"{type(result).__name__} for bucket {bucket.index}; it must "
                               f"return the reduced flat array")
    if result.shape != buffer.shape or result.dtype != buffer.dtype:
        raise DistributedError(f"communication hook {name} returned {result.dtype}"
                               f"{list(result.shape)} for bucket {bucket.index}, whose buffer is "
                               f"{buffer.dtype}{list(buffer.shape)}: a hook must return the "
                               f"reduced buffer, same shape and dtype")
    np.copyto(bucket.destination(), result)
