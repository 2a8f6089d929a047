"""Differential fuzzer: random in-place writes after a forward pass, then a backward, in
EveryO and in PyTorch (float64). Whatever the writes touch (a leaf, a constant operand, an
intermediate value, or a view of one), EveryO refuses the backward whenever PyTorch does, or
else gives the gradients of the values the forward saw; and where PyTorch accepts, EveryO
accepts too with PyTorch's gradients. Never a gradient computed from values the forward
pass never saw, and no refusal PyTorch would not make. (EveryO may accept where PyTorch
refuses: its ``relu`` reads its input, not its output, so a write to the output is harmless.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import everyo as eo
from support.fuzz_settings import FUZZ

TOL = 1e-9

# name -> (ours, theirs) of the newest value and a partner of the same shape
BINARY = {
    "mul": (lambda v, p: v * p, lambda t, v, p: v * p),
    "add": (lambda v, p: v + p, lambda t, v, p: v + p),
    "sub": (lambda v, p: p - v, lambda t, v, p: p - v),
    "div": (lambda v, p: v / p, lambda t, v, p: v / p),
    "div_by": (lambda v, p: p / (v * v + 1.0), lambda t, v, p: p / (v * v + 1.0)),
    "maximum": (lambda v, p: eo.maximum(v, p + 0.01), lambda t, v, p: t.maximum(v, p + 0.01)),
    "matmul_t": (lambda v, p: v @ p.T, lambda t, v, p: v @ p.T),
    "einsum": (lambda v, p: eo.einsum("ij,kj->ik", v, p),
               lambda t, v, p: t.einsum("ij,kj->ik", v, p)),
}
UNARY = {
    "exp": (eo.exp, lambda t, v: v.exp()),
    "tanh": (eo.tanh, lambda t, v: v.tanh()),
    "sigmoid": (eo.sigmoid, lambda t, v: v.sigmoid()),
    "square": (lambda v: v * v, lambda t, v: v * v),
    "cube": (lambda v: v ** 3, lambda t, v: v ** 3),
    "relu": (eo.relu, lambda t, v: t.relu(v)),
    "abs": (eo.abs, lambda t, v: v.abs()),
    "scale": (lambda v: v * 0.5, lambda t, v: v * 0.5),
    "softmax": (lambda v: eo.softmax(v, axis=-1), lambda t, v: t.softmax(v, dim=-1)),
    "sqrt": (lambda v: eo.sqrt(v * v + 0.5), lambda t, v: t.sqrt(v * v + 0.5)),
    "sum_keep": (lambda v: eo.sum(v, axis=-1, keepdims=True) + v,
                 lambda t, v: v.sum(dim=-1, keepdim=True) + v),
    "row": (lambda v: v[:1] * 1.0 + v, lambda t, v: v[:1] * 1.0 + v),
}
# in-place writes on a tensor (or a view of one): (ours, theirs)
WRITES = {
    "add_": (lambda x: x.add_(0.5), lambda x: x.add_(0.5)),
    "mul_": (lambda x: x.mul_(2.0), lambda x: x.mul_(2.0)),
    "zero_": (lambda x: x.zero_(), lambda x: x.zero_()),
    "clamp_": (lambda x: x.clamp_(-0.1, 0.1), lambda x: x.clamp_(-0.1, 0.1)),
    "setitem": (lambda x: x.__setitem__(0, 1.5), lambda x: x.__setitem__(0, 1.5)),
}
VIEWS = {
    "whole": lambda x: x,
    "first row": lambda x: x[0],
    "last column": lambda x: x[:, -1:],
}


def _plan(draw):
    """The program, as choices both frameworks replay: the forward's steps, the writes."""
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))),
                          draw(st.sampled_from(["leaf", "constant"])), draw(st.integers(0, 1))))
        else:
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY)))))
    writes = []
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["leaf", "constant", "value"]))
        writes.append((target, draw(st.integers(0, 9)), draw(st.sampled_from(sorted(VIEWS))),
                       draw(st.sampled_from(sorted(WRITES)))))
    return steps, writes


def _run(plan, arrays, framework, torch, write):
    """Replay ``plan``; returns (gradients of the leaves, or the refusal raised)."""
    ours = framework == "ours"

    def make(array, grad):
        if ours:
            return eo.tensor(array.copy(), requires_grad=grad)
        return torch.tensor(array.copy(), requires_grad=grad)

    leaves = [make(a, True) for a in arrays["leaves"]]
    constants = [make(a, False) for a in arrays["constants"]]
    values = [leaves[0]]
    steps, writes = plan
    for step in steps:
        v = values[-1]
        if step[0] == "unary":
            f = UNARY[step[1]]
            values.append(f[0](v) if ours else f[1](torch, v))
        else:
            _, name, pool, k = step
            partner = (leaves if pool == "leaf" else constants)[k]
            f = BINARY[name]
            out = f[0](v, partner) if ours else f[1](torch, v, partner)
            values.append(out.reshape(v.shape) if name in ("matmul_t", "einsum") else out)
    loss = (values[-1] * make(arrays["weights"], False)).sum()
    if write:
        for target, k, view, method in writes:
            pool = {"leaf": leaves, "constant": constants, "value": values}[target]
            tensor = VIEWS[view](pool[k % len(pool)])
            no_grad = eo.no_grad() if ours else torch.no_grad()
            with no_grad:
                WRITES[method][0 if ours else 1](tensor)
    refusal = eo.EveryOError if ours else RuntimeError
    try:
        grads = (eo.grad if ours else torch.autograd.grad)(loss, leaves, allow_unused=True)
    except refusal as exc:
        return exc
    return [None if g is None else np.asarray(g.data if ours else g.detach().numpy())
            for g in grads]


def _equal(ours, theirs, what):
    assert len(ours) == len(theirs)
    for i, (g, tg) in enumerate(zip(ours, theirs)):
        if tg is None:
            assert g is None or not g.any(), f"{what}: leaf {i}"
            continue
        g = np.zeros_like(tg) if g is None else g
        scale = max(1.0, float(np.abs(tg).max(initial=0.0)))
        np.testing.assert_allclose(g, tg, rtol=TOL, atol=TOL * scale, err_msg=f"{what}, leaf {i}")


@given(data=st.data())
@FUZZ
def test_in_place_writes_after_a_forward_raise_when_pytorch_does(torch, data):
    draw = data.draw
    plan = _plan(draw)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (3, 3)  # square: matmul_t and einsum keep the shape
    arrays = {"leaves": [rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
                         for _ in range(2)],
              "constants": [rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
                            for _ in range(2)],
              "weights": rng.standard_normal(shape)}
    ours = _run(plan, arrays, "ours", torch, write=True)
    theirs = _run(plan, arrays, "theirs", torch, write=True)
    unwritten = _run(plan, arrays, "theirs", torch, write=False)
    assert not isinstance(unwritten, Exception)
    if isinstance(theirs, Exception):
        if isinstance(ours, Exception):
            event("both refused")
        else:  # accepted: then with the values the forward saw
            event("PyTorch refused, EveryO's gradient is right")
            _equal(ours, unwritten, "PyTorch refused; EveryO's gradient")
        return
    if isinstance(ours, Exception):
        pytest.fail(f"EveryO refused what PyTorch accepts: {ours}")
    event("both accepted")
    _equal(ours, theirs, "gradient")
