"""DistributedDataParallel: buckets all-reduced during backward give exactly the gradients of
``average_gradients`` (bit for bit) on shm, tcp and mpi, with ``no_sync`` accumulation, a
parameter one rank never uses, and with autocast + GradScaler(group=)."""

from __future__ import annotations

import numpy as np
import pytest
from dist_workers import ddp_or_average, make_data

import everyo as eo
from everyo.distributed import DistributedDataParallel, DistributedError, init, spawn


def _same_bits(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _ddp_equals_reference(worker, *args, backend="shm"):
    """Run ``worker(*args, use_ddp)`` on 2 ranks with DDP and with ``average_gradients``;
    every rank's results must be the same bits. Returns the DDP run's results."""
    ddp = spawn(worker, 2, args=(*args, True), backend=backend, timeout=60)
    reference = spawn(worker, 2, args=(*args, False), backend=backend, timeout=60)
    for rank in range(2):
        _same_bits(ddp[rank], reference[rank])
    return ddp


@pytest.mark.parametrize("backend", [pytest.param("shm", marks=pytest.mark.kernel_provider),
                                     "tcp"])
def test_ddp_matches_average_gradients_bit_for_bit(backend):
    inputs, targets = make_data(rows=64)
    ddp = spawn(ddp_or_average, 2, args=(inputs, targets, True), backend=backend, timeout=60)
    reference = spawn(ddp_or_average, 2, args=(inputs, targets, False), backend=backend,
                      timeout=60)
    for rank in range(2):
        _same_bits(ddp[rank], reference[rank])
    _same_bits(ddp[0], ddp[1])
    assert not np.array_equal(ddp[0][-2], np.zeros_like(ddp[0][-2]))  # the branch trained


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("bucket_cap_mb", [None, 0.001])
def test_a_weight_sent_in_row_blocks_gives_average_gradients_bits(backend, bucket_cap_mb):
    # (an 8 MiB weight: its 7 row blocks leave as 7 segments, with no_sync accumulation and a
    # branch rank 1 never uses; with the default cap it shares a bucket with small parameters)
    from dist_workers import WideBranchyModel, wide_ddp_or_average

    inputs, targets = make_data(rows=64)
    ddp = _ddp_equals_reference(wide_ddp_or_average, inputs, targets, False, bucket_cap_mb,
                                backend=backend)
    _same_bits(ddp[0], ddp[1])
    names = [name for name, _ in WideBranchyModel().named_parameters()]
    initial = WideBranchyModel().wide.weight.data
    trained = ddp[0][names.index("wide.weight")]
    assert trained.shape == (2048, 1024) and not np.array_equal(trained, initial)


def test_a_weight_sent_in_row_blocks_with_autocast_and_a_grad_scaler():
    pytest.importorskip("everyo_amp")
    from dist_workers import wide_ddp_or_average

    inputs, targets = make_data(rows=64)
    _ddp_equals_reference(wide_ddp_or_average, inputs, targets, True, None)


def test_ddp_with_autocast_and_a_grad_scaler_sharing_the_group():
    pytest.importorskip("everyo_amp")
    inputs, targets = make_data(rows=64)
    ddp = spawn(ddp_or_average, 2, args=(inputs, targets, True, 2, 2, True), timeout=60)
    reference = spawn(ddp_or_average, 2, args=(inputs, targets, False, 2, 2, True), timeout=60)
    for rank in range(2):
        _same_bits(ddp[rank], reference[rank])


def test_a_second_backward_through_one_forward_is_refused():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = eo.Linear(2, 1, seed=0)
        ddp = DistributedDataParallel(model, group)
        try:
            out = ddp(eo.ones((3, 2))).sum()
            out.backward(retain_graph=True)
            with pytest.raises(DistributedError, match="second backward"):
                out.backward()
        finally:
            ddp.close()


def test_buckets_follow_reverse_registration_order_and_the_cap():
    from everyo_dist.buckets import buckets as _buckets

    layers = [eo.Linear(64, 64, seed=i) for i in range(3)]  # 16 KB weight + 256 B bias each
    params = [p for layer in layers for p in layer.parameters()]
    buckets = _buckets(params, cap_bytes=16_700, first_cap_bytes=300)
    flattened = [p for bucket in buckets for p in bucket.params]
    assert [id(p) for p in flattened] == [id(p) for p in reversed(params)]
    # PyTorch's rule: a bucket closes once it holds at least its limit (the first one's own)
    sizes = [[p.data.nbytes for p in b.params] for b in buckets]
    assert sizes == [[256, 16384], [256, 16384, 256], [16384]]


def _bucket_shapes(bucket_cap_mb):
    # mlp-shaped: 8 MiB, 16 MiB and a small head
    model = eo.Sequential(eo.Linear(1024, 2048, seed=0), eo.Linear(2048, 2048, seed=1),
                          eo.Linear(2048, 10, seed=2))
    with init(backend="shm", rank=0, world_size=1) as group:
        ddp = DistributedDataParallel(model, group, bucket_cap_mb=bucket_cap_mb)
        try:
            ddp(eo.ones((1, 1024))).sum().backward()
            return [[p.shape for p in b.params] for b in ddp._buckets]
        finally:
            ddp.close()


def test_by_default_the_first_bucket_is_one_mebibyte_so_a_large_weight_leaves_alone():
    from everyo_dist.buckets import FIRST_BUCKET_BYTES

    assert FIRST_BUCKET_BYTES == 1024 * 1024
    assert _bucket_shapes(None) == [[(10,), (2048, 10), (2048,), (2048, 2048)],
                                    [(2048,), (1024, 2048)]]
    # an explicit cap applies to the first bucket too (PyTorch): 24.1 MiB fit in one
    assert len(_bucket_shapes(25)) == 1


@pytest.mark.torch
@pytest.mark.parametrize("bucket_cap_mb", [None, 25, 4, 0.01])
def test_buckets_are_pytorchs(torch, bucket_cap_mb):
    import torch.distributed as tdist

    shapes = [(7, 300), (300,), (300, 1000), (1000,), (1000, 10), (10,)]
    params = [eo.Parameter(np.zeros(shape, np.float32)) for shape in shapes]
    from everyo_dist.buckets import FIRST_BUCKET_BYTES
    from everyo_dist.buckets import buckets as _buckets

    mib = 1024 * 1024
    cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * mib)
    first = FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    ours = [[shapes.index(p.shape) for p in b.params] for b in _buckets(params, cap, first)]
    limits = [first, cap] if first < cap else [cap]
    reference, _ = tdist._compute_bucket_assignment_by_size(
        [torch.empty(shape) for shape in reversed(shapes)], limits)
    assert ours == [[len(shapes) - 1 - i for i in bucket] for bucket in reference]


