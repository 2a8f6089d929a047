"""``DistributedDataParallel``: gradient averaging that overlaps the rest of backward.

Gradients are grouped into buckets in reverse registration order (roughly the order backward
finishes them), with PyTorch's rule: each bucket closes as soon as it reaches its limit,
``bucket_cap_mb`` MiB, except that by default (no ``bucket_cap_mb`` given: 25) the first
bucket's limit is 1 MiB. A post-accumulate-grad hook marks
a parameter ready (``Linear`` and ``Conv2D`` hand over their weights' gradients before their
inputs', see ``Op.backward_parts``); once a bucket's parameters are all ready their gradients
are copied into one flat vector, which a communication thread all-reduces while backward
carries on with the earlier layers. The hook of the last parameter backward reaches reduces the
remaining buckets itself, waits for the others and writes the averages back, so ``.grad`` is
averaged when ``backward()`` returns.

The averages are exactly :func:`~everyo_dist.gradients.average_gradients`'s: the reduction is
element-wise, so cutting the vector into buckets changes no bit. A parameter the forward did
not use (found by walking the graph from the outputs, as PyTorch's
``find_unused_parameters=True`` does) contributes its current gradient, or zeros, and receives
the average, as ``average_gradients`` does; one whose ``requires_grad`` was turned off after
wrapping gets no gradient from backward, so it is not waited for and its ``.grad`` is left
alone. Buckets are all-reduced strictly in bucket order on
every rank, so ranks whose backward finishes parameters in a different order still match.
"""

from __future__ import annotations

import contextlib
import queue
import threading

import numpy as np

from everyo import is_grad_enabled
from everyo_dist.errors import DistributedError


class _Bucket:
    """Parameters of one dtype whose gradients travel in one all-reduce."""

    __slots__ = ("index", "params", "offsets", "dtype", "pending", "result", "done")

    def __init__(self, index: int, params: list, dtype):
        self.index, self.params, self.dtype = index, params, np.dtype(dtype)
        self.offsets = np.cumsum([0] + [p.data.size for p in params]).tolist()
        self.pending: set[int] = set()
        self.result: np.ndarray | None = None
        self.done = threading.Event()

    def flatten(self) -> np.ndarray:
        """The parameters' gradients in one vector; a missing gradient is zeros."""
        flat = np.empty(self.offsets[-1], self.dtype)
        for param, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            if param.grad is None:
                flat[start:stop] = 0
            elif param.grad.shape != param.data.shape:
                raise DistributedError(f"DistributedDataParallel: a parameter of shape "
                                       f"{param.data.shape} has a gradient of shape "
                                       f"{param.grad.shape}")
            else:
                flat[start:stop] = param.grad.reshape(-1)
        return flat

    def write_back(self) -> None:
        for param, start, stop in zip(self.params, self.offsets, self.offsets[1:]):
            if not param.requires_grad:  # frozen after wrapping: backward leaves it alone
                continue
            target = param.data.dtype if param.grad is None else param.grad.dtype
            param.grad = self.result[start:stop].reshape(param.data.shape).astype(
                target, copy=False)


#: The first bucket's limit when ``bucket_cap_mb`` is not given, as PyTorch's
#: ``_DEFAULT_FIRST_BUCKET_BYTES``: the last layers' gradients, final first, leave early
#: instead of waiting for a full bucket. An explicit ``bucket_cap_mb`` applies to every
#: bucket, the first included, as in PyTorch.
FIRST_BUCKET_BYTES = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25


def _buckets(params: list, cap_bytes: int,
             first_cap_bytes: int = FIRST_BUCKET_BYTES) -> list[_Bucket]:
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
    return [_Bucket(index, members, dtype) for index, (members, dtype) in enumerate(closed)]


def _reachable_parameters(outputs, candidates: dict[int, object]) -> set[int]:
    """ids of the ``candidates`` (id -> parameter) the autograd graph of ``outputs`` reaches
    and backward will give a gradient (``requires_grad``)."""
    found: set[int] = set()
    stack = [t for t in outputs]
    seen: set[int] = set()
    while stack:
        tensor = stack.pop()
        ctx = getattr(tensor, "_ctx", None)
        if ctx is None:
            if id(tensor) in candidates and tensor.requires_grad:
                found.add(id(tensor))
            continue
        if id(ctx) in seen:
            continue
        seen.add(id(ctx))
        stack.extend(getattr(ctx, "parents", None) or ())
    return found


