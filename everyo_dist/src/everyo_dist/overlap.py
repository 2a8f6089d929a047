"""The optimizer step of ``DistributedDataParallel(optimizer=)``: each bucket's parameters are
stepped as soon as that bucket's averages are written back, while later buckets are still on
the wire, so ``backward()`` returns with the parameters updated. A
``ZeroRedundancyOptimizer`` steps its own partition of each bucket and all-gathers the
parameters after the last one.

A parameter may be stepped only once backward no longer reads it. DDP's hooks run early,
inside the backward of the op that produced the gradient (see ``Op.backward_parts``), and that
op may still compute its other operands' gradients from the parameter's values. Backward runs
the ops one at a time, so when the step's last gradient arrives (inside op ``X``), every op
except ``X`` that uses a parameter has finished. The parameters ``X`` uses are safe too unless
``X`` still has an operand to differentiate that is not a wrapped parameter (an input that
requires grad, or an intermediate result): those are stepped by a hook on that operand, which
runs once ``X``'s backward is over.
"""

from __future__ import annotations

import weakref

from everyo import Optimizer, mark_applied_in_backward
from everyo_dist.errors import DistributedError


def checked_optimizer(optimizer, by_id: dict):
    """``optimizer`` if DDP can step it per bucket, else a named refusal."""
    if optimizer is None:
        return None
    if not isinstance(optimizer, Optimizer):
        raise DistributedError(f"DistributedDataParallel: optimizer must be an everyo "
                               f"optimizer (eo.SGD, eo.Adam, ...), got "
                               f"{type(optimizer).__name__}")
    kind = type(optimizer).__name__
    if type(optimizer).step is not Optimizer.step and not hasattr(optimizer, "finish_step"):
        raise DistributedError(f"DistributedDataParallel: {kind} has its own step() (a closure "
                               f"or a global decision), so it cannot be stepped bucket by "
                               f"bucket; call {kind}.step() after backward instead of passing "
                               f"optimizer=")
    foreign = [i for i, p in enumerate(optimizer.params) if id(p) not in by_id]
    if foreign:
        shapes = ", ".join(str(optimizer.params[i].shape) for i in foreign[:5])
        raise DistributedError(f"DistributedDataParallel: {kind}'s parameters {foreign[:5]} "
                               f"(shapes {shapes}) are not parameters of the wrapped module "
                               f"that require grad, so their gradients would never be averaged; "
                               f"build the optimizer from module.parameters()")
    if "step" in vars(optimizer):
        raise DistributedError(f"DistributedDataParallel: this {kind} is already stepped by "
                               f"another DistributedDataParallel")
    return optimizer


def _refuse_step(kind: str):
    def step(*args, **kwargs):
        raise DistributedError(
            f"{kind}.step(): this optimizer was passed to DistributedDataParallel(optimizer=), "
            f"which already stepped it inside backward(); remove the optimizer.step() call "
            f"(GradScaler.step and gradient clipping need every bucket before the step: for "
            f"them, build the wrapper without optimizer= and step as usual)")
    return step


class OverlappedStep:
    """Steps one optimizer bucket by bucket, once per synchronised backward."""

    def __init__(self, optimizer, names: dict):
        self.optimizer, self.names = optimizer, names
        self.mine = {id(p) for p in optimizer.params}
        self.counted = False
        self.deferred: list = []  # buckets waiting for the last op's backward to finish
        self.handles: list = []
        optimizer.step = _refuse_step(type(optimizer).__name__)

    def begin(self) -> None:
        self.counted = False
        self._drop_hooks()
        self.deferred = []

    def step(self, bucket) -> None:
        params = [p for p in bucket.params if id(p) in self.mine]
        if params:
            self.optimizer.step_parameters(params, count=not self.counted)
            self.counted = True
            mark_applied_in_backward(params)  # (clip_grad_norm_ after backward is refused)

    def finish(self) -> None:
        """After the step's last bucket: a sharded optimizer's all-gather (ZeRO), the same
        point of every rank's backward."""
        finish = getattr(self.optimizer, "finish_step", None)
        if finish is not None:
            finish()

    def defer(self, bucket_list: list, tails: list) -> None:
        """Step ``bucket_list`` once any of ``tails`` (weak references to the operands the last
        op still differentiates) has its gradient, that is once that op's backward is done."""
        self.deferred = bucket_list
        for ref in tails:
            tensor = ref()
            if tensor is None:
                continue
            if tensor._ctx is None:
                handle = tensor.register_post_accumulate_grad_hook(self._run_deferred)
            else:
                handle = tensor.register_hook(self._run_deferred)
            self.handles.append(handle)
        if not self.handles:  # (nothing can read them any more)
            self._run_deferred()

    def _run_deferred(self, *_):
        buckets, self.deferred = self.deferred, []
        self._drop_hooks()
        for bucket in buckets:
            self.step(bucket)
        self.finish()

    def refuse_if_unfinished(self) -> None:
        """Before the next forward: a step still waiting for the last op's backward (that
        operand's gradient never came) must not be skipped without a word."""
        if self.deferred:
            names = [self.names.get(id(p), str(p.shape)) for b in self.deferred
                     for p in b.params]
            raise DistributedError(
                f"DistributedDataParallel(optimizer=): the last backward never finished, so "
                f"{', '.join(names[:10])} were not stepped (their step waits for the "
                f"gradient of an operand of the op that used them last)")

    def _drop_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def close(self) -> None:
        self._drop_hooks()
        vars(self.optimizer).pop("step", None)


class GraphUses:
    """Per forward: the ops using each parameter and the ops with operands other than wrapped
    parameters to differentiate ("tails"), with weak references to those operands."""

    def __init__(self):
        self.consumers: dict[int, set] = {}
        self.tails: dict[int, list] = {}

    def record(self, ctx, wrapped: dict) -> None:
        for t, needed in zip(ctx.parents, ctx.needs_input_grad):
            if id(t) in wrapped and t._ctx is None:
                self.consumers.setdefault(id(t), set()).add(id(ctx))
            elif needed:
                self.tails.setdefault(id(ctx), []).append(weakref.ref(t))

    def split(self, last, buckets: list) -> tuple[list, list]:
        """(buckets safe to step now, buckets to defer, with the operands to wait for) when
        ``last``'s gradient, the step's last, has just arrived."""
        ops = self.consumers.get(id(last), set()) & self.tails.keys()
        if not ops:
            return buckets, []
        now, later = [], []
        for bucket in buckets:
            shared = any(self.consumers.get(id(p), set()) & ops for p in bucket.params)
            (later if shared else now).append(bucket)
        return now, later

    def tail_operands(self, last) -> list:
        ops = self.consumers.get(id(last), set()) & self.tails.keys()
        return [ref for op in ops for ref in self.tails[op]]
