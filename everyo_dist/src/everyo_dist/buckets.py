"""How ``DistributedDataParallel`` groups gradients for all-reduce: buckets, cut into segments.

A **bucket** is a group of parameters of one dtype, in reverse registration order, closed with
PyTorch's rule (:func:`buckets`); its averaged gradients live in one vector, of which each
``.grad`` becomes a view. A bucket is all-reduced as a sequence of **segments**, contiguous
pieces of that vector, each in one collective as soon as it is final:

- the rows of one large parameter, cut where the core computes its gradient in row blocks
  (:func:`everyo.kernels.row_block_stops`: from the shape and dtype only, so every rank cuts
  at the same rows). ``matmul`` announces each block of a weight's gradient as it is computed
  (``register_grad_rows_ready_hook``), so its first rows leave while the product still
  computes the rest. Such a segment is sent as a view of the gradient: no copy;
- a run of the other parameters between them, copied into one vector (a single parameter is
  sent as a view of its gradient).

The reduction is element-wise, so cutting the vector anywhere changes no bit of the result.
"""

from __future__ import annotations

import threading

import numpy as np

from everyo.kernels import row_block_stops
from everyo_dist.errors import DistributedError
from everyo_dist.recycling import ResultBuffers

#: The first bucket's limit when ``bucket_cap_mb`` is not given, as PyTorch's
#: ``_DEFAULT_FIRST_BUCKET_BYTES``: the last layers' gradients, final first, leave early
#: instead of waiting for a full bucket. An explicit ``bucket_cap_mb`` applies to every
#: bucket, the first included, as in PyTorch.
FIRST_BUCKET_BYTES = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25


class Bucket:
    """Parameters of one dtype whose averaged gradients live in one vector."""

    __slots__ = ("index", "params", "offsets", "dtype", "result", "input", "_buffers",
                 "_inputs")

    def __init__(self, index: int, params: list, dtype):
        self.index, self.params, self.dtype = index, params, np.dtype(dtype)
        self.offsets = np.cumsum([0] + [p.data.size for p in params]).tolist()
        self.result: np.ndarray | None = None
        self.input: np.ndarray | None = None  # (a communication hook's buffer())
        # NOTE: last step's vector comes back once no .grad views it (zero_grad): faulting in
        # tens of fresh megabytes per step would cost more than the copy-free sends save
        self._buffers = ResultBuffers()
        self._inputs = ResultBuffers()

    def inputs(self) -> np.ndarray:
        """This rank's gradients of the bucket in one vector, for a communication hook."""
        if self.input is None:
            self.input = self._inputs.empty(self.offsets[-1], self.dtype)
        return self.input

    def destination(self) -> np.ndarray:
        """The vector this step's averages are written into (allocated on first use)."""
        if self.result is None:
            self.result = self._buffers.empty(self.offsets[-1], self.dtype)
        return self.result

    def write_back(self) -> None:
        for param, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            if not param.requires_grad:  # frozen after wrapping: backward leaves it alone
                continue
            target = param.data.dtype if param.grad is None else param.grad.dtype
            param.grad = self.result[start:stop].reshape(param.data.shape).astype(
                target, copy=False)
        self.result = self.input = None


