"""``torch.load(path, map_location="cpu", weights_only=True)`` ports as ``eo.load`` with the
same arguments: the CPU targets are accepted (EveryO's arrays are on the CPU), another device
is refused by name, and ``weights_only`` is a bool (a file is never unpickled)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "checkpoint.npz"
    eo.save({"w": np.arange(3.0), "epoch": 2}, path)
    return path


@pytest.mark.parametrize("options", [
    {}, {"map_location": "cpu"}, {"map_location": "cpu", "weights_only": True},
    {"weights_only": False}, {"map_location": {"cuda:0": "cpu", "cuda:1": "cpu"}},
    {"map_location": lambda storage, location: storage},
])
def test_torch_load_options_are_accepted(checkpoint, options):
    loaded = eo.load(checkpoint, **options)
    np.testing.assert_array_equal(loaded["w"], np.arange(3.0))
    assert loaded["epoch"] == 2


def test_map_location_positionally_and_as_torch_device(checkpoint, torch):
    assert eo.load(checkpoint, torch.device("cpu"))["epoch"] == 2
    with pytest.raises(EveryOError, match=r"load\(map_location=...\).*'cuda:0'"):
        eo.load(checkpoint, map_location=torch.device("cuda", 0))


@pytest.mark.parametrize("options, says", [
    ({"map_location": "cuda"}, "'cuda'"), ({"map_location": {"cpu": "cuda:1"}}, "'cuda:1'"),
    ({"map_location": 0}, "'0'"), ({"weights_only": "yes"}, "weights_only must be"),
])
def test_other_targets_are_refused_by_name(checkpoint, options, says):
    with pytest.raises(EveryOError, match=says):
        eo.load(checkpoint, **options)
