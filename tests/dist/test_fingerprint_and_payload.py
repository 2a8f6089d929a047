"""The fixed-size fingerprint encoding and the pickle-free worker-result codec."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from everyo_dist.errors import CollectiveMismatchError, DistributedError
from everyo_dist.fingerprint import (
    DTYPE_CODES,
    FINGERPRINT_SIZE,
    KERNELS_BYTES,
    MAX_DIMS,
    CollectiveOp,
    Fingerprint,
    check_fingerprints,
    kernels_field,
)
from everyo_dist.payload import decode, encode


@given(seq=st.integers(0, 2 ** 64 - 1), op=st.sampled_from(list(CollectiveOp)),
       dtype=st.sampled_from(sorted(DTYPE_CODES)),
       shape=st.lists(st.integers(0, 2 ** 40), max_size=MAX_DIMS), root=st.integers(0, 1000),
       kernels=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E),
                       max_size=KERNELS_BYTES))
def test_fingerprint_round_trips_in_fixed_size(seq, op, dtype, shape, root, kernels):
    fingerprint = Fingerprint(seq, op, dtype, tuple(shape), root, kernels)
    packed = fingerprint.pack()
    assert isinstance(packed, bytes) and len(packed) == FINGERPRINT_SIZE
    assert Fingerprint.unpack(packed) == fingerprint


def test_scalar_and_barrier_fingerprints_differ():
    barrier = Fingerprint.of(0, CollectiveOp.BARRIER)
    scalar = Fingerprint.of(0, CollectiveOp.BARRIER, np.float32(1.0))
    assert barrier.pack() != scalar.pack()
    assert Fingerprint.unpack(barrier.pack()) == barrier


def test_malformed_fingerprints_are_refused():
    good = bytearray(Fingerprint.of(3, CollectiveOp.ALL_GATHER, np.zeros(2)).pack())
    with pytest.raises(DistributedError, match=f"{FINGERPRINT_SIZE} bytes"):
        Fingerprint.unpack(bytes(good[:-1]))
    bad_op = bytearray(good)
    bad_op[8] = 99
    with pytest.raises(DistributedError, match="unknown collective op code 99"):
        Fingerprint.unpack(bytes(bad_op))
    with pytest.raises(DistributedError, match="up to 8 dimensions"):
        Fingerprint.of(0, CollectiveOp.ALL_GATHER, np.zeros((1,) * 9))


def test_the_kernel_field_refuses_malformed_bytes():
    """A peer's bytes (a tcp frame) are refused unless the kernel field is printable ASCII
    padded with NUL bytes, as the other fields are refused when malformed."""
    good = Fingerprint(3, CollectiveOp.BARRIER, kernels="numpy").pack()
    start = FINGERPRINT_SIZE - KERNELS_BYTES
    assert good[start:start + 5] == b"numpy"
    for bad in (b"nump\x07", b"num\xffy", b"nu\0py", b"\0" * 31 + b"x"):
        raw = good[:start] + bad.ljust(KERNELS_BYTES, b"\0")
        with pytest.raises(DistributedError, match="kernel field"):
            Fingerprint.unpack(raw)
    full = good[:start] + b"k" * KERNELS_BYTES  # no padding at all: still well formed
    assert Fingerprint.unpack(full).kernels == "k" * KERNELS_BYTES
    for text in ("x" * (KERNELS_BYTES + 1), "numpy\n", "numb\u00e4"):
        with pytest.raises(DistributedError, match="kernel field"):
            Fingerprint(0, CollectiveOp.BARRIER, kernels=text).pack()


def test_kernel_texts_that_do_not_fit_stay_distinct():
    long_a, long_b = "numba " + "1" * 40 + "a", "numba " + "1" * 40 + "b"
    field_a, field_b = kernels_field(long_a), kernels_field(long_b)
    assert len(field_a) == len(field_b) == KERNELS_BYTES and field_a != field_b
    assert field_a.startswith("numba 111")
    assert kernels_field("numb\u00e4 1.0\n") == "numb? 1.0?"
    for text in (field_a, kernels_field("numb\u00e4 1.0\n")):  # what `of` announces packs
        assert Fingerprint.unpack(Fingerprint(0, CollectiveOp.BARRIER, kernels=text).pack()) \
            .kernels == text


def test_fingerprints_carry_the_current_kernel_selection():
    import everyo.kernels as K

    with K.use("numpy"):
        assert Fingerprint.of(0, CollectiveOp.BARRIER).kernels == "numpy"
        assert Fingerprint.of(1, CollectiveOp.ALL_GATHER, np.zeros(2)).kernels == "numpy"
    assert Fingerprint.of(2, CollectiveOp.BARRIER).kernels == kernels_field(K.fingerprint())
    providers = [name for name in K.kernel.registry.providers()]
    for name in providers:  # (everyo-numba when installed)
        with K.use(name):
            announced = Fingerprint.of(3, CollectiveOp.BARRIER).kernels
            assert announced == kernels_field(K.fingerprint()) and announced.startswith(name)


def test_a_kernel_difference_is_named_with_both_providers():
    mine = Fingerprint(5, CollectiveOp.ALL_REDUCE_MEAN, "float32", (4,), 0, "numba 0.68.1")
    theirs = mine._replace(kernels="numpy")
    with pytest.raises(CollectiveMismatchError) as info:
        check_fingerprints(mine, 1, [theirs.pack(), mine.pack()])
    assert str(info.value) == ("rank 1 computes with kernels 'numba 0.68.1' but rank 0 with "
                               "'numpy'; set EVERYO_KERNELS the same on every rank "
                               "(everyo.kernels.fingerprint() tells what a rank uses)")
    other_op = theirs._replace(op=CollectiveOp.ALL_REDUCE_SUM)  # both differ: both are named
    with pytest.raises(CollectiveMismatchError) as info:
        check_fingerprints(mine, 1, [other_op.pack(), mine.pack()])
    assert str(info.value).startswith("rank 1 called all_reduce_mean #5 on float32[4] but rank 0 "
                                      "called all_reduce_sum #5 on float32[4]; also, rank 1 "
                                      "computes with kernels 'numba 0.68.1' but rank 0 with "
                                      "'numpy'")


def test_mismatch_names_both_sides():
    mine = Fingerprint.of(4, CollectiveOp.BROADCAST, np.zeros(3, np.float32), root=0)
    theirs = Fingerprint.of(4, CollectiveOp.BROADCAST, np.zeros(3, np.float32), root=1)
    check_fingerprints(mine, 0, [mine.pack(), mine.pack()])
    with pytest.raises(CollectiveMismatchError) as info:
        check_fingerprints(mine, 0, [mine.pack(), theirs.pack()])
    assert str(info.value) == ("rank 0 called broadcast #4 on float32[3] from rank 0 but rank 1 "
                               "called broadcast #4 on float32[3] from rank 1")


def test_payload_round_trips_without_pickle_for_arrays_and_containers(monkeypatch):
    value = [np.arange(6, dtype=np.float32).reshape(2, 3), (1, 2.5, None, True),
             {"loss": np.float64(0.25).item(), "name": "rank0", "raw": b"\x00\x01"},
             np.zeros(0, np.int16)]
    data = encode(value)
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle was used"))
    back = decode(data)
    assert back[1] == (1, 2.5, None, True) and back[2] == value[2]
    for got, want in ((back[0], value[0]), (back[3], value[3])):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_payload_falls_back_to_pickle_for_other_objects():
    assert decode(encode({1: {2, 3}})) == {1: {2, 3}}
