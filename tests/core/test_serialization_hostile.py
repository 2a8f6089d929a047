"""eo.load of crafted files and eo.save of objects it cannot store: always an
EveryOSerializationError naming the problem, never a raw TypeError/AttributeError/
RecursionError; depth and size are bounded before parsing; files get 0o666 & ~umask."""

from __future__ import annotations

import json
import os
import warnings
import zipfile

import numpy as np
import pytest

import everyo as eo

STRUCTURE = "__everyo_structure__"


def write_crafted(path, structure, arrays=None, raw_structure=None):
    """An archive laid out as eo.save lays it out, with a structure of our choosing."""
    text = raw_structure if raw_structure is not None else json.dumps(structure)
    members = dict(arrays or {})
    members[STRUCTURE] = np.frombuffer(text.encode(), dtype=np.uint8)
    np.savez(path, **members)
    return path


def nested_lists(depth):
    return "{" + '"list": [{' * depth + '"value": 1' + "}]" * depth + "}"


CRAFTED_TREES = {
    "value-list": {"value": [1, 2]},
    "value-dict": {"value": {"a": 1}},
    "tree-list": [1, 2],
    "tree-int": 5,
    "dict-of-string": {"dict": "abc"},
    "dict-unhashable-key": {"dict": [[{"a": 1}, {"value": 1}]]},
    "dict-short-item": {"dict": [["a"]]},
    "list-of-numbers": {"list": [1, 2]},
    "tuple-of-string": {"tuple": "ab"},
    "array-int-ref": {"array": 5},
    "array-missing": {"array": "a7"},
    "array-structure": {"array": STRUCTURE},
    "dtype-list": {"array": "a0", "dtype": ["x"]},
    "two-kinds": {"value": 1, "list": []},
    "unknown-kind": {"set": [1]},
    "empty-node": {},
}


@pytest.mark.parametrize("name", sorted(CRAFTED_TREES))
def test_a_crafted_tree_is_a_serialization_error(tmp_path, name):
    path = write_crafted(tmp_path / "c.npz",
                         {"format": "everyo-npz", "version": 1, "tree": CRAFTED_TREES[name]},
                         {"a0": np.ones(2)})
    with pytest.raises(eo.EveryOSerializationError, match="c.npz"):
        eo.load(path)


@pytest.mark.parametrize("structure", [
    "[1, 2]", '"text"', "null", '{"format": "everyo-npz", "version": "2", "tree": {}}',
    '{"format": "everyo-npz", "version": 1}', '{"format": ["everyo-npz"], "tree": {}}',
])
def test_a_crafted_structure_is_a_serialization_error(tmp_path, structure):
    path = write_crafted(tmp_path / "c.npz", None, raw_structure=structure)
    with pytest.raises(eo.EveryOSerializationError, match="c.npz"):
        eo.load(path)


def test_a_structure_member_that_is_not_bytes_is_refused(tmp_path):
    path = tmp_path / "c.npz"
    np.savez(path, **{STRUCTURE: np.array([[1.5, 2.5]])})
    with pytest.raises(eo.EveryOSerializationError, match="c.npz"):
        eo.load(path)


def test_deep_nesting_is_refused_before_parsing(tmp_path):
    text = '{"format": "everyo-npz", "version": 1, "tree": ' + nested_lists(900) + "}"
    path = write_crafted(tmp_path / "deep.npz", None, raw_structure=text)
    with pytest.raises(eo.EveryOSerializationError, match="nest"):
        eo.load(path)
    brackets = '{"format": "everyo-npz", "version": 1, "tree": ' + "[" * 100000 + "]" * 100000 + "}"
    path = write_crafted(tmp_path / "brackets.npz", None, raw_structure=brackets)
    with pytest.raises(eo.EveryOSerializationError, match="nest"):
        eo.load(path)


def test_moderate_nesting_still_round_trips(tmp_path):
    value = 1
    for _ in range(50):
        value = [value]
    eo.save({"v": value}, tmp_path / "ok.npz")
    assert eo.load(tmp_path / "ok.npz")["v"] == value


def test_a_member_that_expands_far_beyond_the_file_is_refused(tmp_path):
    path = tmp_path / "bomb.npz"
    eo.save({"a": np.ones(2)}, path)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("a9.npy", "w", force_zip64=True) as member:
            chunk = bytes(1 << 24)
            for _ in range(40):  # 640 MiB of zeros in under a MiB of file
                member.write(chunk)
    assert os.path.getsize(path) < 4 << 20
    with pytest.raises(eo.EveryOSerializationError, match="expand"):
        eo.load(path)


def test_saving_a_cyclic_object_is_refused_by_name(tmp_path):
    state = {"a": [1, 2]}
    state["a"].append(state)
    with pytest.raises(eo.EveryOSerializationError, match="contains itself"):
        eo.save(state, tmp_path / "c.npz")
    assert os.listdir(tmp_path) == []


def test_saving_an_object_nested_too_deep_is_refused_by_name(tmp_path):
    value = 1
    for _ in range(5000):
        value = [value]
    with pytest.raises(eo.EveryOSerializationError, match="nest"):
        eo.save({"v": value}, tmp_path / "deep.npz")


def test_the_same_list_twice_is_not_a_cycle(tmp_path):
    shared = [1, 2]
    eo.save({"a": shared, "b": shared}, tmp_path / "s.npz")
    assert eo.load(tmp_path / "s.npz") == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_checkpoint_is_created_with_the_umask_permissions(tmp_path, umask):
    old = os.umask(umask)
    try:
        eo.save({"a": np.ones(2)}, tmp_path / "m.npz")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "m.npz").st_mode & 0o777 == 0o666 & ~umask