class Segment:
    """A contiguous piece of a bucket's vector that travels in one all-reduce: whole parameters
    (``row_stop`` None) or rows ``row_start:row_stop`` of ``params[0]``."""

    __slots__ = ("index", "bucket", "start", "stop", "params", "row_start", "row_stop",
                 "pending", "done")

    def __init__(self, index: int, bucket: Bucket, start: int, stop: int, params: list,
                 rows: tuple | None = None):
        self.index, self.bucket, self.start, self.stop = index, bucket, start, stop
        self.params = params
        self.row_start, self.row_stop = rows if rows is not None else (None, None)
        self.pending: set[int] = set()  # ids of the parameters this segment still waits for
        self.done = threading.Event()

    def contribution(self) -> np.ndarray:
        """This rank's values of the segment, 1-D in the bucket's dtype; a view of the
        gradient for one parameter (or its rows), else a copy. A missing gradient is zeros."""
        dtype = self.bucket.dtype
        if len(self.params) == 1:
            param = self.params[0]
            grad = _checked_gradient(param)
            if grad is None:
                return np.zeros(self.stop - self.start, dtype)
            flat = grad.reshape(-1)
            if self.row_stop is not None:
                width = param.data.size // param.data.shape[0]
                flat = flat[self.row_start * width:self.row_stop * width]
            return flat.astype(dtype, copy=False)
        flat = np.empty(self.stop - self.start, dtype)
        offset = 0
        for param in self.params:
            grad, size = _checked_gradient(param), param.data.size
            if grad is None:
                flat[offset:offset + size] = 0
            else:
                flat[offset:offset + size] = grad.reshape(-1)
            offset += size
        return flat

    def destination(self) -> np.ndarray:
        """Where this segment's averages go: its piece of the bucket's vector."""
        return self.bucket.destination()[self.start:self.stop]


def _checked_gradient(param):
    if param.grad is not None and param.grad.shape != param.data.shape:
        raise DistributedError(f"DistributedDataParallel: a parameter of shape "
                               f"{param.data.shape} has a gradient of shape {param.grad.shape}")
    return param.grad


def segments(buckets_: list[Bucket]) -> list[Segment]:
    """Every bucket cut into segments, in bucket order, then offset order (the order they are
    all-reduced in on every rank)."""
    found: list[Segment] = []
    for bucket in buckets_:
        run: list = []
        for param, start, stop in zip(bucket.params, bucket.offsets, bucket.offsets[1:]):
            stops = row_block_stops(param.data.shape, bucket.dtype.itemsize)
            if len(stops) == 1:
                run.append((param, start, stop))
                continue
            if run:
                found.append(Segment(len(found), bucket, run[0][1], run[-1][2],
                                     [p for p, _, _ in run]))
                run = []
            width = param.data.size // param.data.shape[0]
            row = 0
            for row_stop in stops:
                found.append(Segment(len(found), bucket, start + row * width,
                                     start + row_stop * width, [param], (row, row_stop)))
                row = row_stop
        if run:
            found.append(Segment(len(found), bucket, run[0][1], run[-1][2],
                                 [p for p, _, _ in run]))
    return found


def buckets(params: list, cap_bytes: int,
            first_cap_bytes: int = FIRST_BUCKET_BYTES) -> list[Bucket]:
    """PyTorch's ``compute_bucket_assignment_by_size``: in reverse registration order each
    parameter joins the open bucket of its gradient's dtype, which closes once it holds at
    least its limit (``first_cap_bytes`` for that dtype's first bucket, ``cap_bytes`` after):
    a gradient larger than the limit closes the bucket it joins, so it never waits for the
    next parameter. The buckets then go out in the order of the first parameter each holds
    (PyTorch sorts them by their smallest index), so parameters of two dtypes that alternate
    share two buckets, not one bucket each."""
    closed: list[tuple[list, np.dtype]] = []
    open_buckets: dict[np.dtype, tuple[list, int]] = {}  # dtype -> (params, closed so far)
    sizes: dict[np.dtype, int] = {}
    for param in reversed(params):
        dtype = (param.grad if param.grad is not None else param.data).dtype
        members, count = open_buckets.setdefault(dtype, ([], 0))
        members.append(param)
        sizes[dtype] = sizes.get(dtype, 0) + param.data.nbytes
        if sizes[dtype] >= (first_cap_bytes if count == 0 else cap_bytes):
            closed.append((members, dtype))
            open_buckets[dtype], sizes[dtype] = ([], count + 1), 0
    closed += [(members, dtype) for dtype, (members, _) in open_buckets.items() if members]
    position = {id(p): i for i, p in enumerate(reversed(params))}
    closed.sort(key=lambda bucket: position[id(bucket[0][0])])
    return [Bucket(index, members, dtype) for index, (members, dtype) in enumerate(closed)]
