"""Gradients handed over in row blocks (``everyo.grad_rows``): ``matmul`` computes a large
weight's gradient block by block, always (one GEMM's value to within float32 rounding; the
bits of one GEMM are not promised: they depend on the BLAS kernel); with a rows-ready hook the
engine makes each block final in ``.grad`` and announces it before the op computes the next,
and falls back to the whole gradient wherever a block could not be final."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError
from everyo.grad_rows import ROW_BLOCKS_MIN_BYTES, row_block_stops
from everyo.kernels import gradients_from_parts
from everyo.ops import linalg

RNG = np.random.default_rng(5)


def _array(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("batch, inner, outer", [(256, 2048, 2048), (256, 1024, 2048)])
def test_the_blocked_weight_gradient_is_one_gemm_to_within_rounding_for_mlp_large(batch, inner,
                                                                                 outer):
    # (mlp_large's W2 and W1: 16 MiB in 8 blocks, 8 MiB in 4). NOTE: not bit for bit: which
    # bits one unblocked GEMM gives depends on the BLAS kernel, CPU and thread count (an EPYC
    # with OPENBLAS_CORETYPE=Haswell differs in the last bit); only the blocked paths agree
    # with each other bit for bit, by construction (test_announced_gradients_are_...).
    x, g = _array(batch, inner), _array(batch, outer)
    stops = row_block_stops((inner, outer), 4)
    assert stops[:4] == (32, 96, 224, 480) and len(stops) == {2048: 11, 1024: 7}[inner]
    w = eo.Parameter(_array(inner, outer))
    out = eo.tensor(x) @ w
    out.backward(g)
    exact = x.T.astype(np.float64) @ g.astype(np.float64)
    # a float32 sum of `batch` products errs by at most batch * eps32 * sum |x_i g_i|
    bound = batch * np.finfo(np.float32).eps * (np.abs(x.T).astype(np.float64) @ np.abs(g))
    assert np.all(np.abs(w.grad - exact) <= bound)
    assert np.all(np.abs((x.T @ g) - exact) <= bound)  # (the same bound holds for one GEMM)


def test_a_gradient_below_the_threshold_is_one_block():
    assert row_block_stops((1023, 1024), 4) == (1023,)  # just under 4 MiB
    assert ROW_BLOCKS_MIN_BYTES == 4 << 20
    assert row_block_stops((1024, 1024), 4) == (64, 192, 448, 960, 1024)  # (up to 2 MiB each)
    assert row_block_stops((1, 1 << 21), 4) == (1,)  # one row cannot be cut
    assert row_block_stops((3, 1 << 21), 4) == (1, 2, 3)  # rows of 8 MiB: one each


def _layer(batch=8, inner=1024, outer=2048):
    """A Linear-shaped product whose weight's gradient (8 MiB) comes in 4 row blocks."""
    x = eo.tensor(_array(batch, inner), requires_grad=True)
    weight = eo.Parameter(_array(inner, outer, scale=0.01))
    bias = eo.Parameter(_array(outer))
    return x, weight, bias


def _loss(x, weight, bias):
    out = eo.dispatch("matmul", eo.tanh(x), weight, bias)
    return (out * out).sum()


def _record_rows(weight, events, snapshots=None):
    def on_rows(param, start, stop):
        events.append(("rows", start, stop))
        if snapshots is not None:
            snapshots.append((start, stop, param.grad[start:stop].copy()))

    weight.register_post_accumulate_grad_hook(lambda p: events.append("final"), early=True)
    return weight.register_grad_rows_ready_hook(on_rows)


@pytest.mark.parametrize("accumulate", [False, True])
def test_rows_are_final_when_announced(accumulate):
    # each announced block of .grad is recorded at announcement time; a block announced before
    # it was computed (or before an existing .grad had it added) differs from the final .grad
    x, weight, bias = _layer()
    if accumulate:  # (gradient accumulation: the blocks are added to an existing .grad)
        _loss(x, weight, bias).backward()
    events, snapshots = [], []
    _record_rows(weight, events, snapshots)
    _loss(x, weight, bias).backward()
    stops = row_block_stops(weight.shape, 4)
    assert events == [("rows", a, b) for a, b in zip((0,) + stops, stops)] + ["final"]
    for start, stop, seen in snapshots:
        assert seen.tobytes() == weight.grad[start:stop].tobytes()


@pytest.mark.parametrize("accumulate", [False, True])
def test_announced_gradients_are_the_plain_backward_bits(accumulate):
    values = _array(8, 1024), _array(1024, 2048, scale=0.01), _array(2048)
    grads = []
    for hooked in (False, True):
        x = eo.tensor(values[0], requires_grad=True)
        weight, bias = eo.Parameter(values[1]), eo.Parameter(values[2])
        events: list = []
        if hooked:
            _record_rows(weight, events)
        for _ in range(2 if accumulate else 1):
            _loss(x, weight, bias).backward()
        first = ("rows", 0, row_block_stops(weight.shape, 4)[0])
        assert events.count(first) == (2 if accumulate and hooked else int(hooked))
        grads.append([t.grad.tobytes() for t in (x, weight, bias)])
    assert grads[0] == grads[1]


