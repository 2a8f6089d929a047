"""Train a small model with dropout and a shuffling DataLoader, in one of three modes (run as
a fresh process by test_resume.py):

    straight OUT        20 steps, write the final parameters to OUT
    first CKPT          10 steps, write a checkpoint (model, optimizer, scheduler, generators,
                        loader) to CKPT
    resume CKPT OUT     load CKPT, 10 more steps, write the final parameters to OUT
"""

from __future__ import annotations

import sys

import numpy as np

import everyo as eo


def build():
    eo.manual_seed(0)
    model = eo.Sequential(eo.Linear(6, 16, seed=1), eo.ReLU(), eo.Dropout(0.3),
                          eo.Linear(16, 16, seed=2), eo.ReLU(), eo.Dropout(0.2, seed=7),
                          eo.Linear(16, 3, seed=3))
    decay = [p for name, p in model.named_parameters() if name.endswith("weight")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith("bias")]
    optimizer = eo.AdamW([{"params": decay, "weight_decay": 0.1},
                          {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
    warmup = eo.LinearLR(optimizer, start_factor=0.1, total_iters=5)
    cosine = eo.CosineAnnealingLR(optimizer, T_max=15)
    scheduler = eo.SequentialLR(optimizer, [warmup, cosine], milestones=[5])
    rng = np.random.default_rng(42)
    x = rng.standard_normal((56, 6)).astype(np.float32)
    y = rng.integers(0, 3, 56)
    loader = eo.DataLoader((x, y), batch_size=16, shuffle=True, seed=5)  # 4 batches an epoch
    return model, optimizer, scheduler, loader


def train(model, optimizer, scheduler, loader, steps):
    done = 0
    while done < steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = eo.cross_entropy(model(x), y)
            loss.backward()
            eo.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            done += 1
            if done == steps:
                return


def main(mode, *paths):
    model, optimizer, scheduler, loader = build()
    if mode == "resume":
        checkpoint = eo.load(paths[0])
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        loader.load_state_dict(checkpoint["loader"])
        eo.set_rng_state(checkpoint["rng"], model)
        paths = paths[1:]
    train(model, optimizer, scheduler, loader, 20 if mode == "straight" else 10)
    if mode == "first":
        eo.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "loader": loader.state_dict(),
                 "rng": eo.get_rng_state(model)}, paths[0])
    else:
        eo.save(model.state_dict(), paths[0])


if __name__ == "__main__":
    main(*sys.argv[1:])
