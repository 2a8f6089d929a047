"""Differential fuzzer: random op programs (broadcasting, views, indexing, reductions, matmul,
constants written in place before their use)
run in EveryO and in PyTorch, float64. The values, the first derivatives and the second
derivatives (a Hessian-vector product through ``create_graph=True``) agree, or both refuse: a
program PyTorch refuses (shapes that do not broadcast, matmul dimensions that differ) is an
``EveryOError`` in EveryO, never a raw NumPy exception and never a result."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import everyo as eo
from support.fuzz_settings import FUZZ

TOL = 1e-9

# name -> (EveryO, PyTorch) on one operand; inputs stay finite for any finite input.
UNARY = {
    "exp_tanh": (lambda x: eo.exp(eo.tanh(x)), lambda t, x: t.exp(t.tanh(x))),
    "tanh": (eo.tanh, lambda t, x: t.tanh(x)),
    "sigmoid": (eo.sigmoid, lambda t, x: t.sigmoid(x)),
    "neg": (lambda x: -x, lambda t, x: -x),
    "square": (lambda x: x * x, lambda t, x: x * x),
    "cube": (lambda x: x ** 3, lambda t, x: x ** 3),
    "log1p_square": (lambda x: eo.log(x * x + 1.0), lambda t, x: t.log(x * x + 1.0)),
    "sqrt_shifted": (lambda x: eo.sqrt(x * x + 0.5), lambda t, x: t.sqrt(x * x + 0.5)),
    "scale": (lambda x: 0.5 * x - 1.25, lambda t, x: 0.5 * x - 1.25),
    "reciprocal": (lambda x: 1.0 / (x * x + 1.0), lambda t, x: 1.0 / (x * x + 1.0)),
    "softmax_last": (lambda x: eo.softmax(x, axis=-1), lambda t, x: t.softmax(x, dim=-1)),
    "log_softmax_last": (lambda x: eo.log_softmax(x, axis=-1),
                         lambda t, x: t.log_softmax(x, dim=-1)),
    # Kinks (abs, relu, clip's bounds) are away from the standard-normal samples almost surely.
    "abs": (eo.abs, lambda t, x: x.abs()),
    "relu": (eo.relu, lambda t, x: t.relu(x)),
    "clip": (lambda x: eo.clip(x, -0.7, 0.9), lambda t, x: x.clamp(-0.7, 0.9)),
    "cumsum_last": (lambda x: eo.cumsum(x, axis=-1), lambda t, x: x.cumsum(dim=-1)),
    "var_last": (lambda x: eo.var(x, axis=-1), lambda t, x: x.var(dim=-1, unbiased=False)),
    "where_positive": (lambda x: eo.where(x > 0, x * 2.0, x * x),
                       lambda t, x: t.where(x > 0, x * 2.0, x * x)),
    "leaky_relu": (lambda x: eo.leaky_relu(x, 0.1), lambda t, x: t.nn.functional.leaky_relu(x, 0.1)),
    "gelu": (eo.gelu, lambda t, x: t.nn.functional.gelu(x)),
    "softplus": (eo.softplus, lambda t, x: t.nn.functional.softplus(x)),
}
NEEDS_AXIS = ("softmax", "log_softmax", "cumsum", "var")

BINARY = {
    "add": (lambda a, b: a + b, lambda t, a, b: a + b),
    "sub": (lambda a, b: a - b, lambda t, a, b: a - b),
    "mul": (lambda a, b: a * b, lambda t, a, b: a * b),
    "div": (lambda a, b: a / (b * b + 0.5), lambda t, a, b: a / (b * b + 0.5)),
    # 0.01 apart at least: no ties, whose gradient conventions are not compared here.
    "maximum": (lambda a, b: eo.maximum(a, b + 0.01), lambda t, a, b: t.maximum(a, b + 0.01)),
    "minimum": (lambda a, b: eo.minimum(a, b + 0.01), lambda t, a, b: t.minimum(a, b + 0.01)),
}

# in-place writes, the same call in both frameworks
IN_PLACE = {
    "add_": lambda t: t.add_(0.5),
    "mul_": lambda t: t.mul_(-2.0),
    "clamp_": lambda t: t.clamp_(-0.5, 0.5),
    "fill_": lambda t: t.fill_(0.25),
    "setitem": lambda t: t.__setitem__(..., 1.5),
}


class Program:
    """The twin values of one program: ``ours`` (EveryO) and ``theirs`` (PyTorch)."""

    def __init__(self, torch, rng):
        self.torch, self.rng = torch, rng
        self.leaves_ours, self.leaves_theirs = [], []
        self.ours, self.theirs = [], []

    def leaf(self, shape):
        array = self.rng.standard_normal(shape)
        ours = eo.tensor(array.copy(), requires_grad=True)
        theirs = self.torch.tensor(array.copy(), requires_grad=True)
        self.leaves_ours.append(ours)
        self.leaves_theirs.append(theirs)
        return ours, theirs

    def push(self, ours, theirs):
        assert tuple(ours.shape) == tuple(theirs.shape), (ours.shape, tuple(theirs.shape))
        self.ours.append(ours)
        self.theirs.append(theirs)


def _broadcast_partner(draw, shape):
    """A shape that broadcasts against ``shape``: dims dropped from the front, some set to 1."""
    keep = draw(st.integers(0, len(shape)))
    tail = list(shape[len(shape) - keep:])
    return tuple(1 if draw(st.booleans()) else d for d in tail)


def _any_shape(draw):
    return tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))


def _step(draw, program):
    """Apply one random step to the newest value (a step both frameworks refuse adds none)."""
    torch = program.torch
    x, tx = program.ours[-1], program.theirs[-1]
    kind = draw(st.sampled_from(["unary", "binary", "binary_any", "reduce", "reshape",
                                 "swapaxes", "slice", "index", "matmul", "matmul_any",
                                 "concat", "reuse", "permute", "newaxis", "flip", "gather",
                                 "scalar_index", "einsum", "pad", "written_constant"]))
    if kind == "unary":
        name = draw(st.sampled_from(sorted(UNARY)))
        if name.startswith(NEEDS_AXIS) and x.ndim == 0:
            return
        ours, theirs = UNARY[name]
        program.push(ours(x), theirs(torch, tx))
    elif kind in ("binary", "binary_any"):
        shape = _broadcast_partner(draw, x.shape) if kind == "binary" else _any_shape(draw)
        other, tother = program.leaf(shape)
        ours, theirs = BINARY[draw(st.sampled_from(sorted(BINARY)))]
        swap = draw(st.booleans())
        a, b, ta, tb = (other, x, tother, tx) if swap else (x, other, tx, tother)
        _both(program, lambda: ours(a, b), lambda: theirs(torch, ta, tb))
    elif kind == "reduce" and x.ndim:
        axis = draw(st.integers(-x.ndim, x.ndim - 1))
        keep = draw(st.booleans())
        if draw(st.booleans()):
            program.push(eo.sum(x, axis=axis, keepdims=keep), tx.sum(dim=axis, keepdim=keep))
        else:
            program.push(eo.mean(x, axis=axis, keepdims=keep), tx.mean(dim=axis, keepdim=keep))
    elif kind == "reshape":
        size = int(np.prod(x.shape))
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        first = draw(st.sampled_from(divisors))
        program.push(x.reshape(first, size // first), tx.reshape(first, size // first))
    elif kind == "swapaxes" and x.ndim >= 2:
        a, b = draw(st.permutations(range(x.ndim)))[:2]
        program.push(eo.swapaxes(x, a, b), tx.swapaxes(a, b))
    elif kind == "slice" and x.ndim and x.shape[-1] > 1:
        start = draw(st.integers(0, x.shape[-1] - 1))
        step = draw(st.integers(1, 2))
        program.push(x[..., start::step], tx[..., start::step])
    elif kind == "index" and x.ndim and x.shape[0] > 0:
        rows = draw(st.lists(st.integers(0, x.shape[0] - 1), min_size=1, max_size=5))
        index = np.array(rows)
        program.push(x[index], tx[torch.tensor(index)])
    elif kind in ("matmul", "matmul_any") and x.ndim:
        inner = x.shape[-1] if kind == "matmul" else draw(st.integers(1, 4))
        weight, tweight = program.leaf((inner, draw(st.integers(1, 4))))
        _both(program, lambda: eo.matmul(x, weight), lambda: torch.matmul(tx, tweight))
    elif kind == "concat" and x.ndim:
        axis = draw(st.integers(0, x.ndim - 1))
        other, tother = program.leaf(x.shape)
        program.push(eo.concatenate([x, other], axis=axis), torch.cat([tx, tother], dim=axis))
    elif kind == "permute" and x.ndim >= 2:
        order = draw(st.permutations(range(x.ndim)))
        program.push(x.transpose(tuple(order)), tx.permute(*order))
    elif kind == "newaxis":
        program.push(x[None], tx[None])
    elif kind == "flip" and x.ndim:
        program.push(x[..., ::-1], tx.flip(-1))
    elif kind == "scalar_index" and x.ndim:
        i = draw(st.integers(-x.shape[0], x.shape[0] - 1))
        program.push(x[i], tx[i])
    elif kind == "gather" and x.ndim:
        axis = draw(st.integers(0, x.ndim - 1))
        shape = list(x.shape)
        shape[axis] = draw(st.integers(1, 4))
        index = program.rng.integers(0, x.shape[axis], shape)
        program.push(eo.gather(x, axis, index), torch.gather(tx, axis, torch.tensor(index)))
    elif kind == "einsum" and x.ndim == 2:
        other, tother = program.leaf((x.shape[1], draw(st.integers(1, 3))))
        program.push(eo.einsum("ij,jk->ik", x, other), torch.einsum("ij,jk->ik", tx, tother))
    elif kind == "pad" and x.ndim:
        width = [(0, 0)] * (x.ndim - 1) + [(draw(st.integers(0, 2)), draw(st.integers(0, 2)))]
        program.push(eo.pad(x, width), torch.nn.functional.pad(tx, width[-1]))
    elif kind == "written_constant":
        # A constant (no gradient) written in place, whole or through a view, then used:
        # both frameworks compute with the written values.
        array = program.rng.standard_normal(_broadcast_partner(draw, x.shape))
        ours, theirs = eo.tensor(array.copy()), torch.tensor(array.copy())
        write = draw(st.sampled_from(sorted(IN_PLACE)))
        view = draw(st.booleans()) and array.ndim > 0
        for t in (ours, theirs):
            IN_PLACE[write](t[0] if view else t)
        name = draw(st.sampled_from(sorted(BINARY)))
        _both(program, lambda: BINARY[name][0](x, ours), lambda: BINARY[name][1](torch, tx, theirs))
    elif kind == "reuse" and len(program.ours) > 1:
        # Combine with an earlier value: a diamond in the graph (its gradient is accumulated).
        k = draw(st.integers(0, len(program.ours) - 2))
        _both(program, lambda: x * 0.5 + program.ours[k].sum(),
                     lambda: tx * 0.5 + program.theirs[k].sum())


def _both(program, ours, theirs):
    """Run a step that PyTorch may refuse: then EveryO must refuse with an EveryOError."""
    try:
        expected = theirs()
    except RuntimeError:
        with pytest.raises(eo.EveryOError):
            ours()
        event("both refused")
        return
    program.push(ours(), expected)


def _array(theirs):
    """A PyTorch result as NumPy. NOTE: PyTorch 2.13 returns its lazy ZeroTensor for some zero
    second derivatives (through abs), and ``numpy(force=True)`` of one reads uninitialised
    memory; such a tensor is all zeros by definition."""
    if theirs._is_zerotensor():
        return np.zeros(tuple(theirs.shape))
    return theirs.detach().numpy()


def _close(ours, theirs, what):
    expected = _array(theirs)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(ours.data if isinstance(ours, eo.Tensor) else ours),
                               expected, rtol=TOL, atol=TOL * scale, err_msg=what)


@given(data=st.data())
@FUZZ
def test_random_programs_agree_with_torch_to_second_order(torch, data):
    draw = data.draw
    program = Program(torch, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    program.push(*program.leaf(tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))))
    for _ in range(draw(st.integers(1, 8))):
        _step(draw, program)
    event(f"{len(program.ours) - 1} steps applied")
    out, tout = program.ours[-1], program.theirs[-1]
    _close(out, tout, "forward")

    weights = program.rng.standard_normal(tuple(out.shape))
    loss = (out * eo.tensor(weights)).sum()
    tloss = (tout * torch.tensor(weights)).sum()
    firsts = eo.grad(loss, program.leaves_ours, create_graph=True, allow_unused=True)
    tfirsts = torch.autograd.grad(tloss, program.leaves_theirs, create_graph=True,
                                  allow_unused=True)
    for i, (g, tg) in enumerate(zip(firsts, tfirsts)):
        assert (g is None) == (tg is None), f"leaf {i}: used in one framework only"
        if g is not None:
            _close(g, tg, f"first derivative, leaf {i}")

    # Hessian-vector product: d/dleaves of sum(first_i * v_i), where PyTorch's graph has one.
    pairs = [(g, tg) for g, tg in zip(firsts, tfirsts) if g is not None and tg.requires_grad]
    if not pairs:
        return
    vectors = [program.rng.standard_normal(tuple(g.shape)) for g, _ in pairs]
    inner = sum(((g * eo.tensor(v)).sum() for (g, _), v in zip(pairs, vectors)), eo.tensor(0.0))
    tinner = sum((tg * torch.tensor(v)).sum() for (_, tg), v in zip(pairs, vectors))
    tseconds = torch.autograd.grad(tinner, program.leaves_theirs, allow_unused=True)
    if not inner.requires_grad:
        # EveryO's first derivatives are constants here (e.g. through abs or relu): PyTorch's
        # graph then has only zero second derivatives.
        assert all(th is None or not _array(th).any() for th in tseconds)
        return
    seconds = eo.grad(inner, program.leaves_ours, allow_unused=True)
    for i, (h, th) in enumerate(zip(seconds, tseconds)):
        if th is None:
            assert h is None or not np.any(h.data), f"leaf {i}: second derivative from nothing"
        elif h is None:
            assert not _array(th).any(), f"leaf {i}: second derivative missing"
        else:
            _close(h, th, f"second derivative, leaf {i}")
