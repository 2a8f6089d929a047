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
    MAX_DIMS,
    CollectiveOp,
    Fingerprint,
    check_fingerprints,
)
from everyo_dist.payload import decode, encode


@given(seq=st.integers(0, 2 ** 64 - 1), op=st.sampled_from(list(CollectiveOp)),
       dtype=st.sampled_from(sorted(DTYPE_CODES)),
       shape=st.lists(st.integers(0, 2 ** 40), max_size=MAX_DIMS), root=st.integers(0, 1000))
def test_fingerprint_round_trips_in_fixed_size(seq, op, dtype, shape, root):
    fingerprint = Fingerprint(seq, op, dtype, tuple(shape), root)
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