def _npy_member(header: str, payload: bytes) -> bytes:
    """A version 1.0 ``.npy`` member with the header text of our choosing."""
    text = header.encode("latin1")
    text += b" " * ((64 - (10 + len(text) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + payload


@pytest.mark.parametrize("header", [
    # a shape far beyond the member's bytes: refused before anything is allocated
    "{'descr': '<f8', 'fortran_order': False, 'shape': (100000000000,), }",
    "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }",
    # a header NumPy's own parser stumbles on (tokenize.TokenError)
    "{'descr': '<f8', 'fortran_order': False, 'shape': (3,, }",
])
def test_an_array_header_that_does_not_match_its_member_is_refused(tmp_path, header):
    path = tmp_path / "ok.npz"
    eo.save({"w": np.ones(3)}, path)
    with zipfile.ZipFile(path) as archive:
        structure = archive.read(STRUCTURE + ".npy")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a0.npy", _npy_member(header, np.ones(3).tobytes()))
        archive.writestr(STRUCTURE + ".npy", structure)
    with pytest.raises(eo.EveryOSerializationError, match="ok.npz"):
        eo.load(path)


def _npy_header(shape, descr="<f8"):
    """A version 1.0 .npy header declaring ``shape`` (followed by no data here)."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}".encode()
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def _zip(path, members):
    """An archive with exactly these (name, bytes) members, duplicates included."""
    with zipfile.ZipFile(path, "w") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zipfile warns of a duplicate name)
        for name, data in members:
            archive.writestr(name, data)
    return path


def _npy(array):
    import io

    handle = io.BytesIO()
    np.save(handle, array, allow_pickle=False)
    return handle.getvalue()


def _structure_member(tree, version=1):
    text = json.dumps({"format": "everyo-npz", "version": version, "tree": tree})
    return (STRUCTURE + ".npy", _npy(np.frombuffer(text.encode(), dtype=np.uint8)))


ONE_ARRAY = {"dict": [["w", {"array": "a0"}]]}


@pytest.mark.parametrize("members", [
    # a header declaring terabytes over 16 bytes of data: NumPy allocated first (MemoryError)
    [("a0.npy", _npy_header((10 ** 12,)) + bytes(16))],
    [("a0.npy", _npy_header((10 ** 7, 10 ** 7)) + bytes(16))],
    [("a0.npy", _npy_header((3,)) + bytes(16))],  # fewer bytes than declared
    [("a0.npy", _npy_header((1,)) + bytes(16))],  # more
    # dtypes eo.save never writes (it refuses them): strings, dates, records
    [("a0.npy", _npy(np.array(["ab", "c"])))],
    [("a0.npy", _npy(np.array(["2020-01-01"], "M8[D]")))],
    [("a0.npy", _npy(np.zeros(2, [("x", "<f4"), ("y", "<i4")])))],
    [("a0", b"not an array")],  # a member that is not .npy came back as bytes
    [("a0.npy", _npy(np.ones(2))), ("a0.npy", _npy(np.zeros(2)))],  # which one is w?
], ids=["terabytes", "square-terabytes", "short", "long", "unicode", "datetime", "record",
        "raw-bytes", "duplicate-member"])
def test_a_crafted_member_is_refused_before_it_is_read(tmp_path, members):
    path = _zip(tmp_path / "c.npz", [_structure_member(ONE_ARRAY), *members])
    with pytest.raises(eo.EveryOSerializationError, match="c.npz"):
        eo.load(path)


@pytest.mark.parametrize("tree, version", [
    ({"dict": [["w", {"array": "r0", "dtype": "bfloat16"}]]}, 2),  # raw AttributeError
    ({"dict": [["w", {"array": "a0"}], ["w", {"array": "a1"}]]}, 1),  # which w?
    # one array under two names: loaded as one ndarray, so writing one state wrote the other
    ({"dict": [["exp_avg", {"array": "a0"}], ["exp_avg_sq", {"array": "a0"}]]}, 1),
    ({"value": 1}, 0),
])
def test_a_crafted_reference_is_refused(tmp_path, tree, version):
    path = _zip(tmp_path / "c.npz", [_structure_member(tree, version), ("r0", b"\0\0"),
                                     ("a0.npy", _npy(np.ones(2))), ("a1.npy", _npy(np.ones(2)))])
    with pytest.raises(eo.EveryOSerializationError, match="c.npz"):
        eo.load(path)


def test_a_big_endian_or_fortran_member_loads_as_native_values(tmp_path):
    tree = {"dict": [["b", {"array": "a0"}], ["f", {"array": "a1"}]]}
    values = np.arange(6.0).reshape(2, 3)
    path = _zip(tmp_path / "c.npz", [_structure_member(tree), ("a0.npy", _npy(values.astype(">f8"))),
                                     ("a1.npy", _npy(np.asfortranarray(values)))])
    loaded = eo.load(path)
    for array in loaded.values():
        np.testing.assert_array_equal(array, values)
        assert array.dtype == np.float64 and array.dtype.isnative and array.flags.writeable


@pytest.mark.parametrize("path", [None, 3, 2.5, object()])
@pytest.mark.parametrize("call", ["save", "load"])
def test_a_path_that_is_no_path_is_named(call, path):
    arguments = ({"w": np.ones(2)}, path) if call == "save" else (path,)
    with pytest.raises(eo.EveryOSerializationError, match=f"{call}: a path must be a str"):
        getattr(eo, call)(*arguments)


@pytest.mark.parametrize("name", ["missing.npz", "missing.safetensors"])
def test_a_missing_file_is_an_everyo_error_and_a_file_not_found_error(tmp_path, name):
    with pytest.raises(eo.EveryOFileNotFoundError, match="no such file") as caught:
        eo.load(tmp_path / name)
    assert isinstance(caught.value, FileNotFoundError)
