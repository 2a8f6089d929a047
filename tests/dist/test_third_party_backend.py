"""A backend from another distribution is spawnable exactly like ``shm``: one ``Backend``
registration (factory + ``prepare_job``) in a package installed by pip with a real dist-info,
found by fresh worker interpreters through its entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "everyo-files"
version = "0.1.0"
dependencies = ["everyo-dist"]

[project.entry-points.everyo]
everyo_files = "everyo_files"
"""

# Ranks meet in a directory the spawn parent creates (prepare_job) and removes afterwards; each
# collective writes one file per rank and waits for the others' files.
MODULE = '''\
import contextlib
import os
import shutil
import tempfile
import time

import numpy as np

import everyo as eo
from everyo.distributed import Backend, ProcessGroup, reduce_rows


class FileTransport:
    name = "files"

    def __init__(self, rank, world_size, directory):
        self.rank, self.world_size, self.directory = rank, world_size, directory
        self._calls = 0

    def _path(self, call_number, rank):
        return os.path.join(self.directory, f"{call_number}-{rank}.npy")

    def _share(self, call, array):
        self._calls += 1
        partial = self._path(self._calls, self.rank) + ".part.npy"
        np.save(partial, array)
        os.replace(partial, self._path(self._calls, self.rank))
        missing = list(range(self.world_size))
        while True:
            missing = [r for r in missing if not os.path.exists(self._path(self._calls, r))]
            if not missing:
                return [np.load(self._path(self._calls, r), allow_pickle=False)
                        for r in range(self.world_size)]
            if call.remaining() <= 0:
                raise call.timeout_error(missing, "their files never appeared")
            time.sleep(0.005)

    def exchange_fingerprints(self, call, packed):
        return [row.tobytes() for row in self._share(call, np.frombuffer(packed, np.uint8))]

    def all_reduce(self, call, flat, mean, out):
        reduce_rows(self._share(call, flat), out, self.world_size if mean else 1)

    def broadcast(self, call, flat, src):
        return self._share(call, flat)[src]

    def all_gather(self, call, flat):
        return np.stack(self._share(call, flat))

    def close(self):
        pass


def create_file_group(rank, world_size, timeout=None, directory=None):
    if directory is None:
        raise ValueError("the files backend needs directory= (spawn prepares it)")
    return ProcessGroup(rank, world_size, FileTransport(rank, world_size, directory), timeout)


@contextlib.contextmanager
def prepare_file_job(world_size, options):
    directory = tempfile.mkdtemp(prefix="everyo-files-")
    try:
        yield {**options, "directory": directory}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@eo.hookimpl
def everyo_register_backends(register):
    register("files", Backend("files", create_file_group, prepare_job=prepare_file_job))
'''

SCRIPT = '''\
import os
import numpy as np
from everyo.distributed import spawn


def job(group):
    data = np.arange(6, dtype=np.float32).reshape(2, 3) * (group.rank + 1) / 7
    return (group.backend, group.transport.directory if group.backend == "files" else "",
            group.all_reduce_mean(data), group.all_reduce_sum(data.astype(np.float64)),
            group.all_gather(np.int64([group.rank])), group.broadcast(data, src=2))


if __name__ == "__main__":
    files = spawn(job, 3, backend="files", timeout=60)
    shm = spawn(job, 3, backend="shm", timeout=60)
    assert [r[0] for r in files] == ["files"] * 3, files
    directory = files[0][1]
    assert directory and not os.path.exists(directory), directory  # prepared, then removed
    for mine, reference in zip(files, shm):
        for a, b in zip(mine[2:], reference[2:]):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (a, b)
    print("same bits as shm")
'''


@pytest.fixture(scope="module")
def installed_backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("third_party_backend")
    source = root / "everyo-files"
    (source / "src" / "everyo_files").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "src" / "everyo_files" / "__init__.py").write_text(MODULE)
    site = root / "site"
    # --no-build-isolation: this environment's setuptools, no network; --no-deps keeps pip from
    # installing everyo-dist a second time into the target.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
         str(source)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert list(site.glob("everyo_files-0.1.0.dist-info/entry_points.txt"))
    return site


def test_an_installed_third_party_backend_spawns_like_shm(installed_backend, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(installed_backend), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env=env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "same bits as shm" in result.stdout


def test_the_plain_factory_registration_still_works_for_init():
    """A backend registered as a bare factory function (no Backend) is one without a
    preparation step: init fills its declared parameters, spawn calls it as it is."""
    from everyo_dist.backend import as_backend

    def factory(rank, world_size, timeout=None):
        return (rank, world_size, timeout)

    backend = as_backend("bare", factory)
    assert backend(rank=0, world_size=1) == (0, 1, None)
    assert backend.parameters() == ({"rank", "world_size", "timeout"}, False)
    with backend.prepare_job(2, {"x": 1}) as options:
        assert options == {"x": 1}


def test_the_shipped_backends_are_registered_as_backends():
    import everyo as eo
    from everyo_dist.backend import Backend

    items = eo.registry("backends").items
    for name in ("shm", "tcp", "mpi"):
        assert isinstance(items[name], Backend) and items[name].name == name
    assert Path(items["shm"].factory.__code__.co_filename).parent.name == "shm"
