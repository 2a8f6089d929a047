"""Training code shared by the GradScaler tests and handed by name to ``spawn``'s workers."""

from __future__ import annotations

import numpy as np

import everyo as eo


def mlp(seed=0):
    return eo.Sequential(eo.Linear(4, 8, seed=seed), eo.ReLU(), eo.Linear(8, 2, seed=seed + 1))


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return (eo.tensor(rng.standard_normal((16, 4)).astype(np.float32)),
            eo.tensor(rng.standard_normal((16, 2)).astype(np.float32)))


def amp_loss(model, x, y):
    with eo.autocast():
        prediction = model(x)
    return ((prediction - y) ** 2).mean()


def lockstep_rank(group, rank, steps, bad_steps):
    """One rank's AMP training loop; ``bad_steps`` holds (rank, step) pairs where this rank
    alone gets a NaN gradient. Returns (applied flags, scales, final weights)."""
    model = mlp(seed=0)
    optimizer = eo.SGD(list(model.parameters()), lr=1e-2)
    scaler = eo.GradScaler(init_scale=2.0**8, growth_interval=2, group=group)
    x, y = batch(seed=rank)
    applied, scales = [], []
    for step in range(steps):
        optimizer.zero_grad()
        scaler.backward(amp_loss(model, x, y))
        if (rank, step) in bad_steps:
            next(model.parameters()).grad[0, 0] = np.nan
        applied.append(scaler.step(optimizer))
        scaler.update()
        scales.append(scaler.get_scale())
    return applied, scales, [p.data.copy() for p in model.parameters()]


def lockstep_worker(group, steps, bad_steps):
    """``spawn`` entry point: the loop above on this worker's rank, with its process group."""
    return lockstep_rank(group, group.rank, steps, bad_steps)
