"""``shard_indices`` properties, checked by hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from everyo.distributed import shard_indices


@given(count=st.integers(0, 10_000), world_size=st.integers(1, 64))
def test_shards_are_disjoint_contiguous_and_cover_everything(count, world_size):
    shards = [shard_indices(count, rank, world_size) for rank in range(world_size)]
    joined = np.concatenate(shards)
    np.testing.assert_array_equal(joined, np.arange(count))  # disjoint, in order, covering
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger shards come first
    for shard in shards:
        assert shard.dtype == np.int64
        assert len(shard) == 0 or np.array_equal(shard, np.arange(shard[0], shard[-1] + 1))


@given(count=st.integers(0, 10_000), world_size=st.integers(1, 64))
def test_drop_last_gives_equal_shards_and_drops_only_the_tail(count, world_size):
    shards = [shard_indices(count, rank, world_size, drop_last=True)
              for rank in range(world_size)]
    assert {len(s) for s in shards} == {count // world_size}
    joined = np.concatenate(shards)
    np.testing.assert_array_equal(joined, np.arange(count - count % world_size))


@pytest.mark.parametrize("args, match", [
    ((10, 3, 3), "rank 3 is not below world_size 3"),
    ((10, -1, 3), "rank must be an integer >= 0"),
    ((10, 0, 0), "world_size must be an integer >= 1"),
    ((-1, 0, 2), "count must be an integer >= 0"),
    ((10.0, 0, 2), "count must be an integer"),
])
def test_bad_arguments_are_named(args, match):
    with pytest.raises(Exception, match=match):
        shard_indices(*args)
