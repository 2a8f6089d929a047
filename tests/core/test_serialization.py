"""eo.save / eo.load: round trips, atomic writes, no pickle, damaged files."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

import everyo as eo


def test_round_trip_of_nested_state(tmp_path):
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": 3, "lr": 0.5,
             "name": "mlp", "none": None, "flag": True, "layers": [np.ones(2), {"b": np.zeros(1)}],
             "betas": (0.9, 0.999), 7: np.int64(4)}
    path = tmp_path / "state.npz"
    eo.save(state, path)
    loaded = eo.load(path)
    assert loaded["w"].dtype == np.float32
    np.testing.assert_array_equal(loaded["w"], state["w"])
    assert (loaded["step"], loaded["lr"], loaded["name"], loaded["none"], loaded["flag"]) == (
        3, 0.5, "mlp", None, True)
    assert loaded["betas"] == (0.9, 0.999) and loaded[7] == 4
    np.testing.assert_array_equal(loaded["layers"][1]["b"], np.zeros(1))


def test_module_round_trip(tmp_path):
    class M(eo.Module):
        def __init__(self):
            super().__init__()
            self.w = eo.Parameter(np.random.default_rng(0).standard_normal((2, 2)))

    m = M()
    eo.save(m, tmp_path / "m.npz")
    other = M()
    other.w.data[...] = 0
    other.load_state_dict(eo.load(tmp_path / "m.npz"))
    np.testing.assert_array_equal(other.w.data, m.w.data)


def test_write_is_atomic_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "ckpt.npz"
    eo.save({"a": np.ones(3)}, path)
    with pytest.raises(eo.EveryOSerializationError, match="object"):
        eo.save({"a": np.zeros(2), "bad": object()}, path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    np.testing.assert_array_equal(eo.load(path)["a"], np.ones(3))


def test_truncated_and_corrupt_files_raise_clearly(tmp_path):
    path = tmp_path / "ckpt.npz"
    eo.save({"a": np.arange(1000.0)}, path)
    raw = path.read_bytes()
    (tmp_path / "truncated.npz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "garbage.npz").write_bytes(b"not a zip at all")
    for name in ("truncated.npz", "garbage.npz"):
        with pytest.raises(eo.EveryOSerializationError, match=name):
            eo.load(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        eo.load(tmp_path / "missing.npz")


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_foreign_and_pickled_archives_are_refused(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(eo.EveryOSerializationError, match="not an EveryO checkpoint"):
        eo.load(tmp_path / "plain.npz")
    path = tmp_path / "pickled.npz"
    eo.save({"a": np.ones(2)}, path)
    with zipfile.ZipFile(path, "a") as archive:  # smuggle an object array into the archive
        with archive.open("a0.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, np.array([{"x": 1}], dtype=object),
                                      allow_pickle=True)
    with pytest.raises(eo.EveryOSerializationError, match="pickle"):
        eo.load(path)
