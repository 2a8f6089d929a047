"""Worker functions of the DistributedDataParallel hook, overlapped-step and ZeRO tests (spawn
imports them by name; ``ddp_mpi_harness.py`` runs them under ``mpiexec``)."""

from __future__ import annotations

import contextlib

import numpy as np

import everyo as eo
from everyo.distributed import DistributedDataParallel, DistributedError, comm_hooks


class SmallNet(eo.Module):
    """Two matrices big enough for PowerSGD to compress (64 x 48, 48 x 32), their biases, a
    head, and a branch only rank 0 uses."""

    def __init__(self):
        super().__init__()
        self.first = eo.Linear(48, 64, seed=0)
        self.second = eo.Linear(64, 32, seed=1)
        self.head = eo.Linear(32, 1, seed=2)
        self.extra = eo.Linear(48, 1, seed=3)

    def forward(self, x, use_extra: bool = False):
        out = self.head(eo.tanh(self.second(eo.tanh(self.first(x)))))
        return out + self.extra(x) if use_extra else out


def batch(rank: int, step: int, rows: int = 8):
    rng = np.random.default_rng([rank, step])
    x = rng.standard_normal((rows, 48)).astype(np.float32)
    return x, np.sin(x[:, :1] * 2).astype(np.float32)


def _loss(model, x, y, rank):
    residual = model(eo.tensor(x), rank == 0) - eo.tensor(y)
    return eo.mean(residual * residual)


def _local_gradients(ddp, model, x, y, rank) -> list:
    """This rank's own gradients (a backward inside ``no_sync``: no averaging), zeros for an
    unused parameter; ``.grad`` is cleared before and after."""
    for p in model.parameters():
        p.grad = None
    with ddp.no_sync():
        loss = _loss(ddp, x, y, rank)
    loss.backward()
    grads = [np.zeros_like(p.data) if p.grad is None else p.grad.copy()
             for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return grads


def local_and_hooked_gradients(group, hook_name: str, steps: int = 1):
    """This rank's own gradients (plain backward) and the hooked DDP's, for ``steps`` steps;
    returns ``{"local{t}-{i}", "hooked{t}-{i}"}``. ``hook_name`` None: no hook (the group's
    own reduction, e.g. a tcp ``wire_dtype``)."""
    out = {}
    model = SmallNet()
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.005)
    if hook_name is not None:
        ddp.register_comm_hook(group, getattr(comm_hooks, hook_name))
    for step in range(steps):
        x, y = batch(group.rank, step)
        for i, g in enumerate(_local_gradients(ddp, model, x, y, group.rank)):
            out[f"local{step}-{i}"] = g
        _loss(ddp, x, y, group.rank).backward()
        for i, p in enumerate(model.parameters()):
            out[f"hooked{step}-{i}"] = p.grad.copy()
    ddp.close()
    return out


def default_or_registered_allreduce(group, register: bool):
    model = SmallNet()
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.005)
    if register:
        ddp.register_comm_hook(group, comm_hooks.allreduce_hook)
    for step in range(2):
        x, y = batch(group.rank, step)
        _loss(ddp, x, y, group.rank).backward()
    ddp.close()
    return [p.grad for p in model.parameters()]


def _wrong_shape(state, bucket):
    return bucket.buffer()[:-1]


def _wrong_dtype(state, bucket):
    return state.all_reduce_mean(bucket.buffer()).astype(np.float64)


def bad_hook(group, which: str):
    """The error message each rank gets from a hook returning the wrong thing."""
    model = SmallNet()
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.005)
    ddp.register_comm_hook(group, _wrong_shape if which == "shape" else _wrong_dtype)
    x, y = batch(group.rank, 0)
    try:
        _loss(ddp, x, y, group.rank).backward()
        return "no error"
    except DistributedError as exc:
        return str(exc)
    finally:
        ddp.close()


