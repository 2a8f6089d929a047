"""Worker functions the everyo-dist tests hand to ``spawn`` (they must be importable by name)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import everyo as eo
from everyo.distributed import average_gradients, shard_indices

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
import distributed_training as example  # noqa: E402  (the documented example's worker)


def rank_data(rank: int, shape, dtype, seed: int = 0) -> np.ndarray:
    """The array rank ``rank`` contributes: distinct per rank, reproducible in the parent."""
    rng = np.random.default_rng(seed * 1000 + rank)
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(dtype)


def primitives(group, shapes):
    """Every collective on every shape, float32 and float64, plus an integer sum."""
    out = {"rank": group.rank, "world_size": group.world_size, "is_main": group.is_main}
    for dtype in ("float32", "float64"):
        for index, shape in enumerate(shapes):
            mine = rank_data(group.rank, shape, dtype, seed=index)
            key = f"{dtype}-{index}"
            out["sum-" + key] = group.all_reduce_sum(mine)
            out["mean-" + key] = group.all_reduce_mean(mine)
            out["gather-" + key] = group.all_gather(mine)
            out["bcast-" + key] = group.broadcast(mine, src=group.world_size - 1)
            group.barrier()
    out["int-sum"] = group.all_reduce_sum(np.arange(5, dtype=np.int64) * (group.rank + 1))
    out["scalar-sum"] = group.all_reduce_sum(np.float64(group.rank + 0.5))
    out["empty-mean"] = group.all_reduce_mean(np.zeros((0, 3), np.float32))
    out["empty-gather"] = group.all_gather(np.zeros(0, np.int8))
    out["tensor-mean"] = group.all_reduce_mean(eo.tensor([float(group.rank), 1.0]))
    in_place = rank_data(group.rank, (300_000,), "float32", seed=2)
    returned = group.all_reduce_mean(in_place, out=in_place)
    out["in-place-mean"], out["in-place-is-out"] = in_place, returned is in_place
    return out


def mismatched_op(group):
    if group.rank == 0:
        group.all_reduce_mean(np.zeros(4, np.float32))
    else:
        group.barrier()


def mismatched_shape(group):
    group.all_reduce_mean(np.zeros(4 + group.rank, np.float32))


def skip_collective(group, missing_rank: int):
    if group.rank == missing_rank:
        time.sleep(60)
    group.all_reduce_sum(np.ones(3, np.float32))


def _write_pid(directory):
    path = os.path.join(directory, str(os.getpid()))
    with open(path, "w") as file:
        file.write(str(os.getpid()))
    os.rename(path, path + ".pid")  # appears complete or not at all


def raise_on_rank(group, failing_rank: int, pid_dir):
    _write_pid(pid_dir)
    group.barrier()
    if group.rank == failing_rank:
        raise ValueError(f"boom from rank {group.rank}")
    group.barrier()  # the others wait here until the parent stops them
    time.sleep(60)


def sigkill_on_rank(group, failing_rank: int, pid_dir):
    _write_pid(pid_dir)
    group.barrier()
    if group.rank == failing_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    group.all_reduce_mean(np.ones(1000, np.float32))
    time.sleep(60)


# -- the documented example: a three-layer MLP trained with SGD -------------------------------
STEPS = 20


def make_data(rows: int = 256, features: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((rows, features)).astype(np.float32)
    targets = np.sin(inputs[:, :2] @ np.float32([[1.0], [-0.5]])).astype(np.float32)
    return inputs, targets


def build_model(features: int = 8, hidden: int = 32):
    model = eo.Sequential(eo.Linear(features, hidden), eo.ReLU(), eo.Linear(hidden, hidden),
                          eo.ReLU(), eo.Linear(hidden, 1))
    rng = np.random.default_rng(42)  # same weights on every rank and in the reference
    for param in model.parameters():
        param.data = (rng.standard_normal(param.data.shape) * 0.3).astype(np.float32)
    return model


def _the_example(steps: int):
    """The documented example's module (examples/distributed_training.py), set to this file's
    model and step count: its functions read both from their module."""
    example.build_model, example.steps = build_model, steps
    return example


def train_worker(group, inputs, targets, steps=STEPS):
    """The documented example's worker, imported rather than copied."""
    return _the_example(steps).worker(group, inputs, targets)


