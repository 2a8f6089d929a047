"""``eo.save`` to a path that cannot be a file: a missing directory, a directory, an empty
path. Each was Python's raw OSError from the final rename (and the empty path wrote its
temporary file into the parent of the working directory first); now an EveryO error naming
the path, raised before anything is written, and still the OSError it was for code that
catches that."""

from __future__ import annotations

import os

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOSerializationError


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_saving_into_a_missing_directory_names_it(tmp_path, suffix):
    target = tmp_path / "missing" / f"w{suffix}"
    with pytest.raises(EveryOSerializationError, match=r"save: .*missing.* does not exist") \
            as caught:
        eo.save({"w": np.ones(3)}, target)
    assert isinstance(caught.value, FileNotFoundError)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_saving_over_a_directory_is_refused_before_writing(tmp_path, suffix):
    target = tmp_path / f"w{suffix}"
    target.mkdir()
    with pytest.raises(EveryOSerializationError, match=r"is a directory") as caught:
        eo.save({"w": np.ones(3)}, target)
    assert isinstance(caught.value, IsADirectoryError)
    assert sorted(os.listdir(tmp_path)) == [target.name]  # no temporary file left or written


def test_an_empty_path_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    with pytest.raises(EveryOSerializationError, match=r"empty"):
        eo.save({"w": np.ones(3)}, "")
    assert sorted(os.listdir(tmp_path)) == ["work"] and not os.listdir(workdir)