def hook_failing_once_on_one_rank(group):
    """Rank 1's hook raises at its first call, between collectives; each rank catches what
    its backward raises and tries two more steps. Per step: "ok" or the error's class."""
    calls = []

    def hook(state, bucket):
        calls.append(bucket.index())
        if state.rank == 1 and len(calls) == 1:
            raise ValueError("the hook fails once, on rank 1 only")
        return state.all_reduce_mean(bucket.buffer())

    model = SmallNet()
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.005)
    ddp.register_comm_hook(group, hook)
    outcomes = []
    for step in range(3):
        x, y = batch(group.rank, step)
        try:
            _loss(ddp, x, y, group.rank).backward()
            outcomes.append("ok")
        except Exception as exc:  # noqa: BLE001 - the test looks at which
            outcomes.append(type(exc).__name__)
    return outcomes


def powersgd_run(group, rank_r: int, steps: int, start_iter: int = 0,
                 error_feedback: bool = True):
    """PowerSGD-averaged gradients of every step, the ranks' exact means, and each rank's
    final error vectors."""
    model = SmallNet()
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.005)
    state = comm_hooks.PowerSGDState(group, matrix_approximation_rank=rank_r,
                                     start_powerSGD_iter=start_iter,
                                     use_error_feedback=error_feedback)
    ddp.register_comm_hook(state, comm_hooks.powerSGD_hook)
    out = {}
    for step in range(steps):
        x, y = batch(group.rank, step)
        for i, g in enumerate(_local_gradients(ddp, model, x, y, group.rank)):
            out[f"exact{step}-{i}"] = group.all_reduce_mean(g)
        for p in model.parameters():
            p.grad = None
        _loss(ddp, x, y, group.rank).backward()
        for i, p in enumerate(model.parameters()):
            out[f"psgd{step}-{i}"] = p.grad.copy()
    for index, error in state.error_dict.items():
        out[f"error-{index}"] = error
    out["layout"] = np.array([[b.index, b.offsets[-1]] for b in ddp._buckets])
    order = {id(p): i for i, p in enumerate(model.parameters())}
    out["bucket_params"] = np.array([[order[id(p)], b.index, start] for b in ddp._buckets
                                     for p, start in zip(b.params, b.offsets)])
    out["stats"] = np.array(state.compression_stats()[1:])
    ddp.close()
    return out


# -- the overlapped optimizer step ----------------------------------------------------------
def _optimizer(name: str, model):
    params = list(model.parameters())
    if name == "sgd":
        return eo.SGD(params, lr=0.05)
    if name == "momentum":
        return eo.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    if name == "nesterov":
        return eo.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
    if name == "adam":
        return eo.Adam(params, lr=1e-2, weight_decay=1e-3)
    if name == "adamw":
        return eo.AdamW(params, lr=1e-2, amsgrad=True)
    if name == "groups":  # two parameter groups, one parameter left out of the optimizer
        first = [model.first.weight, model.first.bias, model.extra.weight]
        rest = [model.second.weight, model.second.bias, model.head.weight, model.head.bias]
        return eo.Adam([{"params": first, "lr": 3e-3}, {"params": rest, "weight_decay": 0.1}],
                       lr=1e-2)
    raise ValueError(name)


def train_overlapped(group, optimizer_name: str, overlapped: bool, steps: int = 4,
                     micro_batches: int = 2, input_grad: bool = False,
                     bucket_cap_mb: float = 0.005, powersgd: bool = False):
    """``steps`` steps of ``micro_batches`` accumulated micro-batches (``no_sync`` but the
    last) with an LR scheduler; the optimizer is stepped by DDP (``overlapped``) or after
    backward. Returns the parameters (and with ``input_grad`` the inputs' gradients)."""
    model = SmallNet()
    optimizer = _optimizer(optimizer_name, model)
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=bucket_cap_mb,
                                  optimizer=optimizer if overlapped else None)
    if powersgd:
        ddp.register_comm_hook(comm_hooks.PowerSGDState(group, start_powerSGD_iter=1),
                               comm_hooks.powerSGD_hook)
    scheduler = eo.StepLR(optimizer, step_size=2, gamma=0.5)
    input_grads = []
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(micro_batches):
            x, y = batch(group.rank, step * micro_batches + micro)
            xs = eo.tensor(x, requires_grad=input_grad)
            context = ddp.no_sync() if micro < micro_batches - 1 else contextlib.nullcontext()
            with context:
                residual = ddp(xs, group.rank == 0) - eo.tensor(y)
            eo.mean(residual * residual).backward()
            if input_grad:
                input_grads.append(xs.grad)
        if not overlapped:
            optimizer.step()
        scheduler.step()
    ddp.close()
    return [p.data for p in model.parameters()] + input_grads