def train_single_process(inputs, targets, steps=STEPS):
    """The example's full-batch training in this process: what data-parallel training must
    match (imported too, so the reference and the worker cannot drift apart)."""
    return _the_example(steps).single_process(inputs, targets)


def report_blas_pools(group):
    from everyo_dist.blas import blas_thread_pools

    return [threads for _, threads in blas_thread_pools()]


class BranchyModel(eo.Module):
    """``build_model()`` plus a branch that only some ranks use: an unused parameter."""

    def __init__(self):
        super().__init__()
        self.body = build_model()
        self.extra = eo.Linear(8, 1, seed=3)

    def forward(self, x, use_extra: bool):
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


class WideBranchyModel(eo.Module):
    """``BranchyModel``'s shape with an 8 MiB hidden weight (2048 x 1024), which the core
    computes in 7 row blocks and DistributedDataParallel sends as 7 segments."""

    def __init__(self):
        super().__init__()
        self.inner = eo.Linear(8, 2048, seed=5)
        self.wide = eo.Linear(2048, 1024, seed=6)
        self.head = eo.Linear(1024, 1, seed=7)
        self.extra = eo.Linear(8, 1, seed=3)

    def forward(self, x, use_extra: bool):
        out = self.head(eo.tanh(self.wide(eo.tanh(self.inner(x)))))
        return out + self.extra(x) if use_extra else out


def ddp_or_average(group, inputs, targets, use_ddp: bool, micro_batches: int = 2,
                   steps: int = 3, amp: bool = False, wide: bool = False,
                   bucket_cap_mb: float | None = 0.001):
    """Train with DistributedDataParallel (tiny buckets by default, ``no_sync`` for all but
    the last micro-batch) or with plain backward + ``average_gradients``; rank 1 never uses
    the extra branch. With ``amp``: autocast forward and a GradScaler sharing the group; with
    ``wide``: ``WideBranchyModel``, whose large weight's rows are sent as they are computed."""
    from everyo.distributed import DistributedDataParallel

    model = WideBranchyModel() if wide else BranchyModel()
    params = list(model.parameters())
    optimizer = eo.SGD(params, lr=0.05)
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=bucket_cap_mb) if use_ddp \
        else None
    scaler = eo.GradScaler(init_scale=2.0**10, group=group) if amp else None
    rows = shard_indices(len(inputs), group.rank, group.world_size)
    batches = np.array_split(rows, micro_batches)
    for _ in range(steps):
        optimizer.zero_grad()
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            xs, ys = eo.tensor(inputs[batch]), eo.tensor(targets[batch])
            context = ddp.no_sync() if use_ddp and not last else contextlib.nullcontext()
            with context, (eo.autocast() if amp else contextlib.nullcontext()):
                prediction = (ddp or model)(xs, group.rank == 0)
            residual = prediction.astype("float32") - ys if amp else prediction - ys
            loss = eo.mean(residual * residual)
            (scaler.scale(loss) if amp else loss).backward()
        if not use_ddp:
            average_gradients(params, group)
        if amp:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    if ddp is not None:
        ddp.close()
    return [p.data for p in params]



def wide_ddp_or_average(group, inputs, targets, amp: bool, bucket_cap_mb, use_ddp: bool):
    """``ddp_or_average`` with ``WideBranchyModel`` (``use_ddp`` last, for the tests' helper)."""
    return ddp_or_average(group, inputs, targets, use_ddp, amp=amp, wide=True,
                          bucket_cap_mb=bucket_cap_mb)


def two_forwards_one_backward(group, inputs, use_ddp: bool):
    """One loss summed over two forwards through the wrapper; only the second uses the extra
    branch (whose bucket is reduced first). Returns the averaged gradients."""
    from everyo.distributed import DistributedDataParallel

    model = BranchyModel()
    x = eo.tensor(inputs[group.rank::group.world_size])
    if use_ddp:
        ddp = DistributedDataParallel(model, group, bucket_cap_mb=1e-6)  # a bucket each
        (eo.sum(ddp(x, False)) + eo.sum(ddp(x, True))).backward()
        ddp.close()
    else:
        (eo.sum(model(x, False)) + eo.sum(model(x, True))).backward()
        average_gradients(model.parameters(), group)
    return [p.grad for p in model.parameters()]


