"""``ZeroRedundancyOptimizer``: ZeRO stage 1 (Rajbhandari et al., 2020), PyTorch's name and
meaning. The parameters are partitioned over the ranks; each rank keeps the optimizer state of
its own partition only, steps it, and the updated parameters are all-gathered, so every rank
ends the step with the same bits as the unsharded optimizer (its arithmetic per parameter is
element-wise: who computes an update does not change it).

Checkpoints use the unsharded optimizer's layout: ``consolidate_state_dict(to=r)`` gathers the
partitions on rank ``r``, whose ``state_dict()`` then loads into ``optimizer_class`` itself, or
into a ``ZeroRedundancyOptimizer`` at any world size.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from everyo import Optimizer, bump_version
from everyo_dist.errors import DistributedError


def partition(groups: list, world_size: int) -> list[int]:
    """The owner rank of every parameter (in the groups' order): PyTorch's rule, largest
    parameters first, each to the rank holding the fewest elements so far."""
    owners: dict[int, int] = {}
    sizes = [0] * world_size
    for group in groups:
        for param in sorted(group["params"], key=lambda p: p.data.size, reverse=True):
            rank = int(np.argmin(sizes))
            owners[id(param)] = rank
            sizes[rank] += param.data.size
    return [owners[id(p)] for group in groups for p in group["params"]]


def _fingerprint(groups: list) -> np.ndarray:
    layout = [[[list(p.data.shape), p.data.dtype.name] for p in g["params"]] for g in groups]
    return np.frombuffer(hashlib.sha256(json.dumps(layout).encode()).digest(), np.uint8)


class ZeroRedundancyOptimizer(Optimizer):
    """Shard ``optimizer_class``'s state over the ranks of ``group``.

    Args:
        params: the parameters (or parameter groups), the same on every rank.
        optimizer_class: e.g. ``eo.Adam``; it must step each parameter independently.
        group: the process group (``process_group=``, PyTorch's name, is taken too).
        parameters_as_bucket_view, overlap_with_ddp: PyTorch's options, False only: the
            parameters stay separate arrays, and the overlapped step is
            ``DistributedDataParallel(model, group, optimizer=zero)``.
        **defaults: ``optimizer_class``'s options (``lr=...``).

    ``param_groups`` are the unsharded ones (schedulers change them; each step passes them on
    to the local optimizer); ``optim`` is the local optimizer of this rank's partition (None
    where the rank owns nothing).

    Example:
        >>> import everyo as eo
        >>> from everyo.distributed import init
        >>> with init(backend="shm", rank=0, world_size=1) as group:
        ...     w = eo.Parameter([1.0, 2.0])
        ...     zero = ZeroRedundancyOptimizer([w], optimizer_class=eo.SGD, group=group, lr=0.5)
        ...     w.grad = np.float32([1.0, 1.0]); zero.step()
        >>> w.data
        array([0.5, 1.5], dtype=float32)
    """

    def __init__(self, params, optimizer_class=None, group=None, process_group=None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False,
                 **defaults):
        if group is not None and process_group is not None:
            raise DistributedError("ZeroRedundancyOptimizer: give the group once, as group= "
                                   "or as PyTorch's process_group=, not both (group= and "
                                   "process_group=)")
        group = process_group if group is None else group
        if overlap_with_ddp is not False:
            raise DistributedError(f"ZeroRedundancyOptimizer: overlap_with_ddp={overlap_with_ddp!r}"
                                   f" is not an option here: to step each bucket inside "
                                   f"backward, pass the optimizer to the wrapper, "
                                   f"DistributedDataParallel(model, group, optimizer=zero)")
        if parameters_as_bucket_view is not False:
            raise DistributedError(f"ZeroRedundancyOptimizer: parameters_as_bucket_view="
                                   f"{parameters_as_bucket_view!r} is not supported (the "
                                   f"parameters stay separate arrays, all-gathered per dtype)")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise DistributedError(f"ZeroRedundancyOptimizer: optimizer_class must be an everyo "
                                   f"optimizer class (eo.Adam, eo.SGD, ...), got "
                                   f"{optimizer_class!r}")
        if optimizer_class.step is not Optimizer.step or \
                optimizer_class.step_parameters is not Optimizer.step_parameters:
            raise DistributedError(f"ZeroRedundancyOptimizer: {optimizer_class.__name__} has "
                                   f"its own step() (a closure or a global decision), so its "
                                   f"state cannot be sharded parameter by parameter")
        if not callable(getattr(group, "all_gather", None)):
            raise DistributedError(f"ZeroRedundancyOptimizer needs a process group (group=), "
                                   f"got {type(group).__name__}")
        template = optimizer_class(params, **defaults)  # (checks the options; holds no state)
        for name in ("defaults", "param_groups", "step_count"):
            object.__setattr__(self, name, getattr(template, name))
        object.__setattr__(self, "state", {})  # (the partition's is in self.optim.state)
        self.optimizer_class, self.group, self._template = optimizer_class, group, template
        self._check_same_parameters()
        self._owners = partition(self.param_groups, group.world_size)
        self.optim = self._local_optimizer()
        self._consolidated: dict | None = None

    def _check_same_parameters(self) -> None:
        prints = self.group.all_gather(_fingerprint(self.param_groups))
        differ = [r for r in range(self.group.world_size) if not np.array_equal(prints[r],
                                                                                 prints[0])]
        if differ:
            shapes = [len(g["params"]) for g in self.param_groups]
            raise DistributedError(
                f"ZeroRedundancyOptimizer: rank(s) {differ} have other parameters (shapes, "
                f"dtypes or groups) than rank 0; every rank must pass the same list (this is "
                f"rank {self.group.rank}, with {shapes} parameters per group)")

    def _mine(self, group_index: int) -> list:
        start = sum(len(g["params"]) for g in self.param_groups[:group_index])
        params = self.param_groups[group_index]["params"]
        return [p for i, p in enumerate(params) if self._owners[start + i] == self.group.rank]

    def _local_optimizer(self):
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": self._mine(i)}
                  for i, g in enumerate(self.param_groups)]
        groups = [g for g in groups if g["params"]]
        return self.optimizer_class(groups, **self.defaults) if groups else None

    def _sync_options(self) -> None:
        if self.optim is None:
            return
        local = iter(self.optim.param_groups)
        for index, group in enumerate(self.param_groups):
            if self._mine(index):
                target = next(local)
                target.update({k: v for k, v in group.items() if k != "params"})

    def step(self) -> None:
        """Step this rank's partition, then all-gather every updated parameter."""
        self.step_parameters(self.params)
        self.finish_step()

    def step_parameters(self, params, count: bool = True) -> None:
        """Step the parameters of ``params`` this rank owns (``DistributedDataParallel(
        optimizer=)`` calls it per bucket); the others are updated by :meth:`finish_step`."""
        if count:
            self.step_count += 1
        self._sync_options()
        if self.optim is not None:
            self.optim.step_parameters(params, count=count)

    def finish_step(self) -> None:
        """All-gather every parameter from its owner (a collective: every rank calls it once
        per step, after stepping)."""
        self._gather_parameters()

    def _gather_parameters(self) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        rank, world = self.group.rank, self.group.world_size
        for dtype in sorted({p.data.dtype.name for p in params}):
            shards = [[p for p, owner in zip(params, self._owners)
                       if owner == r and p.data.dtype.name == dtype] for r in range(world)]
            sizes = [sum(p.data.size for p in shard) for shard in shards]
            flat = np.zeros(max(sizes), dtype)
            offset = 0
            for p in shards[rank]:
                flat[offset:offset + p.data.size] = p.data.reshape(-1)
                offset += p.data.size
            rows = self.group.all_gather(flat)
            for r in range(world):
                if r == rank:
                    continue
                offset = 0
                for p in shards[r]:
                    p.data[...] = rows[r, offset:offset + p.data.size].reshape(p.data.shape)
                    offset += p.data.size
                    bump_version(p)

    # -- checkpoints ----------------------------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's partition of the state on rank ``to`` (a collective: every rank
        calls it), for :meth:`state_dict`."""
        if isinstance(to, bool) or not isinstance(to, (int, np.integer)) or \
                not 0 <= to < self.group.world_size:
            raise DistributedError(f"consolidate_state_dict: to must be a rank of the group "
                                   f"(0..{self.group.world_size - 1}), got {to!r}")
        merged: dict = {}
        for source in range(self.group.world_size):
            part = _broadcast_state(self.group, self._local_state(), source)
            merged.update(part)
        self._consolidated = merged if self.group.rank == to else None

    def _local_state(self) -> dict:
        """This rank's buffers, keyed by the parameters' global positions."""
        if self.optim is None:
            return {}
        index = {id(p): i for i, p in enumerate(self.params)}
        return {index[id(p)]: buffers for p, buffers in self.optim.state.items() if buffers}

    def state_dict(self) -> dict:
        """The unsharded optimizer's state dict (``optimizer_class``'s layout), on the rank the
        last :meth:`consolidate_state_dict` gathered it on."""
        if self._consolidated is None:
            raise DistributedError("ZeroRedundancyOptimizer.state_dict: call "
                                   "consolidate_state_dict(to=rank) on every rank first, then "
                                   "state_dict() on that rank")
        saved = self._template.state_dict()  # (groups and options; the template has no state)
        saved["step_count"] = self.step_count
        saved["state"] = {i: {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
                              for k, v in buffers.items()}
                          for i, buffers in sorted(self._consolidated.items())}
        for packed, group in zip(saved["param_groups"], self.param_groups):
            packed.update({k: v for k, v in group.items() if k != "params"})
        return saved

    def load_state_dict(self, state: dict) -> None:
        """Load an unsharded state dict (``optimizer_class``'s, or :meth:`state_dict`'s from any
        world size): checked whole first, then each rank keeps its partition."""
        check = self.optimizer_class([dict(g) for g in self.param_groups], **self.defaults)
        check.load_state_dict(state)  # (every check of the optimizer's own loader)
        for group, loaded in zip(self.param_groups, check.param_groups):
            group.update({k: v for k, v in loaded.items() if k != "params"})
        self.step_count = check.step_count
        if self.optim is not None:
            by_id = {id(p): buffers for p, buffers in check.state.items()}
            self.optim.state = {p: by_id[id(p)] for g in self.optim.param_groups
                                for p in g["params"] if id(p) in by_id}
            self.optim.step_count = check.step_count
            self._sync_options()


def _broadcast_state(group, state: dict, source: int) -> dict:
    """``state`` of rank ``source`` (position -> buffers) on every rank: a JSON header (names,
    scalars, array dtypes and shapes; never a pickle), then each array."""
    header = None
    arrays: list = []
    if group.rank == source:
        spec: dict = {}
        for index, buffers in state.items():
            spec[str(index)] = entry = {}
            for key, value in buffers.items():
                if isinstance(value, np.ndarray):
                    entry[key] = ["array", value.dtype.name, list(value.shape)]
                    arrays.append(np.ascontiguousarray(value))
                else:
                    entry[key] = ["value", value.item() if isinstance(value, np.generic)
                                  else value]
        header = json.dumps(spec).encode()
    length = group.broadcast(np.int64([len(header) if header is not None else 0]), src=source)
    raw = group.broadcast(np.frombuffer(header, np.uint8) if header is not None
                          else np.zeros(int(length[0]), np.uint8), src=source)
    spec = json.loads(raw.tobytes().decode())
    out: dict = {}
    position = 0
    for index, entry in spec.items():
        out[int(index)] = buffers = {}
        for key, (kind, *rest) in entry.items():
            if kind == "value":
                buffers[key] = rest[0]
                continue
            dtype, shape = rest
            mine = arrays[position] if group.rank == source else np.zeros(shape, dtype)
            buffers[key] = group.broadcast(mine, src=source)
            position += 1
    return out


def state_bytes(optimizer) -> int:
    """Bytes of the arrays an optimizer (or a ZeroRedundancyOptimizer's partition) keeps."""
    local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    if local is None:
        return 0
    return sum(v.nbytes for buffers in local.state.values() for v in buffers.values()
               if isinstance(v, np.ndarray))
