"""``DistributedDataParallel``: gradient averaging that overlaps the rest of backward.

Gradients are grouped into buckets in reverse registration order (roughly the order backward
finishes them), with PyTorch's rule: each bucket closes as soon as it reaches its limit,
``bucket_cap_mb`` MiB, except that by default (no ``bucket_cap_mb`` given: 25) the first
bucket's limit is 1 MiB; each bucket is all-reduced as a sequence of segments, a large
parameter's cut at the rows its gradient is computed in (:mod:`everyo_dist.buckets`). A
post-accumulate-grad hook marks a parameter ready (``Linear`` and ``Conv2D`` hand over their
weights' gradients before their inputs', see ``Op.backward_parts``) and a rows-ready hook the
rows of a large weight's gradient as ``matmul`` computes them; a segment whose values are all
final is handed (a view of one gradient, or a copy of several) to a communication thread,
which all-reduces it while backward carries on. The hook of the last parameter backward
reaches reduces the remaining segments itself, waits for the others and writes the averages
back, so ``.grad`` is averaged when ``backward()`` returns.

The averages are exactly :func:`~everyo_dist.gradients.average_gradients`'s: the reduction is
element-wise, so cutting the vector into buckets and segments changes no bit. A parameter the
forward did not use (found by walking the graph from the outputs, as PyTorch's
``find_unused_parameters=True`` does) contributes its current gradient, or zeros, and receives
the average, as ``average_gradients`` does; one whose ``requires_grad`` was turned off after
wrapping gets no gradient from backward, so it is not waited for and its ``.grad`` is left
alone. Segments are all-reduced strictly in order on every rank, so ranks whose backward
finishes parameters in a different order still match.
"""

from __future__ import annotations

import contextlib
import queue
import threading

import numpy as np

from everyo import is_grad_enabled
from everyo.kernels import row_block_stops
from everyo_dist.buckets import DEFAULT_BUCKET_CAP_MB, FIRST_BUCKET_BYTES, buckets, segments
from everyo_dist.errors import DistributedError


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
        self._buckets: list | None = None
        self._segments: list = []  # every bucket's segments, in all-reduce order
        self._segments_of: dict[int, list] = {}  # id(param) -> the segments holding it
        self._expected: set[int] = set()  # ids of the parameters backward has still to reach
        self._in_rows: set[int] = set()  # ids of the parameters whose rows are arriving
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
        # (only parameters large enough for the core to compute their gradient in row blocks)
        self._handles += [p.register_grad_rows_ready_hook(self._on_rows_ready)
                          for p in self._params
                          if len(row_block_stops(p.data.shape, p.data.dtype.itemsize)) > 1]

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
            self._buckets = buckets(self._params, self._cap, self._first_cap)
            self._segments = segments(self._buckets)
            self._segments_of = {}
            for segment in self._segments:
                for p in segment.params:
                    self._segments_of.setdefault(id(p), []).append(segment)
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
            self._expected, self._in_rows = set(), set()
            for bucket in self._buckets:
                bucket.result = None
            for segment in self._segments:
                segment.done.clear()
        # NOTE: the union over every forward since the last reduction. Only parameter ids are
        # kept, never the outputs: a forward whose backward never comes must not keep its
        # graph (activations included) alive.
        self._expected |= reached
        for segment in self._segments:
            segment.pending = {id(p) for p in segment.params if id(p) in self._expected}
        # NOTE: no segment is launched before backward starts: another forward through the
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
        key = id(param)
        if key in self._in_rows:  # (its first rows may have left already: this backward's)
            self._in_rows.discard(key)
        else:
            self._refuse_if_sent(param)
        for segment in self._segments_of[key]:
            segment.pending.discard(key)
        self._expected.discard(key)
        if self._expected:
            self._launch_ready()  # its segments, or segments of unused parameters before them
        else:
            self._finish()

    def _on_rows_ready(self, param, start: int, stop: int) -> None:
        """Rows ``start:stop`` of ``param.grad`` are final: launch the segments they complete.
        (The last rows are left to the post-accumulate hook that follows at once: it may be
        the step's last parameter, whose segments are reduced on this thread.)"""
        if not self._armed or stop == param.data.shape[0]:
            return  # (no_sync, or no forward through the wrapper: its post-accumulate hook says)
        self._started = True
        key = id(param)
        if start == 0:
            self._refuse_if_sent(param)
            self._in_rows.add(key)
        for segment in self._segments_of[key]:
            if segment.row_stop is not None and segment.row_stop <= stop:
                segment.pending.discard(key)
        self._launch_ready()

    def _refuse_if_sent(self, param) -> None:
        if self._segments_of[id(param)][0].index < self._next_launch:
            # its segment left with the gradient it had then
            name = self._names.get(id(param), f"a parameter of shape {param.shape}")
            raise DistributedError(
                f"DistributedDataParallel: a gradient for {name} arrived after its bucket was "
                f"already all-reduced, so it would be lost: its earlier backward (of another "
                f"forward since the last reduction) counted it as final. Backward the sum of "
                f"the losses of all the forwards once, or run each backward right after its "
                f"forward")

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
        """Hand the communication thread every ready segment, strictly in order."""
        while self._next_launch < len(self._segments) and \
                not self._segments[self._next_launch].pending:
            # NOTE: copied here, on the training thread (as PyTorch's autograd thread copies
            # into its buckets): with every core computing, a copy on the communication thread
            # waits for a time slice, and the segment leaves later
            segment = self._segments[self._next_launch]
            self._work.put((segment, segment.contribution(), segment.destination()))
            self._next_launch += 1

    def _finish(self) -> None:
        """Reduce the segments not handed over yet, wait for the others and write the averages
        back into ``.grad``."""
        self._armed, self._started = False, False
        self._in_rows = set()
        handed = self._next_launch
        self._next_launch = len(self._segments)
        # NOTE: the last segments are reduced here, on the training thread: nothing is left to
        # overlap with, and a hand-over would add a thread wake-up to every step. They are
        # copied out while the earlier ones are still on the wire, so the link never waits.
        remaining = [(segment, segment.contribution(), segment.destination())
                     for segment in self._segments[handed:]]
        for segment in self._segments[:handed]:
            segment.done.wait()
        if self._error is not None:
            raise self._error
        for _, flat, out in remaining:
            self.group.all_reduce_mean(flat, out=out)
        for bucket in self._buckets:
            bucket.write_back()

    def _communicate(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            segment, flat, out = item
            try:
                if self._error is None:
                    self.group.all_reduce_mean(flat, out=out)
            except BaseException as exc:  # re-raised on the training thread
                self._error = exc
            finally:
                # NOTE: no reference into the bucket's vector may outlive the step here, or
                # the vector is never recycled (see Bucket)
                del item, flat, out
                segment.done.set()
