"""Exact resume: 10 steps, a checkpoint, 10 more in a fresh process == 20 straight steps, bit
for bit, with dropout (global and own generators), a shuffling DataLoader stopped mid-epoch,
parameter groups, a warm-up + cosine schedule and gradient clipping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import everyo as eo

WORKER = Path(__file__).with_name("resume_worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1"}


def _run(*args):
    subprocess.run([sys.executable, str(WORKER), *map(str, args)], check=True, env=ENV,
                   timeout=120)


def test_resume_in_a_fresh_process_is_bit_identical(tmp_path):
    _run("straight", tmp_path / "straight.npz")
    _run("first", tmp_path / "ckpt.npz")
    _run("resume", tmp_path / "ckpt.npz", tmp_path / "resumed.npz")
    straight, resumed = eo.load(tmp_path / "straight.npz"), eo.load(tmp_path / "resumed.npz")
    assert list(straight) == list(resumed)
    for key in straight:
        np.testing.assert_array_equal(resumed[key], straight[key], err_msg=key)
    checkpoint = eo.load(tmp_path / "ckpt.npz")
    assert checkpoint["loader"]["position"] == 2  # stopped mid-epoch: the test covers that


def test_without_the_generator_states_the_run_differs(tmp_path):
    # The same resume minus the generators: proves the comparison above can fail.
    _run("straight", tmp_path / "straight.npz")
    _run("first", tmp_path / "ckpt.npz")
    checkpoint = eo.load(tmp_path / "ckpt.npz")
    checkpoint["rng"]["default"]["state"]["state"] += 1
    eo.save(checkpoint, tmp_path / "ckpt.npz")
    _run("resume", tmp_path / "ckpt.npz", tmp_path / "resumed.npz")
    straight, resumed = eo.load(tmp_path / "straight.npz"), eo.load(tmp_path / "resumed.npz")
    assert any(not np.array_equal(straight[k], resumed[k]) for k in straight)


def test_loader_state_continues_the_epoch():
    x = np.arange(10)
    loader = eo.DataLoader(x, batch_size=3, shuffle=True, seed=0)
    it = iter(loader)
    first = [next(it).data.tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b.data.tolist() for b in it]
    next_epoch = [b.data.tolist() for b in loader]
    resumed = eo.DataLoader(x, batch_size=3, shuffle=True, seed=123)
    resumed.load_state_dict(state)
    assert [b.data.tolist() for b in resumed] == rest
    assert [b.data.tolist() for b in resumed] == next_epoch
    assert sorted(sum(first + rest, [])) == list(range(10))


def test_manual_seed_makes_initialisation_reproducible():
    # As torch.manual_seed: layers created without seed= draw from the global generator.
    def build():
        return eo.Sequential(eo.Conv2D(1, 4, 3), eo.Flatten(), eo.Linear(4, 2),
                             eo.LSTM(2, 3), eo.Embedding(5, 2))

    eo.manual_seed(7)
    first = [p.data.copy() for p in build().parameters()]
    eo.manual_seed(7)
    again = [p.data.copy() for p in build().parameters()]
    other = [p.data.copy() for p in build().parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other))
