"""``everyo-run --max-restarts``: a rank SIGKILLed mid-training stops the job, every rank is
started again, the script resumes from its last checkpoint, and the final weights equal an
uninterrupted run's bit for bit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tcp_harness import launcher_environment

EVERYO_RUN = shutil.which("everyo-run", path=str(Path(sys.executable).parent)) or "everyo-run"

# What both scripts share: imports and arguments; the start of a step (rank 1 SIGKILLs
# itself at step kill_at of the first attempt, then the step's batch).
PREAMBLE = """
import os, signal, sys
import numpy as np
import everyo as eo
import everyo.distributed as dist
out, steps, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
"""
STEP_START = """
for step in range(start, steps):
    if step == kill_at and os.environ["EVERYO_RESTART"] == "0" and group.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # a real SIGKILL, mid-training
    rng = np.random.default_rng(step)
    inputs = rng.standard_normal((16, 4)).astype(np.float32)
    targets = inputs.sum(axis=1, keepdims=True)
    rows = dist.shard_indices(16, group.rank, group.world_size)
    optimizer.zero_grad()
"""

# The resume-from-checkpoint pattern of docs/distributed.md: rank 0 saves after every step
# (atomically), every rank loads what it finds at start.
RESUMING_SCRIPT = PREAMBLE + """checkpoint = os.path.join(out, "checkpoint.npz")

group = dist.init()
model = eo.Sequential(eo.Linear(4, 16, seed=0), eo.ReLU(), eo.Linear(16, 1, seed=1))
params = list(model.parameters())
optimizer = eo.SGD(params, lr=0.05)
start = 0
if os.path.exists(checkpoint):
    with np.load(checkpoint, allow_pickle=False) as saved:
        start = int(saved["step"])
        for index, param in enumerate(params):
            param.data[...] = saved[f"param{index}"]
print("attempt", os.environ["EVERYO_RESTART"], "starts at step", start, flush=True)

""" + STEP_START + """    residual = model(eo.tensor(inputs[rows])) - eo.tensor(targets[rows])
    eo.mean(residual * residual).backward()
    dist.average_gradients(params, group)
    optimizer.step()
    if group.is_main:
        partial = checkpoint + ".partial.npz"
        np.savez(partial, step=step + 1, **{f"param{i}": p.data for i, p in enumerate(params)})
        os.replace(partial, checkpoint)

if group.is_main:
    np.savez(os.path.join(out, "final.npz"), *[p.data for p in params])
