"""eo.save / eo.load of .safetensors state dicts through the safetensors library: bit-exact
round trips (bfloat16 included), files PyTorch's tooling wrote, and damaged files refused as
EveryOSerializationError."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

import everyo as eo

safetensors_numpy = pytest.importorskip("safetensors.numpy")
BF16 = np.dtype("bfloat16")


def every_dtype_state():
    rng = np.random.default_rng(0)
    special = np.array([np.nan, -np.inf, np.inf, -0.0, 1e-42, 3.0], dtype=np.float32)
    return {
        "fc.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "fc.special": special,
        "half": rng.standard_normal(5).astype(np.float16),
        "bf16": special.astype(BF16),
        "double": rng.standard_normal((2, 2)),
        "count": np.array(7, dtype=np.int64),
        "ids": np.arange(4, dtype=np.int32),
        "mask": np.array([True, False]),
        "bytes": np.arange(3, dtype=np.uint8),
        "complex": (np.arange(2) + 1j).astype(np.complex64),
        "strided": np.arange(12.0, dtype=np.float32).reshape(3, 4)[:, ::2],
    }


def as_bits(array):
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.kind != "b" else array


def test_a_state_dict_round_trips_bit_exact(tmp_path):
    state = every_dtype_state()
    path = tmp_path / "m.safetensors"
    eo.save(state, path)
    loaded = eo.load(path)
    assert sorted(loaded) == sorted(state)
    for key, value in state.items():
        assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape, key
        np.testing.assert_array_equal(as_bits(np.ascontiguousarray(loaded[key])),
                                      as_bits(np.ascontiguousarray(value)))


def test_the_file_is_what_the_library_reads(tmp_path):
    path = tmp_path / "m.safetensors"
    eo.save({"w": np.arange(4.0, dtype=np.float32), "b": np.ones(2, BF16)}, path)
    theirs = safetensors_numpy.load_file(str(path))
    np.testing.assert_array_equal(theirs["w"], np.arange(4.0, dtype=np.float32))
    assert theirs["b"].dtype == BF16


def test_a_module_saves_and_loads_through_safetensors(tmp_path):
    model = eo.Sequential(eo.Linear(3, 2, seed=0), eo.ReLU(), eo.Linear(2, 1, seed=1))
    eo.save(model, tmp_path / "m.safetensors")
    other = eo.Sequential(eo.Linear(3, 2, seed=5), eo.ReLU(), eo.Linear(2, 1, seed=6))
    assert other.load_state_dict(eo.load(tmp_path / "m.safetensors")) == ([], [])
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters()):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)


def test_a_torch_written_file_loads(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tensors = {"w": torch.randn(3, 2), "h": torch.randn(4).to(torch.bfloat16)}
    path = tmp_path / "torch.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    loaded = eo.load(path)
    np.testing.assert_array_equal(loaded["w"], tensors["w"].numpy())
    np.testing.assert_array_equal(loaded["h"].view(np.uint16),
                                  tensors["h"].view(torch.int16).numpy().view(np.uint16))


def test_a_dtype_numpy_cannot_hold_is_a_serialization_error_naming_it(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "float8.safetensors"
    safetensors_torch.save_file({"w": torch.zeros(2), "q": torch.zeros(3).to(torch.float8_e4m3fn)},
                                str(path))
    with pytest.raises(eo.EveryOSerializationError,
                       match=r"float8.safetensors: tensor 'q' is F8_E4M3, a dtype NumPy"):
        eo.load(path)


@pytest.mark.parametrize("state, words", [
    ({"opt": {"lr": np.ones(1)}}, "flat"),
    ({"w": np.ones(2, np.complex128)}, "complex128"),
    ({"w": np.array(["a"])}, "<U1"),
    ({3: np.ones(1)}, "3"),
    ({"step": 3}, "'step'"),
])
def test_what_safetensors_cannot_hold_is_refused_by_name(tmp_path, state, words):
    with pytest.raises(eo.EveryOSerializationError, match=words):
        eo.save(state, tmp_path / "x.safetensors")
    assert os.listdir(tmp_path) == []


def saved_bytes(tmp_path):
    path = tmp_path / "good.safetensors"
    eo.save({"w": np.arange(6.0, dtype=np.float32), "b": np.ones(2, BF16)}, path)
    return path.read_bytes()


def header_of(raw):
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def with_header(header, data):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def corruptions(raw):
    header, data = header_of(raw)
    unknown = json.loads(json.dumps(header))
    unknown["w"]["dtype"] = "F33"
    overlapping = json.loads(json.dumps(header))
    overlapping["w"]["data_offsets"] = [0, 4]
    huge = json.loads(json.dumps(header))
    huge["w"]["shape"] = [10 ** 12]
    return {
        "truncated": raw[:-5],
        "header-length-too-large": struct.pack("<Q", 10 ** 15) + raw[8:],
        "header-not-json": raw[:8] + b"}" + raw[9:],
        "header-not-a-dict": with_header([1, 2], data),
        "unknown-dtype": with_header(unknown, data),
        "offsets-do-not-cover": with_header(overlapping, data),
        "shape-does-not-match": with_header(huge, data),
        "empty": b"",
        "npz-renamed": b"PK\x03\x04" + bytes(40),
    }


@pytest.mark.parametrize("name", ["truncated", "header-length-too-large", "header-not-json",
                                  "header-not-a-dict", "unknown-dtype", "offsets-do-not-cover",
                                  "shape-does-not-match", "empty", "npz-renamed"])
def test_a_damaged_file_is_a_serialization_error(tmp_path, name):
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(corruptions(saved_bytes(tmp_path))[name])
    with pytest.raises(eo.EveryOSerializationError, match=name):
        eo.load(path)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_safetensors_file_is_written_atomically_with_umask_permissions(tmp_path, umask):
    old = os.umask(umask)
    try:
        eo.save({"w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    finally:
        os.umask(old)
    assert os.listdir(tmp_path) == ["m.safetensors"]
    assert os.stat(tmp_path / "m.safetensors").st_mode & 0o777 == 0o666 & ~umask


def test_without_the_library_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "safetensors", None)
    with pytest.raises(eo.EveryOSerializationError, match=r"everyo-core\[safetensors\]"):
        eo.save({"w": np.ones(2)}, tmp_path / "m.safetensors")
    with pytest.raises(eo.EveryOSerializationError, match=r"everyo-core\[safetensors\]"):
        eo.load(tmp_path / "m.safetensors")