@pytest.mark.torch
@pytest.mark.parametrize("cap, first", [(25 * 1024 * 1024, 1024 * 1024), (1024 * 1024, 8000),
                                        (4000, 4000)])
def test_buckets_of_mixed_dtypes_are_pytorchs(torch, cap, first):
    # PyTorch keeps one open bucket per dtype (each with its own first limit) and orders the
    # buckets by their first parameter; closing the bucket at every change of dtype gave
    # alternating float32/float64 parameters one all-reduce each
    import torch.distributed as tdist

    from everyo_dist.buckets import buckets as _buckets

    specs = [((300, 1000), "float32"), ((1000,), "float64"), ((1000, 10), "float32"),
             ((10,), "float64"), ((300, 300), "float64"), ((7,), "float32")]
    params = [eo.Parameter(np.zeros(shape, dtype)) for shape, dtype in specs]
    ids = [id(p) for p in params]
    ours = [[ids.index(id(p)) for p in b.params] for b in _buckets(params, cap, first)]
    assert all(len({p.dtype for p in b.params}) == 1 for b in _buckets(params, cap, first))
    reference, _ = tdist._compute_bucket_assignment_by_size(
        [torch.empty(shape, dtype=getattr(torch, dtype)) for shape, dtype in reversed(specs)],
        [first, cap] if first < cap else [cap])
    assert ours == [[len(specs) - 1 - i for i in bucket] for bucket in reference]


def test_a_parameter_used_only_by_a_later_forward_before_backward_is_averaged():
    from dist_workers import two_forwards_one_backward

    inputs, _ = make_data(rows=16)
    _ddp_equals_reference(two_forwards_one_backward, inputs)