def overlapped_against_reference(group, optimizer_name: str):
    """Both trajectories in one job (for the mpi harness)."""
    overlapped = train_overlapped(group, optimizer_name, True)
    reference = train_overlapped(group, optimizer_name, False)
    return {**{f"overlapped{i}": w for i, w in enumerate(overlapped)},
            **{f"reference{i}": w for i, w in enumerate(reference)}}


# -- ZeroRedundancyOptimizer --------------------------------------------------------------
def _zero_or_plain(name: str, model, group, sharded: bool):
    from everyo.distributed import ZeroRedundancyOptimizer

    if name == "groups":
        first = [model.first.weight, model.first.bias, model.extra.weight, model.extra.bias]
        rest = [model.second.weight, model.second.bias, model.head.weight, model.head.bias]
        params, kind, options = [{"params": first, "lr": 3e-3},
                                 {"params": rest, "weight_decay": 0.1}], eo.Adam, {"lr": 1e-2}
    elif name == "momentum":
        params, kind, options = list(model.parameters()), eo.SGD, {"lr": 0.05, "momentum": 0.9}
    else:
        params, kind, options = list(model.parameters()), eo.AdamW, {"lr": 1e-2}
    if sharded:
        return ZeroRedundancyOptimizer(params, optimizer_class=kind, group=group, **options)
    return kind(params, **options)


def train_zero(group, name: str, sharded: bool, steps: int = 4, checkpoint: str = "",
               resume: str = "", resume_sharded: bool = True, overlapped: bool = False):
    """Train SmallNet with DDP averaging and a (sharded or plain) optimizer + StepLR; with
    ``checkpoint``, rank 0 saves the consolidated state after ``steps // 2`` steps; with
    ``resume``, start from that file (parameters and optimizer) and run the other half."""
    model = SmallNet()
    optimizer = _zero_or_plain(name, model, group, sharded if not resume else resume_sharded)
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.005,
                                  optimizer=optimizer if overlapped else None)
    scheduler = eo.StepLR(optimizer, step_size=2, gamma=0.5)
    first = 0
    if resume:
        saved = eo.load(resume)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        first = steps // 2
    for step in range(first, steps):
        optimizer.zero_grad()
        x, y = batch(group.rank, step)
        residual = ddp(eo.tensor(x), group.rank == 0) - eo.tensor(y)
        eo.mean(residual * residual).backward()
        if not overlapped:
            optimizer.step()
        scheduler.step()
        if checkpoint and step + 1 == steps // 2:
            optimizer.consolidate_state_dict(to=0)
            if group.rank == 0:
                eo.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict()}, checkpoint)
            group.barrier()
    ddp.close()
    return [p.data for p in model.parameters()]


def zero_state_bytes(group, layers: int = 8):
    """Adam's state bytes on this rank, sharded and unsharded, after one step of a stack of
    equal layers."""
    from everyo.distributed import ZeroRedundancyOptimizer
    from everyo_dist.zero import state_bytes

    out = []
    for sharded in (True, False):
        model = eo.Sequential(*[eo.Linear(64, 64, seed=i) for i in range(layers)])
        params = list(model.parameters())
        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=eo.Adam, group=group) \
            if sharded else eo.Adam(params)
        for p in params:
            p.grad = np.ones_like(p.data)
        optimizer.step()
        out.append(state_bytes(optimizer))
    return out