def _tensors_in(value) -> list:
    """The Tensors in a forward's output (a Tensor, or lists/tuples/dicts of them)."""
    if hasattr(value, "_ctx") and hasattr(value, "data"):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors_in(item)]
    return []


class DistributedDataParallel:
    """Wrap ``module`` so that ``backward()`` leaves every gradient averaged over ``group``.

    Args:
        module: the model (an ``eo.Module``); call the wrapper instead of the module.
        group: the process group (from ``spawn``, ``init``, ...).
        bucket_cap_mb: MiB of gradients per all-reduce (PyTorch's name and meaning). None
            (the default, as in PyTorch): 25, with a first bucket of 1 MiB; a value given
            applies to every bucket.

    Example:
        >>> import everyo as eo
        >>> from everyo.distributed import DistributedDataParallel, init
        >>> with init(backend="shm", rank=0, world_size=1) as group:
        ...     ddp = DistributedDataParallel(eo.Linear(2, 1, seed=0), group)
        ...     ddp(eo.ones((3, 2))).sum().backward()
        ...     ddp.close()
        ...     ddp.module.weight.grad.ravel()
        array([3., 3.], dtype=float32)
    """

    def __init__(self, module, group, bucket_cap_mb: float | None = None):
        if not callable(getattr(module, "parameters", None)):
            raise DistributedError(f"DistributedDataParallel wraps a Module, got "
                                   f"{type(module).__name__}")
        if not callable(getattr(group, "all_reduce_mean", None)):
            raise DistributedError(f"DistributedDataParallel needs a process group (from spawn, "
                                   f"init, ...), got {type(group).__name__}")
        if bucket_cap_mb is not None and (
                isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (
                    int, float, np.integer, np.floating)) or not 0 < bucket_cap_mb < float("inf")):
            raise DistributedError(f"bucket_cap_mb must be a finite positive number of MiB (or None "
                                   f"for PyTorch's default), got {bucket_cap_mb!r}")
        self.module, self.group = module, group
        self.bucket_cap_mb = bucket_cap_mb
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._by_id = {id(p): p for p in self._params}
        named = list(module.named_parameters())
        self._names = {id(p): name for name, p in named}
        self._all = {id(p): p for _, p in named}  # frozen ones too: see _arm
        self._closed = False
        cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self._cap = int(cap * 1024 * 1024)
        self._first_cap = FIRST_BUCKET_BYTES if bucket_cap_mb is None else self._cap
        self._buckets: list[_Bucket] | None = None
        self._bucket_of: dict[int, _Bucket] = {}
        self._expected: set[int] = set()  # ids of the parameters backward has still to reach
        self._armed = False
        self._started = False  # a hook of the armed reduction has run
        self._accumulating = False  # the last forward ran inside no_sync()
        self._sync = True
        self._next_launch = 0
        self._error: BaseException | None = None
        self._work: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._communicate, daemon=True,
                                        name="everyo-ddp-allreduce")
        self._thread.start()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready, early=True)
                         for p in self._params]

    # -- the wrapped module --------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """Run the module; the backward that follows averages its gradients (unless inside
        :meth:`no_sync`)."""
        if self._closed:
            raise DistributedError(
                "DistributedDataParallel: called after close(): its hooks are removed and its "
                "communication thread stopped, so backward would leave this rank's gradients "
                "unaveraged; build a new wrapper")
        if self._armed and self._started and is_grad_enabled():
            raise self._unfinished()
        output = self.module(*args, **kwargs)
        if not is_grad_enabled():  # evaluation: no backward follows, nothing to average
            return output
        if not self._sync:
            self._accumulating = True
            return output
        self._arm(_tensors_in(output))
        return output

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self, prefix: str = ""):
        return self.module.named_parameters(prefix)

    def train(self, mode: bool = True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: backward passes of forwards run inside the context only
        accumulate into ``.grad``; the first synchronised backward afterwards averages the
        accumulated gradients."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def close(self) -> None:
        """Remove the hooks and stop the communication thread."""
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._work.put(None)
        self._thread.join(timeout=5)

    # -- one step ------------------------------------------------------------------------------
    def _arm(self, outputs: list) -> None:
        """After a forward: which parameters backward will reach; the others are ready now."""
        if self._buckets is None:  # first step: dtypes of the gradients are known now or never
            self._buckets = _buckets(self._params, self._cap, self._first_cap)
            self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        reached = _reachable_parameters(outputs, self._all)
        unwrapped = reached - self._by_id.keys()
        if unwrapped:
            # NOTE: a parameter frozen when the wrapper was built has no hook and no bucket:
            # its gradient would stay this rank's own, silently different on every rank
            names = sorted(self._names[key] for key in unwrapped)
            raise DistributedError(
                f"DistributedDataParallel: {', '.join(names)} now require(s) a gradient but "
                f"did not when the wrapper was built, so its gradient would not be averaged; "
                f"build the wrapper after unfreezing (or keep requires_grad on and exclude "
                f"the parameter from the optimizer)")
        self._accumulating = False
        if not self._armed:
            self._armed, self._next_launch, self._error = True, 0, None
            self._expected = set()
            for bucket in self._buckets:
                bucket.result = None
                bucket.done.clear()
        # NOTE: the union over every forward since the last reduction. Only parameter ids are
        # kept, never the outputs: a forward whose backward never comes must not keep its
        # graph (activations included) alive.
        self._expected |= reached
        for bucket in self._buckets:
            bucket.pending = {id(p) for p in bucket.params if id(p) in self._expected}
        # NOTE: no bucket is launched before backward starts: another forward through the
        # wrapper may still use a parameter that this one does not reach.
        if not self._expected:  # backward will run no hook: finish here
            self._finish()

    def _on_grad_ready(self, param) -> None:
        if not self._armed:
            # NOTE: also before the wrapper's first forward: calling the module itself instead
            # of the wrapper must not train unaveraged
            if not self._accumulating:
                raise DistributedError(
                    "DistributedDataParallel: a backward reached the wrapped module's "
                    "parameters without a forward through the wrapper (or a second backward "
                    "through the same forward); call the wrapper, once per backward")
            return  # a forward inside no_sync: plain accumulation
        self._started = True
        bucket = self._bucket_of[id(param)]
        if bucket.index < self._next_launch:  # its bucket left with the gradient it had then
            name = self._names.get(id(param), f"a parameter of shape {param.shape}")
            raise DistributedError(
                f"DistributedDataParallel: a gradient for {name} arrived after its bucket was "
                f"already all-reduced, so it would be lost: its earlier backward (of another "
                f"forward since the last reduction) counted it as final. Backward the sum of "
                f"the losses of all the forwards once, or run each backward right after its "
                f"forward")
        bucket.pending.discard(id(param))
        self._expected.discard(id(param))
        if self._expected:
            self._launch_ready()  # this bucket, or buckets of unused parameters before it
        else:
            self._finish()

    def _unfinished(self) -> DistributedError:
        names = sorted(self._names.get(key, f"<parameter of shape {self._by_id[key].shape}>")
                       for key in self._expected)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        return DistributedError(
            f"DistributedDataParallel: expected to have finished reduction in the prior "
            f"iteration before starting a new one: its backward never produced gradients for "
            f"{shown}, so their buckets were never all-reduced and this rank's gradients are "
            f"not averaged. Every output of the forwards since the last completed backward "
            f"must be part of the loss that is backwarded (a forward whose loss is skipped, "
            f"e.g. on a NaN, is fine only if the next backward reaches the same parameters)")

    def _launch_ready(self) -> None:
        """Hand the communication thread every ready bucket, strictly in bucket order."""
        while self._next_launch < len(self._buckets) and \
                not self._buckets[self._next_launch].pending:
            # NOTE: copied here, on the training thread (as PyTorch's autograd thread copies
            # into its buckets): with every core computing, a copy on the communication thread
            # waits for a time slice, and the bucket leaves later
            bucket = self._buckets[self._next_launch]
            self._work.put((bucket, bucket.flatten()))
            self._next_launch += 1

    def _finish(self) -> None:
        """Reduce the buckets not handed over yet, wait for the others and write the averages
        back into ``.grad``."""
        self._armed, self._started = False, False
        handed = self._next_launch
        self._next_launch = len(self._buckets)
        # NOTE: the last buckets are reduced here, on the training thread: nothing is left to
        # overlap with, and a hand-over would add a thread wake-up to every step. They are
        # copied out while the earlier buckets are still on the wire, so the link never waits.
        remaining = [(bucket, bucket.flatten()) for bucket in self._buckets[handed:]]
        for bucket in self._buckets[:handed]:
            bucket.done.wait()
        if self._error is not None:
            raise self._error
        for bucket, flat in remaining:
            bucket.result = self.group.all_reduce_mean(flat)
        for bucket in self._buckets:
            bucket.write_back()
            bucket.result = None

    def _communicate(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            bucket, flat = item
            try:
                if self._error is None:
                    bucket.result = self.group.all_reduce_mean(flat)
            except BaseException as exc:  # re-raised on the training thread
                self._error = exc
            finally:
                bucket.done.set()