def test_a_forward_without_grad_runs_no_collective_and_leaves_grad_alone():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = eo.Linear(2, 1, seed=0)
        ddp = DistributedDataParallel(model, group)
        calls = []
        reduce = group.all_reduce_mean
        group.all_reduce_mean = lambda flat, out=None: calls.append(flat) or reduce(flat, out)
        try:
            with eo.no_grad():
                ddp(eo.ones((3, 2)))  # e.g. evaluation on one rank only
            assert calls == [] and model.weight.grad is None and model.bias.grad is None
            ddp(eo.ones((3, 2))).sum().backward()
            assert len(calls) == 1 and model.weight.grad.ravel().tolist() == [3.0, 3.0]
        finally:
            group.all_reduce_mean = reduce
            ddp.close()


def test_ddp_matches_average_gradients_with_tied_weights_and_accumulation():
    from dist_workers import tied_weights_accumulated

    inputs, _ = make_data(rows=48)
    _ddp_equals_reference(tied_weights_accumulated, inputs)


class _TwoBranches(eo.Module):
    def __init__(self):
        super().__init__()
        self.body = eo.Linear(2, 1, seed=0)
        self.extra = eo.Linear(2, 1, seed=1)

    def forward(self, x, use_extra: bool):
        return self.body(x) + self.extra(x) if use_extra else self.body(x)


def test_a_forward_after_an_unfinished_reduction_raises_naming_the_parameters():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _TwoBranches()
        ddp = DistributedDataParallel(model, group, bucket_cap_mb=1e-6)
        try:
            ddp(eo.ones((3, 2)), True)  # its loss is skipped (say, a NaN): no backward
            ddp(eo.ones((3, 2)), False).sum().backward()  # never reaches `extra`
            with pytest.raises(DistributedError, match=r"(?s)expected to have finished "
                               r"reduction in the prior iteration.*extra\.bias, extra\.weight"):
                ddp(eo.ones((3, 2)), False)
        finally:
            ddp.close()


def test_a_skipped_backward_is_harmless_when_the_next_one_reaches_the_same_parameters():
    grads = []
    for skip in (False, True):
        with init(backend="shm", rank=0, world_size=1) as group:
            model = _TwoBranches()
            ddp = DistributedDataParallel(model, group)
            try:
                if skip:
                    ddp(eo.full((3, 2), fill_value=float("nan")), True)  # forward only
                ddp(eo.ones((3, 2)), True).sum().backward()
                ddp(eo.ones((3, 2)), True).sum().backward()  # the next step runs normally
                grads.append([p.grad.tobytes() for p in model.parameters()])
            finally:
                ddp.close()
    assert grads[0] == grads[1]


def test_a_forward_without_backward_does_not_keep_its_graph_alive():
    import gc
    import weakref

    with init(backend="shm", rank=0, world_size=1) as group:
        model = _TwoBranches()
        ddp = DistributedDataParallel(model, group)
        try:
            out = ddp(eo.ones((3, 2)), True)
            alive = weakref.ref(out)
            del out
            gc.collect()
            assert alive() is None
            ddp(eo.ones((3, 2)), True).sum().backward()  # and the next step still averages
            assert model.extra.weight.grad is not None
        finally:
            ddp.close()


class _ExtraFirst(_TwoBranches):
    def __init__(self):
        eo.Module.__init__(self)
        self.extra = eo.Linear(2, 1, seed=1)  # registered first: its buckets are reduced last
        self.body = eo.Linear(2, 1, seed=0)


def test_a_gradient_arriving_after_its_bucket_was_reduced_is_refused_not_lost():
    # two forwards, then one backward each: the first backward finishes `body`'s buckets, which
    # leave with only its gradient; the second adds more to `body` (and finishes `extra`).
    # Writing the averages back would silently drop that second contribution to `body`.
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _ExtraFirst()
        ddp = DistributedDataParallel(model, group, bucket_cap_mb=1e-6)
        try:
            first, second = ddp(eo.ones((3, 2)), False), ddp(eo.ones((3, 2)), True)
            first.sum().backward()
            with pytest.raises(DistributedError, match=r"body\.(bias|weight).*already"):
                second.sum().backward()
        finally:
            ddp.close()


@pytest.mark.parametrize("cap", [float("inf"), float("nan"), 0, -1, True, "25"])
def test_a_bucket_cap_that_is_not_a_finite_positive_number_is_refused_by_name(cap):
    with init(backend="shm", rank=0, world_size=1) as group:
        with pytest.raises(DistributedError, match="bucket_cap_mb"):
            DistributedDataParallel(eo.Linear(2, 1, seed=0), group, bucket_cap_mb=cap)


