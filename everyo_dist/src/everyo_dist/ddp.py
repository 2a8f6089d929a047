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

As PyTorch's constructor (``_sync_module_states``), the constructor first gives every rank
rank 0's parameters (frozen ones too) and buffers, written in place: one broadcast per dtype,
of all the states of that dtype in one flat vector (none on a group of one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import threading

import numpy as np

from everyo import bump_version, is_grad_enabled
from everyo.kernels import is_floating, row_block_stops
from everyo_dist.buckets import DEFAULT_BUCKET_CAP_MB, FIRST_BUCKET_BYTES, buckets, segments
from everyo_dist.comm_hooks import allreduce_hook, call_hook
from everyo_dist.errors import CollectiveMismatchError, DistributedError
from everyo_dist.fingerprint import DTYPE_CODES
from everyo_dist.overlap import GraphUses, OverlappedStep, checked_optimizer


def _reachable_parameters(outputs, candidates: dict[int, object],
                          uses: GraphUses | None = None) -> set[int]:
    """ids of the ``candidates`` (id -> parameter) the autograd graph of ``outputs`` reaches
    and backward will give a gradient (``requires_grad``); ``uses`` records which ops use
    which parameters (for the overlapped optimizer step)."""
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
        if uses is not None:
            uses.record(ctx, candidates)
        stack.extend(getattr(ctx, "parents", None) or ())
    return found


def _tensors_in(value) -> list:
    """The Tensors in a forward's output (a Tensor, or lists/tuples/dicts/dataclasses of them,
    as PyTorch's DDP searches)."""
    if hasattr(value, "_ctx") and hasattr(value, "data"):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, field.name) for field in dataclasses.fields(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors_in(item)]
    return []