group.close()
"""


def _train(tmp_path: Path, name: str, kill_at: int, restarts: int,
           script: str = RESUMING_SCRIPT):
    out = tmp_path / name
    out.mkdir()
    source, script = script, tmp_path / f"{name}.py"
    script.write_text(source)
    started = time.monotonic()
    done = subprocess.run([EVERYO_RUN, "--nproc-per-node", "2", "--max-restarts", str(restarts),
                           "--timeout", "30", str(script), str(out), "12", str(kill_at)],
                          env=launcher_environment(), capture_output=True, text=True,
                          timeout=150)
    weights = []
    if (out / "final.npz").exists():
        with np.load(out / "final.npz", allow_pickle=False) as final:
            weights = [final[f"arr_{i}"] for i in range(len(final.files))]
    return done, weights, time.monotonic() - started


def _killed_run_matches_uninterrupted(tmp_path: Path, script: str, restarts: int):
    """An uninterrupted run of ``script``, then one whose rank 1 is SIGKILLed at step 5: the
    second resumes from its checkpoint (not from scratch) and ends with the first's bits.
    Returns the second run's process and its time."""
    name = "resuming" if script is RESUMING_SCRIPT else "zero"
    reference, expected, _ = _train(tmp_path, f"{name}_uninterrupted", kill_at=-1,
                                    restarts=0, script=script)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    assert expected, "the uninterrupted run saved no weights"

    done, weights, elapsed = _train(tmp_path, f"{name}_killed", kill_at=5, restarts=restarts,
                                    script=script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 1 was killed by SIGKILL" in done.stderr, done.stderr
    resumed = [int(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines()
               if "attempt 1 starts at step" in line]
    assert resumed and all(4 <= step <= 5 for step in resumed), done.stdout  # not from scratch
    assert len(weights) == len(expected)
    for got, want in zip(weights, expected):
        assert got.tobytes() == want.tobytes()
    return done, elapsed


def test_a_sigkilled_rank_restarts_the_job_which_ends_bit_identical(tmp_path):
    done, elapsed = _killed_run_matches_uninterrupted(tmp_path, RESUMING_SCRIPT, restarts=2)
    assert "restarting every rank (restart 1 of 2)" in done.stderr
    assert elapsed < 120


def test_without_restarts_the_failure_ends_the_job(tmp_path):
    done, weights, _ = _train(tmp_path, "no_restart", kill_at=2, restarts=0)
    assert done.returncode == 128 + 9, done.stdout + done.stderr
    assert "restarting" not in done.stderr and not weights


def test_max_restarts_is_refused_for_several_machines(tmp_path):
    done = subprocess.run([EVERYO_RUN, "--nnodes", "2", "--master", "127.0.0.1:1",
                           "--token-file", str(tmp_path / "t"), "--max-restarts", "1",
                           str(tmp_path / "x.py")], env=launcher_environment(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "several" in done.stderr


KILLED_ONCE_SCRIPT = """
import os, signal, sys
import numpy as np
import everyo.distributed as dist

group = dist.init()
for step in range(6):
    if group.rank == 1 and step == 2 and os.environ["EVERYO_RESTART"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    total = group.all_reduce_sum(np.full(1000, group.rank + 1.0))
print("attempt", os.environ["EVERYO_RESTART"], "total", total[0], flush=True)
group.close()
"""


def _job_segments(launcher_pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"everyo-{launcher_pid}-")]


def test_the_shm_backend_runs_under_everyo_run_restarts_and_leaves_no_segment(tmp_path):
    script = tmp_path / "killed_once.py"
    script.write_text(KILLED_ONCE_SCRIPT)
    launcher = subprocess.Popen([EVERYO_RUN, "--backend", "shm", "--nproc-per-node", "3",
                                 "--max-restarts", "1", "--timeout", "30", str(script)],
                                env=launcher_environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    stdout, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, stdout + stderr
    assert "rank 1 was killed by SIGKILL" in stderr, stderr
    assert sorted(line.split("] ", 1)[1] for line in stdout.splitlines()) == \
        ["attempt 1 total 6.0"] * 3, stdout
    assert _job_segments(launcher.pid) == []


# ZeRO-1 under restarts: every step the partitions are consolidated on rank 0, which saves the
# model, the optimizer (unsharded layout) and the scheduler atomically; every rank of the
# restarted job loads that file into its sharded optimizer, stepped inside backward by DDP.
ZERO_SCRIPT = PREAMBLE + """from everyo.distributed import DistributedDataParallel, ZeroRedundancyOptimizer
checkpoint = os.path.join(out, "checkpoint.eo")

group = dist.init()
model = eo.Sequential(eo.Linear(4, 16, seed=0), eo.Tanh(), eo.Linear(16, 8, seed=1),
                      eo.Tanh(), eo.Linear(8, 1, seed=2))
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=eo.Adam, group=group,
                                    lr=1e-2, weight_decay=1e-3)
ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.0005, optimizer=optimizer)
scheduler = eo.StepLR(optimizer, step_size=3, gamma=0.5)
start = 0
if os.path.exists(checkpoint):
    saved = eo.load(checkpoint)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    start = int(saved["step"])
print("attempt", os.environ["EVERYO_RESTART"], "starts at step", start, flush=True)

""" + STEP_START + """    residual = ddp(eo.tensor(inputs[rows])) - eo.tensor(targets[rows])
    eo.mean(residual * residual).backward()  # averages, steps the partitions, all-gathers
    scheduler.step()
    optimizer.consolidate_state_dict(to=0)
    if group.is_main:
        partial = checkpoint + ".partial"
        eo.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "step": step + 1}, partial)
        os.replace(partial, checkpoint)
    group.barrier()

ddp.close()
if group.is_main:
    np.savez(os.path.join(out, "final.npz"), *[p.data for p in model.parameters()])
group.close()
"""


def test_a_sigkilled_rank_resumes_zero_sharded_training_bit_identically(tmp_path):
    _killed_run_matches_uninterrupted(tmp_path, ZERO_SCRIPT, restarts=1)