def zero_with_different_parameters(group):
    from everyo.distributed import ZeroRedundancyOptimizer

    params = [eo.Parameter(np.zeros((3, 3 + group.rank), np.float32))]
    try:
        ZeroRedundancyOptimizer(params, optimizer_class=eo.Adam, group=group)
        return "no error"
    except DistributedError as exc:
        return str(exc)


def zero_against_plain(group, name: str):
    """Both trajectories in one job (for the mpi harness)."""
    sharded = train_zero(group, name, True)
    plain = train_zero(group, name, False)
    return {**{f"sharded{i}": w for i, w in enumerate(sharded)},
            **{f"plain{i}": w for i, w in enumerate(plain)}}


# -- the constructor's broadcast of rank 0's module states --------------------------------
class SeededNet(eo.Module):
    """Parameters drawn from ``seed`` (float32, a float64 one, a frozen layer whose bias is
    read-only), a BatchNorm's running statistics (float32, int64), a bfloat16 buffer and a
    read-only int8 one."""

    def __init__(self, seed: int):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.first = eo.Linear(48, 8, seed=seed)
        self.norm = eo.BatchNorm1D(8)
        self.norm.weight.data[...] = rng.uniform(0.5, 2.0, 8)
        self.norm.bias.data[...] = rng.standard_normal(8)
        self.frozen = eo.Linear(8, 8, seed=seed + 1)
        for p in self.frozen.parameters():
            p.requires_grad = False
        self.frozen.bias.data.flags.writeable = False  # (as if memory-mapped from a file)
        self.head = eo.Linear(8, 1, seed=seed + 2)
        self.offset = eo.Parameter(rng.standard_normal(1))  # float64
        self.register_buffer("table", rng.standard_normal(5).astype("bfloat16"))
        mask = rng.integers(-100, 100, 7).astype(np.int8)
        mask.flags.writeable = False
        self.register_buffer("mask", mask)

    def forward(self, x, use_extra: bool = False):
        out = self.head(eo.tanh(self.frozen(self.norm(self.first(x)))))
        return out.astype("float64") + self.offset


def _bits(array) -> np.ndarray:
    array = np.asarray(array)
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def _states(model, prefix: str) -> dict:
    return {f"{prefix}:{name}": _bits(value) for name, value in model.state_dict().items()}


def different_seeds(group, steps: int = 3):
    """Each rank builds :class:`SeededNet` from its own seed and runs ``rank + 1`` forwards
    (moving the BatchNorm's statistics) before wrapping it; returns the states before and
    after the wrapper is built, the parameters' version counters then, and the parameters
    after ``steps`` DDP steps of SGD with momentum on this rank's own batches."""
    model = SeededNet(seed=10 * group.rank)
    for step in range(group.rank + 1):
        model(eo.tensor(batch(group.rank, 100 + step)[0]))
    out = _states(model, "before")
    versions = [p._version for p in model.parameters()]
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.0001)
    out.update(_states(model, "after"))
    out["versions"] = np.array([p._version - v for p, v in zip(model.parameters(), versions)])
    optimizer = eo.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05,
                       momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batch(group.rank, step)
        residual = ddp(eo.tensor(x)) - eo.tensor(y.astype(np.float64))
        eo.mean(residual * residual).backward()
        optimizer.step()
    ddp.close()
    out.update({f"trained:{name}": _bits(p.data) for name, p in model.named_parameters()})
    return out


def different_modules(group):
    """DDP of modules that differ between the ranks (rank 1's has a wider layer): the
    error of the constructor's broadcast."""
    try:
        DistributedDataParallel(eo.Linear(4, 3 + group.rank, seed=0), group)
        return "no error"
    except DistributedError as exc:
        return str(exc)