class DistributedDataParallel:
    """Wrap ``module`` so that ``backward()`` leaves every gradient averaged over ``group``.

    Building it is a collective (every rank builds one): each rank's ``module`` receives rank
    0's parameters and buffers, in place (:func:`sync_module_states`).

    Args:
        module: the model (an ``eo.Module``); call the wrapper instead of the module.
        group: the process group (from ``spawn``, ``init``, ...).
        bucket_cap_mb: MiB of gradients per all-reduce (PyTorch's name and meaning). None
            (the default, as in PyTorch): 25, with a first bucket of 1 MiB; a value given
            applies to every bucket.
        optimizer: an optimizer of the module's parameters to step inside ``backward()``,
            bucket by bucket as each bucket's averages land (then ``optimizer.step()`` is
            refused); None: step it yourself after backward.

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

    def __init__(self, module, group, bucket_cap_mb: float | None = None, optimizer=None):
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
        self._hook, self._hook_state = None, None  # (register_comm_hook)
        self._untracked: str | None = None  # a forward's output type holding no Tensor found
        checked_optimizer(optimizer, self._by_id)
        # NOTE: after every check (a rank refusing alone would leave its peers waiting in the
        # broadcast), before the thread and the hooks (nothing to undo when it fails)
        sync_module_states(module, group)
        self._overlap = OverlappedStep(optimizer, self._names) if optimizer is not None \
            else None
        self._uses: GraphUses | None = None
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
        if self._overlap is not None and is_grad_enabled():
            self._overlap.refuse_if_unfinished()
        output = self.module(*args, **kwargs)
        if not is_grad_enabled():  # evaluation: no backward follows, nothing to average
            return output
        if not self._sync:
            self._accumulating = True
            return output
        tensors = _tensors_in(output)
        self._untracked = type(output).__name__ if not tensors and output is not None else None
        self._arm(tensors)
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

    def register_comm_hook(self, state, hook) -> None:
        """Reduce each bucket with ``hook(state, bucket)`` instead of the exact mean (PyTorch's
        ``register_comm_hook``, synchronous): ``bucket`` offers ``buffer()`` (this rank's flat
        gradients), ``parameters()``, ``gradients()``, ``index()`` and ``is_last()``; the hook
        returns the reduced vector, of the buffer's length and dtype. Built-ins are in
        ``everyo.distributed.comm_hooks``. Register once, before the first forward, the same
        hook on every rank."""
        if not callable(hook):
            raise DistributedError(f"register_comm_hook: the hook must be callable, got "
                                   f"{type(hook).__name__}")
        if self._hook is not None:
            raise DistributedError("register_comm_hook: a communication hook is already "
                                   "registered (PyTorch allows one, too)")
        if self._buckets is not None:
            raise DistributedError("register_comm_hook: register the hook before the first "
                                   "forward, so every step of every rank uses it")
        self._hook, self._hook_state = hook, state

    def close(self) -> None:
        """Remove the hooks and stop the communication thread (an ``optimizer=`` steps
        normally again)."""
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._overlap is not None:
            self._overlap.close()
        self._work.put(None)
        self._thread.join(timeout=5)

    # -- one step ------------------------------------------------------------------------------
    def _build_buckets(self) -> None:
        self._buckets = buckets(self._params, self._cap, self._first_cap)
        self._segments = segments(self._buckets)
        self._segments_of = {}
        for segment in self._segments:
            for p in segment.params:
                self._segments_of.setdefault(id(p), []).append(segment)

    def _check_layout(self) -> None:
        """Buckets are built at the first step, from the gradients' dtypes; a later
        ``model.to("float64")`` (same parameters, new dtype) rebuilds them rather than
        rounding float64 gradients through float32 vectors."""
        changed = [self._names.get(id(p), str(p.shape)) for bucket in self._buckets
                   for p, start, stop in zip(bucket.params, bucket.offsets, bucket.offsets[1:])
                   if _gradient_dtype(p) != bucket.dtype or p.data.size != stop - start]
        if not changed:
            return
        if self._hook is not None and self._hook is not allreduce_hook:
            raise DistributedError(
                f"DistributedDataParallel: {', '.join(changed[:5])} changed dtype or size "
                f"since the buckets were built, and a communication hook keeps state per "
                f"bucket; build a new wrapper (and hook state) after model.to(...)")
        self._build_buckets()

    def _arm(self, outputs: list) -> None:
        """After a forward: which parameters backward will reach; the others are ready now."""
        if self._buckets is None:  # first step: dtypes of the gradients are known now or never
            self._build_buckets()
        elif not self._armed:
            self._check_layout()
        uses = GraphUses() if self._overlap is not None else None
        reached = _reachable_parameters(outputs, self._all, uses)
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
            self._uses = uses
            for bucket in self._buckets:
                bucket.result = None
            for segment in self._segments:
                segment.done.clear()
        elif uses is not None and self._uses is not None:
            for key, ops in uses.consumers.items():
                self._uses.consumers.setdefault(key, set()).update(ops)
            self._uses.tails.update(uses.tails)
        # NOTE: the union over every forward since the last reduction. Only parameter ids are
        # kept, never the outputs: a forward whose backward never comes must not keep its
        # graph (activations included) alive.
        self._expected |= reached
        for segment in self._segments:
            segment.pending = {id(p) for p in segment.params if id(p) in self._expected}
        # NOTE: no segment is launched before backward starts: another forward through the
        # wrapper may still use a parameter that this one does not reach.
        if not self._expected:  # backward will run no hook: finish here
            self._finish(None)

    def _on_grad_ready(self, param) -> None:
        if not self._armed:
            # NOTE: also before the wrapper's first forward: calling the module itself instead
            # of the wrapper must not train unaveraged
            if not self._accumulating:
                raise DistributedError(self._not_armed_message())
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
            self._finish(param)

    def _not_armed_message(self) -> str:
        if self._untracked is not None:
            return (f"DistributedDataParallel: the wrapper's last forward returned a "
                    f"{self._untracked}, in which it found no Tensor (it looks inside Tensors, "
                    f"lists, tuples, dicts and dataclasses), so it could not tell which "
                    f"parameters this backward reaches; return the outputs in one of those")
        return ("DistributedDataParallel: a backward reached the wrapped module's "
                "parameters without a forward through the wrapper (or a second backward "
                "through the same forward); call the wrapper, once per backward")
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
            segment = self._segments[self._next_launch]
            self._work.put((segment, self._job(segment)))
            self._next_launch += 1

    def _job(self, segment):
        """What reduces ``segment`` (None: nothing yet, a hook waits for its whole bucket).

        NOTE: the values are copied here, on the training thread (as PyTorch's autograd thread
        copies into its buckets): with every core computing, a copy on the communication
        thread waits for a time slice, and the segment leaves later."""
        if self._hook is None or (self._hook is allreduce_hook and self._hook_state is
                                  self.group):
            return functools.partial(self.group.all_reduce_mean, segment.contribution(),
                                     out=segment.destination())
        bucket = segment.bucket
        bucket.inputs()[segment.start:segment.stop] = segment.contribution()
        if segment.stop != bucket.offsets[-1]:
            return None
        last = bucket.index == len(self._buckets) - 1
        return functools.partial(call_hook, self._hook, self._hook_state, bucket, last)

    def _finish(self, last) -> None:
        """Reduce the segments not handed over yet, wait for the others and write the averages
        back into ``.grad``; with ``optimizer=``, step each bucket as its averages land.
        ``last``: the parameter whose gradient arrived last (None: no backward runs)."""
        self._armed, self._started = False, False
        self._in_rows = set()
        handed = self._next_launch
        self._next_launch = len(self._segments)
        # NOTE: the last segments are reduced here, on the training thread: nothing is left to
        # overlap with, and a hand-over would add a thread wake-up to every step. They are
        # copied out while the earlier ones are still on the wire, so the link never waits.
        # With an optimizer to step they go to the communication thread instead, which keeps
        # the link busy while this thread steps the buckets already averaged.
        remaining = [(segment, self._job(segment)) for segment in self._segments[handed:]]
        if self._overlap is not None:
            for item in remaining:
                self._work.put(item)
            self._write_back_and_step(last)
            return
        for segment in self._segments[:handed]:
            segment.done.wait()
        if self._error is not None:
            raise self._error
        for _, job in remaining:
            if job is not None:
                job()
        for bucket in self._buckets:
            bucket.write_back()

    def _write_back_and_step(self, last) -> None:
        overlap, uses = self._overlap, self._uses
        overlap.begin()
        stepped_later = []
        for bucket in self._buckets:
            for segment in self._segments:
                if segment.bucket is bucket:
                    segment.done.wait()
            if self._error is not None:
                break
            bucket.write_back()
            now, later = uses.split(last, [bucket]) if uses is not None and last is not None \
                else ([bucket], [])
            for ready in now:
                overlap.step(ready)
            stepped_later += later
        for segment in self._segments:  # (after an error: let the thread drain)
            segment.done.wait()
        self._uses = None
        if self._error is not None:
            raise self._error
        if stepped_later:
            overlap.defer(stepped_later, uses.tail_operands(last))
        else:
            overlap.finish()

    def _communicate(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            segment, job = item
            try:
                if self._error is None and job is not None:
                    job()
            except BaseException as exc:  # re-raised on the training thread
                self._error = exc
                # NOTE: a hook may have failed on this rank only, its peers waiting in the
                # collective it skipped: no later collective of this rank may pair with it
                mark_failed = getattr(self.group, "mark_failed", None)
                if mark_failed is not None:
                    mark_failed(exc)
            finally:
                # NOTE: no reference into the bucket's vector may outlive the step here, or
                # the vector is never recycled (see Bucket)
                del item, job
                segment.done.set()


def sync_module_states(module, group, src: int = 0) -> None:
    """Write rank ``src``'s parameters (frozen ones too) and buffers into every other rank's
    ``module``, in place (PyTorch's ``_sync_module_states``): one ``broadcast`` per dtype, of
    all the states of that dtype packed into one flat vector; nothing on a group of one.

    A dtype the wire has no code for (bfloat16) travels as its bytes; a read-only array is
    replaced by a new one. Modules whose states differ in dtypes or sizes between the ranks
    raise ``CollectiveMismatchError`` on every rank, naming both sides.
    """
    if group.world_size == 1:
        return
    owners = dict(module.named_modules())
    # id(array) -> (array, its parameter or None, a buffer's module and name)
    states: dict[int, tuple] = {}
    for p in module.parameters():  # (each shared parameter once)
        states.setdefault(id(p.data), (p.data, p, None, None))
    for dotted, array in module.named_buffers():
        if isinstance(array, np.ndarray) and (array.dtype.kind in "biufc"
                                              or is_floating(array.dtype)):  # (bfloat16)
            path, _, name = dotted.rpartition(".")
            states.setdefault(id(array), (array, None, owners[path], name))
    by_dtype: dict[np.dtype, list] = {}
    for state in states.values():
        if state[0].size:
            by_dtype.setdefault(state[0].dtype.newbyteorder("="), []).append(state)
    for dtype in sorted(by_dtype, key=str):
        group_states = by_dtype[dtype]
        flat = np.empty(sum(state[0].size for state in group_states), dtype)
        if group.rank == src:
            offset = 0
            for array, *_ in group_states:
                flat[offset:offset + array.size] = array.reshape(-1)
                offset += array.size
        wire = flat if dtype.name in DTYPE_CODES else flat.view(np.uint8)
        try:
            received = group.broadcast(wire, src=src).view(dtype)
        except CollectiveMismatchError as exc:
            raise CollectiveMismatchError(
                f"DistributedDataParallel: the wrapped modules differ between the ranks (their "
                f"parameters and buffers of each dtype, packed into one vector per dtype, must "
                f"have the same sizes and dtypes on every rank): {exc}") from exc
        if group.rank == src:
            continue
        offset = 0
        for array, param, owner, name in group_states:
            values = received[offset:offset + array.size].reshape(array.shape)
            offset += array.size
            if array.flags.writeable:
                array[...] = values
            elif param is not None:  # (e.g. a frozen weight memory-mapped from a file)
                param.data = values.astype(array.dtype)
            else:
                owner.register_buffer(name, values.astype(array.dtype))
            if param is not None:
                bump_version(param)


def _gradient_dtype(param) -> np.dtype:
    """The dtype a parameter's bucket holds (the rule of :func:`~everyo_dist.buckets.buckets`)."""
    return (param.grad if param.grad is not None else param.data).dtype
