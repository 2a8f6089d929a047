"""DistributedDataParallel after ``model.to("float64")`` past the first step (the buckets are
rebuilt: no float64 gradient rounds through float32), and forwards returning dataclasses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import everyo as eo
from everyo.distributed import DistributedDataParallel, DistributedError, comm_hooks, init


def test_buckets_are_rebuilt_after_model_to_float64_past_the_first_step():
    # the old float32 buckets rounded the float64 gradients through float32
    x = np.random.default_rng(0).standard_normal((4, 3))
    with init(backend="shm", rank=0, world_size=1) as group:
        model = eo.Sequential(eo.Linear(3, 5, seed=0), eo.Tanh(), eo.Linear(5, 2, seed=1))
        ddp = DistributedDataParallel(model, group)
        (ddp(eo.tensor(x.astype(np.float32))) ** 2).sum().backward()
        model.to("float64")
        (ddp(eo.tensor(x)) ** 2).sum().backward()
        averaged = [p.grad for p in model.parameters()]
        ddp.close()
    for p in model.parameters():
        p.grad = None
    (model(eo.tensor(x)) ** 2).sum().backward()  # one rank: the average is the gradient
    for got, p in zip(averaged, model.parameters()):
        assert got.dtype == np.float64 and got.tobytes() == p.grad.tobytes()


def test_a_hooked_wrapper_refuses_a_dtype_change_by_name():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = eo.Linear(3, 2, seed=0)
        ddp = DistributedDataParallel(model, group)
        ddp.register_comm_hook(group, comm_hooks.fp16_compress_hook)
        try:
            ddp(eo.ones((2, 3))).sum().backward()
            model.to("float64")
            with pytest.raises(DistributedError, match=r"weight.*changed dtype.*model\.to"):
                ddp(eo.ones((2, 3), dtype="float64"))
        finally:
            ddp.close()


@dataclasses.dataclass
class Output:
    logits: object
    note: str = "x"


class ReturnsDataclass(eo.Module):
    def __init__(self):
        super().__init__()
        self.layer = eo.Linear(3, 2, seed=0)

    def forward(self, x):
        return Output(self.layer(x))


class ReturnsOpaque(ReturnsDataclass):
    def forward(self, x):
        holder = type("Holder", (), {})()
        holder.logits = self.layer(x)
        return holder


def test_a_dataclass_output_is_searched_for_tensors():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = ReturnsDataclass()
        ddp = DistributedDataParallel(model, group)
        try:
            ddp(eo.ones((4, 3))).logits.sum().backward()
            assert model.layer.weight.grad.ravel().tolist() == [4.0] * 6
        finally:
            ddp.close()


def test_an_output_without_a_tensor_found_is_named_not_called_unwrapped():
    with init(backend="shm", rank=0, world_size=1) as group:
        ddp = DistributedDataParallel(ReturnsOpaque(), group)
        try:
            out = ddp(eo.ones((4, 3)))
            with pytest.raises(DistributedError, match=r"returned a Holder, in which it found "
                                                       r"no Tensor.*dataclasses"):
                out.logits.sum().backward()
        finally:
            ddp.close()