@pytest.mark.parametrize("group", [None, "shm", 2])
def test_something_that_is_not_a_process_group_is_refused_by_name(group):
    # it failed only at the first reduction, as a raw AttributeError from the comm thread
    with pytest.raises(DistributedError, match="needs a process group"):
        DistributedDataParallel(eo.Linear(2, 1, seed=0), group)


def test_a_parameter_frozen_after_wrapping_is_not_waited_for():
    # requires_grad turned off after the wrapper was built (fine-tuning a frozen layer): the
    # backward gives it no gradient, so waiting for it would leave the step unaveraged
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _TwoBranches()
        ddp = DistributedDataParallel(model, group)
        try:
            model.body.weight.requires_grad = False
            for _ in range(2):
                ddp(eo.ones((3, 2)), True).sum().backward()
            assert model.extra.weight.grad is not None and model.body.weight.grad is None
        finally:
            ddp.close()


def test_a_large_weight_leaves_in_row_blocks_as_views_before_the_product_is_done(monkeypatch):
    # the first segment of the 8 MiB weight is handed to the communication thread after the
    # first block of its gradient and before the second block (and the input's gradient) is
    # computed; each of its segments is sent as a view of .grad, not a copy
    from dist_workers import WideBranchyModel

    from everyo.kernels import row_block_stops
    from everyo.ops import linalg

    model = WideBranchyModel()
    weight = model.wide.weight
    events: list = []
    real_matmul = linalg.blas_matmul

    def recording_matmul(a, b, *args, **kwargs):
        if b.shape == (1024, 2048):  # (the wide layer's input gradient)
            events.append("input gradient")
        elif kwargs.get("out") is not None and kwargs["out"].shape[1] == 1024:
            events.append("block")
        return real_matmul(a, b, *args, **kwargs)

    with init(backend="shm", rank=0, world_size=1) as group:
        ddp = DistributedDataParallel(model, group)
        views: list = []
        reduce = group.all_reduce_mean

        def recording_reduce(flat, out=None):
            if flat.size % 1024 == 0 and flat.size >= 64 * 1024:  # (rows of the wide weight)
                views.append(np.shares_memory(flat, weight.grad))
            return reduce(flat, out)

        group.all_reduce_mean = recording_reduce
        put = ddp._work.put

        def recording_put(item):
            if item is not None and item[0].params == [weight]:
                events.append(("sent", item[0].row_start))
            put(item)

        ddp._work.put = recording_put
        try:
            out = ddp(eo.ones((4, 8)), False)
            monkeypatch.setattr(linalg, "blas_matmul", recording_matmul)
            out.sum().backward()
        finally:
            monkeypatch.undo()
            group.all_reduce_mean = reduce
            ddp.close()
    # (the last segment is sent by the post-accumulate hook that follows the last block)
    starts = (0,) + row_block_stops(weight.shape, 4)[:-1]
    assert len(starts) == 7
    assert events == [item for start in starts for item in ("block", ("sent", start))] + [
        "input gradient"]
    assert views == [True] * len(starts)


class _WideExtraFirst(eo.Module):
    """``_ExtraFirst`` with an 8 MiB ``body`` weight, whose gradient arrives in row blocks."""

    def __init__(self):
        super().__init__()
        self.extra = eo.Linear(2048, 1, seed=1)
        self.body = eo.Linear(2048, 1024, bias=False, seed=0)  # (no bias refused first)

    def forward(self, x, use_extra: bool):
        out = self.body(x).sum() * 1.0
        return out + self.extra(x).sum() if use_extra else out


def test_rows_arriving_after_their_segment_was_reduced_are_refused_not_lost():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _WideExtraFirst()
        ddp = DistributedDataParallel(model, group, bucket_cap_mb=1e-6)
        try:
            x = eo.tensor(np.ones((2, 2048), np.float32), requires_grad=True)
            first, second = ddp(x, False), ddp(x * 2.0, True)
            first.backward()  # body's segments leave with this backward's gradient only
            with pytest.raises(DistributedError, match=r"body\.weight.*already"):
                second.backward()  # its first rows arrive: refused before any is sent
        finally:
            ddp.close()


