"""bfloat16 as a tensor dtype: conversion, arithmetic dtypes, checkpoints, and clear refusals."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

import everyo as eo
from everyo.dtypes import BFLOAT16


def test_to_converts_and_its_gradient_comes_back_in_the_source_dtype():
    x = eo.tensor([1.0, 3.14159, -2e-3, 1e30], requires_grad=True)
    low = x.to("bfloat16")
    assert low.dtype == "bfloat16" and x.to("float32") is x
    np.testing.assert_array_equal(low.data.view(np.uint16),
                                  x.data.astype(BFLOAT16).view(np.uint16))
    (low.to("float32") * eo.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad, [1.0, 2.0, 3.0, 4.0])


def test_creation_functions_accept_the_name():
    assert eo.zeros(2, dtype="bfloat16").dtype == "bfloat16"
    assert eo.tensor([0.5], dtype="bfloat16", requires_grad=True).requires_grad
    assert eo.Parameter(np.ones(2, BFLOAT16)).dtype == "bfloat16"  # kept, not widened


def test_python_scalars_do_not_widen_a_bfloat16_tensor():
    b = eo.ones(3, dtype="bfloat16")
    assert (b * 2.5).dtype == "bfloat16" and (1.0 - b).dtype == "bfloat16"
    assert (b + eo.ones(3)).dtype == "float32"  # two tensors: NumPy's promotion


def test_module_to_goes_to_bfloat16_and_back():
    model = eo.Linear(3, 2, seed=0)
    original = model.weight.data.copy()
    model.to("bfloat16")
    assert model.weight.dtype == "bfloat16" and model(eo.ones(1, 3).to("bfloat16")).dtype \
        == "bfloat16"
    model.to("float32")
    assert model.weight.dtype == "float32"
    np.testing.assert_allclose(model.weight.data, original, rtol=2**-8)


def test_save_load_round_trips_the_raw_payload_without_pickle(tmp_path):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # NaNs and infs included
    state = {"all": bits.view(BFLOAT16), "w": eo.randn(3, 2, seed=0).to("bfloat16"),
             "ints": np.arange(4, dtype=np.uint16)}
    path = tmp_path / "bf16.npz"
    eo.save(state, path)
    loaded = eo.load(path)
    assert loaded["all"].dtype == BFLOAT16 and loaded["ints"].dtype == np.uint16
    np.testing.assert_array_equal(loaded["all"].view(np.uint16), bits)
    np.testing.assert_array_equal(loaded["w"].view(np.uint16), state["w"].data.view(np.uint16))
    # on disk: a plain uint16 .npy member, readable with allow_pickle=False
    with np.load(path, allow_pickle=False) as npz:
        structure = json.loads(npz["__everyo_structure__"].tobytes())
        payloads = [npz[name].dtype for name in npz.files if name != "__everyo_structure__"]
    assert structure["version"] == 2 and np.dtype(np.uint16) in payloads


def test_checkpoints_without_bfloat16_keep_format_version_1(tmp_path):
    eo.save({"w": np.ones(2, np.float32)}, tmp_path / "f32.npz")
    with np.load(tmp_path / "f32.npz", allow_pickle=False) as npz:
        assert json.loads(npz["__everyo_structure__"].tobytes())["version"] == 1


def test_a_forged_dtype_name_is_a_serialization_error(tmp_path):
    path = tmp_path / "bf16.npz"
    eo.save({"w": np.ones(2, BFLOAT16)}, path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    key = "__everyo_structure__.npy"
    members[key] = members[key].replace(b'"dtype": "bfloat16"', b'"dtype": "float8xy"')
    forged = tmp_path / "forged.npz"
    with zipfile.ZipFile(forged, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(eo.EveryOSerializationError, match="float8xy"):
        eo.load(forged)


def test_other_ml_dtypes_types_are_refused_by_name():
    with pytest.raises(eo.EveryOError, match="float8_e4m3fn is not supported.*bfloat16"):
        eo.zeros(2, dtype="float8_e4m3fn")
    with pytest.raises(eo.EveryOError, match="unknown dtype 'bfloat17'"):
        eo.ones(2).to("bfloat17")


def test_float16_meeting_bfloat16_computes_in_float32():
    b, h = eo.ones(2, 2, dtype="bfloat16"), eo.ones(2, 2, dtype="float16")
    assert (b + h).dtype == "float32" and (b @ h).dtype == "float32"  # PyTorch's promotion
    np.testing.assert_array_equal((b @ h).data, np.full((2, 2), 2.0, np.float32))
    # NOTE: ml_dtypes 0.7 gives NumPy a common type for the pair, 0.4 none: EveryO
    # promotes itself, so joining them is float32 (PyTorch's torch.cat) with any ml_dtypes
    pick = eo.tensor(np.array([[True, False], [False, True]]))
    for join in (eo.concatenate, eo.stack, lambda pair: eo.where(pick, *pair).reshape(1, 4)):
        b.requires_grad, h.requires_grad = True, True
        joined = join([b, h])
        assert joined.dtype == "float32"
        np.testing.assert_array_equal(joined.data.reshape(-1, 2), np.ones_like(joined.data).reshape(-1, 2))
        (joined * 3.0).sum().backward()
        assert (b.grad.dtype, h.grad.dtype) == ("bfloat16", "float16")
        assert b.grad.sum(dtype=np.float32) + h.grad.sum(dtype=np.float32) == 3.0 * joined.size
        b.grad = h.grad = None


def test_an_op_whose_operands_have_no_common_dtype_is_refused_by_name():
    class Join(eo.Op):  # an op that needs NumPy's common type up front
        __slots__ = ()
        name = "join"

        def forward(self, a, b):
            return np.concatenate([a, b])

    # (NumPy has no common type of bfloat16 and int64; a non-numeric operand, such as a
    # datetime array, is refused earlier, as not numeric: tests/fuzz/test_hostile_operands.py)
    with pytest.raises(eo.EveryOError, match=r"'join' cannot combine dtypes "
                                             r"\['bfloat16', 'int64'\]"):
        Join.apply(eo.ones(1, dtype="bfloat16"), np.ones(1, np.int64))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reductions_of_16_bit_tensors_sum_in_float32_and_round_once(dtype):
    # NumPy sums bfloat16 sequentially in bfloat16: 10,000 values in [0, 1) summed to 256
    # (float16's cumsum stalled at 2048), where PyTorch accumulates in float32
    values = np.random.default_rng(0).random(10_000).astype(np.float32)
    low = eo.tensor(values).to(dtype)
    wide = low.data.astype(np.float32)  # the 16-bit values, exactly

    def rounded(array):
        return np.asarray(array, np.float32).astype(dtype)

    cases = {
        "sum": (low.sum(), wide.sum()),
        "mean": (low.mean(), wide.mean()),
        "var": (low.var(), wide.var()),
        "cumsum": (eo.cumsum(low, 0), np.cumsum(wide)),
        "einsum": (eo.einsum("i,i->", low, low), np.einsum("i,i->", wide, wide)),
    }
    rows = wide.reshape(10, 1000)
    shifted = np.exp(rows - rows.max(axis=1, keepdims=True))
    cases["softmax"] = (eo.softmax(low.reshape(10, 1000), axis=-1),
                        shifted / shifted.sum(axis=1, keepdims=True))
    cases["log_softmax"] = (eo.log_softmax(low.reshape(10, 1000), axis=-1),
                            np.log(shifted / shifted.sum(axis=1, keepdims=True)))
    for name, (ours, reference) in cases.items():
        assert ours.dtype == dtype, name
        np.testing.assert_allclose(ours.data.astype(np.float32),
                                   rounded(reference).astype(np.float32),
                                   rtol=2 ** -7, atol=0, err_msg=name)


def test_save_load_keeps_the_shape_of_0_d_and_transposed_bfloat16_arrays(tmp_path):
    # the payload went through np.ascontiguousarray, which made a 0-d array shape (1,)
    scalar = np.array(1.5, BFLOAT16)
    transposed = np.arange(6.0, dtype=np.float32).reshape(2, 3).T.astype(BFLOAT16)
    eo.save({"scalar": scalar, "transposed": transposed}, tmp_path / "c.npz")
    loaded = eo.load(tmp_path / "c.npz")
    assert loaded["scalar"].shape == () and loaded["scalar"].dtype == BFLOAT16
    assert loaded["scalar"].item() == 1.5
    np.testing.assert_array_equal(loaded["transposed"].view(np.uint16),
                                  transposed.view(np.uint16))