def test_the_first_rows_are_announced_before_the_op_computes_the_rest(monkeypatch):
    # the first block's announcement comes right after its product, before the next block's
    # product and before the input's gradient: that is what lets DDP send it early
    x, weight, bias = _layer()
    events: list = []
    real = linalg.blas_matmul

    def recording(a, b, *args, **kwargs):
        events.append("block" if kwargs.get("out") is not None else f"matmul {a.shape}x{b.shape}")
        return real(a, b, *args, **kwargs)

    _record_rows(weight, events)
    loss = _loss(x, weight, bias)
    monkeypatch.setattr(linalg, "blas_matmul", recording)
    loss.backward()
    first = ("rows", 0, row_block_stops(weight.shape, 4)[0])
    assert events[:3] == ["block", first, "block"]
    assert events.index(first) < events.index("matmul (8, 2048)x(2048, 1024)")
    assert events[-2:] == ["final", "matmul (8, 2048)x(2048, 1024)"]


def _announced(prepare):
    x, weight, bias = _layer()
    events: list = []
    _record_rows(weight, events)
    loss = prepare(x, weight, bias)
    loss.backward()
    return events, weight


def test_a_weight_with_a_tensor_hook_gets_its_gradient_whole():
    seen = []

    def prepare(x, weight, bias):
        weight.register_hook(lambda g: seen.append(g.copy()))
        return _loss(x, weight, bias)

    events, weight = _announced(prepare)
    assert events == ["final"] and seen[0].tobytes() == weight.grad.tobytes()


def test_a_weight_used_twice_gets_its_gradient_whole():
    events, weight = _announced(lambda x, w, b: _loss(x, w, b) + _loss(x * 2.0, w, b))
    assert events == ["final"]


def test_a_weight_with_a_hook_that_is_not_early_gets_its_gradient_whole():
    def prepare(x, weight, bias):
        weight.register_post_accumulate_grad_hook(lambda p: None)  # (may write tensors)
        return _loss(x, weight, bias)

    events, _ = _announced(prepare)
    assert events == ["final"]


def test_no_rows_are_announced_without_a_rows_hook_or_for_eo_grad():
    x, weight, bias = _layer()
    events: list = []
    weight.register_post_accumulate_grad_hook(lambda p: events.append("final"), early=True)
    _loss(x, weight, bias).backward()
    assert events == ["final"]
    handle = _record_rows(weight, events)
    (gw,) = eo.grad(_loss(x, weight, bias), weight)
    assert events == ["final"] and gw.data.tobytes() == weight.grad.tobytes()
    handle.remove()


def test_a_rows_hook_that_raises_leaves_no_half_computed_grad():
    x, weight, bias = _layer()

    def failing(param, start, stop):
        raise RuntimeError("the hook fails")

    weight.register_grad_rows_ready_hook(failing)
    with pytest.raises(RuntimeError, match="the hook fails"):
        _loss(x, weight, bias).backward()
    assert weight.grad is None


def test_a_rows_hook_that_replaces_a_fresh_grad_is_refused_not_left_half_computed():
    # Rebinding .grad is not an in-place write, so a rows hook may do it (a copy to keep, a
    # cast); the blocks after it used to go only into the op's own array, leaving the new
    # .grad with the uncomputed memory of every later row, and no error
    x, weight, bias = _layer()

    def replaces(param, start, stop):
        if start == 0:
            param.grad = param.grad.copy()

    weight.register_grad_rows_ready_hook(replaces)
    with pytest.raises(EveryOError, match=r"matmul.*replaced.*\.grad"):
        _loss(x, weight, bias).backward()
    assert weight.grad is None  # (the replacement held uncomputed rows)


def test_an_input_a_rows_hook_writes_in_place_raises_before_the_next_block():
    x, weight, bias = _layer()
    out = eo.dispatch("matmul", x, weight, bias)  # (x itself is the product's input)

    def writes_input(param, start, stop):
        with eo.no_grad():
            x.add_(1.0)

    weight.register_grad_rows_ready_hook(writes_input)
    with pytest.raises(EveryOError, match="rows-ready hook"):
        (out * out).sum().backward()


class _Blocks(eo.Op):
    """Hands over its weight gradient (the output gradient) in row blocks given by ``stops``."""

    __slots__ = ("stops",)
    saved_inputs = ()
    saves_output = False

    def forward(self, w, stops=()):
        self.stops = stops
        return w * 1.0

    def backward_parts(self, g):
        gradient = np.array(g)
        for stop in self.stops:
            yield 0, gradient, stop

    def backward(self, g):
        return gradients_from_parts(self, g)


@pytest.mark.parametrize("stops, message", [((2, 1, 4), "in order"), ((2, 3), "and then stopped"),
                                            ((2, 5), "in order")])
def test_an_op_breaking_the_row_block_protocol_raises_naming_it(stops, message):
    w = eo.Parameter(np.ones((4, 3), np.float32))
    w.register_grad_rows_ready_hook(lambda p, start, stop: None)
    with pytest.raises(EveryOError, match=rf"(?s)op '_Blocks'.*{message}"):
        _Blocks.apply(w, stops=stops).sum().backward()


def test_an_op_of_the_protocol_without_hooks_gives_the_whole_gradient():
    w = eo.Parameter(np.ones((4, 3), np.float32))
    _Blocks.apply(w, stops=(1, 3, 4)).sum().backward()
    assert w.grad.tolist() == [[1.0] * 3] * 4


def test_blas_matmul_out_refuses_what_it_cannot_write_in_place():
    from everyo.kernels import blas_matmul

    a = np.ones((2, 3), np.float32)
    out = np.empty((2, 2), np.float32)
    assert blas_matmul(a, a.T, out=out) is out and out.tolist() == [[3.0, 3.0]] * 2
    with pytest.raises(EveryOError, match="blas_matmul"):
        blas_matmul(a, a.T, out=np.empty((2, 2), np.float64))
    with pytest.raises(EveryOError, match="blas_matmul"):
        blas_matmul(a.astype(np.float16), a.T.astype(np.float16),
                    out=np.empty((2, 2), np.float16))