def test_a_large_weight_the_forward_does_not_use_is_averaged_as_zeros():
    class Unused(eo.Module):
        def __init__(self):
            super().__init__()
            self.wide = eo.Linear(2048, 1024, seed=0)  # (8 MiB: sent as row segments)
            self.head = eo.Linear(2048, 1, seed=1)

        def forward(self, x):
            return self.head(x)

    with init(backend="shm", rank=0, world_size=1) as group:
        model = Unused()
        ddp = DistributedDataParallel(model, group)
        try:
            ddp(eo.ones((2, 2048))).sum().backward()
            assert model.wide.weight.grad.shape == (2048, 1024)
            assert not model.wide.weight.grad.any() and model.head.weight.grad.any()
        finally:
            ddp.close()


def test_a_parameter_unfrozen_after_wrapping_is_refused_not_left_unaveraged():
    # frozen when the wrapper was built: no hook, no bucket. Unfrozen later (fine-tuning in
    # stages), its gradient stayed each rank's own and the ranks' weights drifted apart
    with init(backend="shm", rank=0, world_size=1) as group:
        model = eo.Sequential(eo.Linear(2, 2, seed=0), eo.Linear(2, 1, seed=1))
        model[0].weight.requires_grad = False
        ddp = DistributedDataParallel(model, group)
        try:
            model[0].weight.requires_grad = True
            with pytest.raises(DistributedError, match=r"0\.weight .*not be averaged"):
                ddp(eo.ones((3, 2)))
        finally:
            ddp.close()


def test_calling_the_module_instead_of_the_wrapper_is_refused_from_the_first_step():
    # before the wrapper's first forward the hooks let such a backward through, so a loop
    # that called model(x) after wrapping never averaged anything, without a word
    with init(backend="shm", rank=0, world_size=1) as group:
        model = eo.Linear(2, 1, seed=0)
        ddp = DistributedDataParallel(model, group)
        try:
            with pytest.raises(DistributedError, match="without a forward through the wrapper"):
                model(eo.ones((3, 2))).sum().backward()
            with ddp.no_sync():  # accumulation before the first synchronised step is fine
                ddp(eo.ones((3, 2))).sum().backward()
        finally:
            ddp.close()


def test_the_wrapper_refuses_to_run_after_close():
    # close() removes the hooks: a forward and backward through the wrapper afterwards left
    # the gradients unaveraged without a word
    with init(backend="shm", rank=0, world_size=1) as group:
        ddp = DistributedDataParallel(eo.Linear(2, 1, seed=0), group)
        ddp(eo.ones((3, 2))).sum().backward()
        ddp.close()
        with pytest.raises(DistributedError, match="after close"):
            ddp(eo.ones((3, 2)))
        ddp.close()  # a second close is harmless


def test_a_weight_bucket_leaves_before_its_layer_computes_the_input_gradient(monkeypatch):
    # (DDP's hooks are registered early=True: the middle layer's weight is handed to the
    # bucket inside the layer's backward, before its input's gradient product runs)
    from everyo.ops import linalg
    from everyo_dist import ddp as ddp_module

    events: list = []
    real_matmul, real_ready = linalg.blas_matmul, ddp_module.DistributedDataParallel._on_grad_ready

    def recording_matmul(a, b, *args, **kwargs):
        events.append(("matmul", a.shape, b.shape))
        return real_matmul(a, b, *args, **kwargs)

    def recording_ready(self, param):
        events.append(("ready", param.shape))
        return real_ready(self, param)

    model = eo.Sequential(eo.Linear(3, 4, seed=0), eo.Tanh(), eo.Linear(4, 5, seed=1))
    with init(backend="shm", rank=0, world_size=1) as group:
        monkeypatch.setattr(ddp_module.DistributedDataParallel, "_on_grad_ready",
                            recording_ready)
        ddp = DistributedDataParallel(model, group)
        try:
            out = ddp(eo.ones((2, 3)))
            monkeypatch.setattr(linalg, "blas_matmul", recording_matmul)
            out.sum().backward()
        finally:
            ddp.close()
    second_weight_ready = events.index(("ready", (4, 5)))
    input_gradient_product = events.index(("matmul", (2, 5), (5, 4)))
    assert second_weight_ready < input_gradient_product