def large_integer_sums(group, length: int):
    """``all_reduce_sum`` of integers too large for a float64 sum to keep exact, and of
    integers whose sum overflows their dtype; returns ``{dtype: (input, result)}``."""
    results = {}
    for dtype in (np.int64, np.uint64, np.int32, np.uint8):
        info = np.iinfo(dtype)
        rng = np.random.default_rng(group.rank)
        values = rng.integers(info.max // 4, info.max, size=length, dtype=dtype, endpoint=True)
        values[:2] = [info.max, info.max // 3]
        results[np.dtype(dtype).name] = (values, group.all_reduce_sum(values))
    return results


class TiedModel(eo.Module):
    """An encoder and decoder sharing one weight: it gets two gradients per backward."""

    def __init__(self):
        super().__init__()
        self.encoder = eo.Linear(8, 8, seed=0)
        self.decoder = eo.Linear(8, 1, seed=1)
        self.tied = eo.Linear(8, 8, seed=2)
        self.tied.weight = self.encoder.weight

    def forward(self, x):
        return self.decoder(eo.tanh(self.tied(eo.tanh(self.encoder(x)))))


def tied_weights_accumulated(group, inputs, use_ddp: bool):
    """Three micro-batches accumulated into .grad (``no_sync`` but the last), then averaged
    by DistributedDataParallel or by ``average_gradients``; returns the gradients."""
    from everyo.distributed import DistributedDataParallel

    model = TiedModel()
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=1e-6) if use_ddp else None
    rows = shard_indices(len(inputs), group.rank, group.world_size)
    batches = np.array_split(rows, 3)
    for index, batch in enumerate(batches):
        last = index == len(batches) - 1
        context = ddp.no_sync() if use_ddp and not last else contextlib.nullcontext()
        with context:
            loss = eo.mean((ddp or model)(eo.tensor(inputs[batch])) ** 2)
        loss.backward()
    if ddp is not None:
        ddp.close()
    else:
        average_gradients(model.parameters(), group)
    return [p.grad for p in model.parameters()]


WIDE_LENGTHS = (0, 1, 2, 7, 1001, 70001)


def wide_data(rank: int, dtype, length: int, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s contribution, spanning sixteen orders of magnitude (floats; float16 a
    few, to stay finite) or the whole range (integers, so sums wrap): the order of the
    float64 additions shows in the last bits."""
    rng = np.random.default_rng([seed, rank, length])
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, length, dtype=dtype, endpoint=True)
    spread = 2 if dtype.itemsize == 2 else 8
    return (rng.standard_normal(length) * 10.0 ** rng.integers(-spread, spread + 1, length)
            ).astype(dtype)


def wide_reductions(group, dtypes=("float64", "float32", "float16", "int32", "int64",
                                   "uint64"), lengths=WIDE_LENGTHS):
    """Sum (and, for floats, mean) of :func:`wide_data` for every dtype and length."""
    out = {}
    for dtype in dtypes:
        for length in lengths:
            mine = wide_data(group.rank, dtype, length)
            out[f"sum-{dtype}-{length}"] = group.all_reduce_sum(mine)
            if np.dtype(dtype).kind == "f":
                out[f"mean-{dtype}-{length}"] = group.all_reduce_mean(mine)
    return out


# -- IEEE special values and one rounding for 16-bit gradients (#24.3) -------------------------
def ieee_data(rank: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s contributions: infinities of both signs (their sum is nan), NaN, and
    finite values whose float64 sum overflows the dtype (float16 above 65504, float32 above
    3.4e38) while their mean does not."""
    big16, big32 = np.float16(60000.0), np.float32(3e38)
    signed = np.float32([np.inf, np.inf, -np.inf, 1.0, np.nan])
    if rank == 1:
        signed = np.float32([np.inf, -np.inf, -np.inf, np.inf, 2.0])
    return {"signed32": signed, "signed64": signed.astype(np.float64),
            "signed16": signed.astype(np.float16),
            "big16": np.full(7, big16), "big32": np.full(7, big32),
            "huge64": np.full(3, 1.5e308)}


def ieee_collectives(group):
    """Sums and means of :func:`ieee_data` and ``average_gradients`` of its 16- and 32-bit
    rows, under warnings-as-errors; then the group is used once more (a collective that
    raised would have broken a tcp group)."""
    import warnings

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for key, value in ieee_data(group.rank).items():
            out[f"sum-{key}"] = group.all_reduce_sum(value)
            out[f"mean-{key}"] = group.all_reduce_mean(value)
        grads = [eo.Parameter(np.zeros(5, np.float16)), eo.Parameter(np.zeros(5, np.float32))]
        grads[0].grad, grads[1].grad = ieee_data(group.rank)["signed16"], \
            ieee_data(group.rank)["signed32"]
        average_gradients(grads, group)
        out["average16"], out["average32"] = grads[0].grad, grads[1].grad
    out["after"] = group.all_reduce_sum(np.ones(3, np.float32))
    return out


def kernels_announced(make_group):
    """This rank's kernel fingerprint, and where and how its group refused it: ``stage`` is
    ``init`` when creating the group (``make_group()``) raised, ``collective`` when the first
    collective (an all-reduce, as DDP's first step) did, "" when neither; then the error's
    class and message and how long that stage took."""
    from everyo_dist.errors import DistributedError

    out = {"kernels": np.array(eo.kernels.fingerprint()), "stage": np.array(""),
           "error": np.array(""), "message": np.array("")}
    started = time.monotonic()
    stage = "init"
    try:
        with make_group() as group:
            out["rank"], out["backend"] = np.array(group.rank), np.array(group.backend)
            stage, started = "collective", time.monotonic()
            group.all_reduce_mean(np.ones(4, np.float32))
    except DistributedError as exc:
        out["stage"], out["error"] = np.array(stage), np.array(type(exc).__name__)
        out["message"] = np.array(str(exc))
    out["seconds"] = np.array(time.monotonic() - started)
    return out


class MixedPrecisionModel(eo.Module):
    """float32, float16 and bfloat16 layers in one model (an autocast-free mixed model): large
    enough that rounding the 16-bit means twice (via float32) would change some elements."""

    def __init__(self):
        super().__init__()
        self.first = eo.Linear(8, 256, seed=11)
        self.half = eo.Linear(256, 2048, seed=12).to("float16")
        self.brain = eo.Linear(2048, 1, seed=13).to("bfloat16")

    def forward(self, x):
        h = eo.tanh(self.first(x))
        h = eo.tanh(self.half(h.astype("float16"))).astype("bfloat16")
        return self.brain(h).astype("float32")


def mixed_precision_gradients(group):
    """The gradients of :class:`MixedPrecisionModel` (and of one more float16 parameter)
    averaged by ``average_gradients``, the model's by DistributedDataParallel, and each rank's
    raw gradients (for the one-rounding reference); 16-bit arrays as their uint16 bits."""
    from everyo.distributed import DistributedDataParallel

    rng = np.random.default_rng(group.rank)
    inputs = eo.tensor(rng.standard_normal((32, 8)).astype(np.float32))
    # ranks' gradients of different magnitudes: their exact sums need more bits than a
    # float32 keeps, so a mean rounded via float32 sometimes lands on a float16 midpoint
    # (model gradients are structured and rarely do: a random float16 gradient is added)
    weight = (1.0, 2.0**6, 2.0**12)[group.rank % 3]
    model = MixedPrecisionModel()
    (eo.mean(model(inputs) ** 2) * weight).backward()
    extra = eo.Parameter(np.zeros(1 << 20, np.float16))
    extra.grad = (rng.standard_normal(extra.data.size) * 1e-2 * 256.0 ** (group.rank % 3)
                  ).astype(np.float16)
    params = [*model.parameters(), extra]
    raw = [p.grad.copy() for p in params]
    average_gradients(params, group)
    averaged = [p.grad.copy() for p in params]
    for param in model.parameters():
        param.grad = None
    for param in model.brain.parameters():  # DDP has no bfloat16 buckets: compare the rest
        param.requires_grad = False
    ddp = DistributedDataParallel(model, group)
    (eo.mean(ddp(inputs) ** 2) * weight).backward()
    ddp.close()

    def bits(array):
        return array.view(np.uint16) if array.dtype.itemsize == 2 else array

    out = {}
    for index, param in enumerate(params):
        out[f"raw{index}"], out[f"average{index}"] = bits(raw[index]), bits(averaged[index])
        if param.grad is not None and param is not extra:
            out[f"ddp{index}"] = bits(param.grad)
        out[f"dtype{index}"] = np.array(str(param.data.dtype))
    return out
