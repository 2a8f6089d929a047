"""PowerSGD (``comm_hooks.powerSGD_hook``) against the exact all-reduce, two ranks:

* across a shaped link (two network namespaces, as ``bench_ddp.py``; 200 Mbit/s each way by
  default): mlp_large's DDP step time with the exact mean and with PowerSGD at rank 4, and the
  numbers each sends per step (float32 both ways, so the ratio of bytes on the wire);
* training quality: the digits CNN (scikit-learn's 8x8 digits) trained for a fixed number of
  steps on two shm ranks, exact and PowerSGD at ranks 1, 2 and 4: final training loss and
  held-out accuracy.

Run: ``python benchmarks/bench_powersgd.py [--rate 200mbit] [--steps 5] [--train-steps 300]
[--skip-link]``; the link part needs root and iproute2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_ddp import TwoHosts, _run_pair, _timed, tcp_pair  # noqa: E402


def worker_link(case_name: str, rank: int, steps: int, rank_r: int) -> dict:
    import numpy as np
    from bench_training import CASES

    import everyo as eo
    from everyo.distributed import DistributedDataParallel, comm_hooks

    case = {c.name: c for c in CASES}[case_name]
    server, group = tcp_pair(rank, 29621)
    x, y = case.make_batch(np.random.default_rng(rank))
    inputs = eo.tensor(x)
    result = {}
    for mode in ("exact", "powersgd"):
        model = case.everyo_model()
        optimizer = eo.SGD(model.parameters(), lr=0.01)
        ddp = DistributedDataParallel(model, group)
        state = None
        if mode == "powersgd":
            state = comm_hooks.PowerSGDState(group, matrix_approximation_rank=rank_r,
                                             start_powerSGD_iter=0)
            ddp.register_comm_hook(state, comm_hooks.powerSGD_hook)

        def step(ddp=ddp, optimizer=optimizer):
            optimizer.zero_grad()
            eo.cross_entropy(ddp(inputs), y).backward()
            optimizer.step()

        result[mode] = _timed(step, steps, group.barrier)
        if state is not None:
            _, before, after = state.compression_stats()
            result["numbers_exact"], result["numbers_powersgd"] = before, after
        ddp.close()
    group.close()
    if server is not None:
        server.close()
    return result


def _digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype("float32")[:, :, :, None]
    return x[:1500], data.target[:1500], x[1500:], data.target[1500:]


def train_digits(group, steps: int, rank_r: int, start: int) -> dict:
    import numpy as np
    from bench_training import CASES

    import everyo as eo
    from everyo.distributed import DistributedDataParallel, comm_hooks, shard_indices

    case = {c.name: c for c in CASES}["cnn_digits"]
    x, y, x_test, y_test = _digits()
    model = case.everyo_model()
    optimizer = eo.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp = DistributedDataParallel(model, group)
    state = None
    if rank_r:
        state = comm_hooks.PowerSGDState(group, matrix_approximation_rank=rank_r,
                                         start_powerSGD_iter=start)
        ddp.register_comm_hook(state, comm_hooks.powerSGD_hook)
    rows = shard_indices(len(x), group.rank, group.world_size, drop_last=True)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        batch = rng.choice(rows, 32, replace=False)
        optimizer.zero_grad()
        loss = eo.cross_entropy(ddp(eo.tensor(x[batch])), y[batch])
        loss.backward()
        optimizer.step()
        losses.append(float(group.all_reduce_mean(np.float64(loss.data))))
    ddp.close()
    with eo.no_grad():
        predicted = model(eo.tensor(x_test)).data.argmax(axis=1)
    ratio = state.compression_stats() if state is not None else (1.0, 0, 0)
    return {"loss": float(np.mean(losses[-20:])), "accuracy": float(np.mean(predicted == y_test)),
            "rate": float(ratio[0])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=("link",))
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--device", default="")
    parser.add_argument("--case", default="mlp_large")
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--matrix-rank", type=int, default=4)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--skip-link", action="store_true")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker_link(args.case, args.rank, args.steps, args.matrix_rank)))
        return
    print(f"load average {os.getloadavg()[0]:.1f} at the start (2 ranks, one BLAS thread each)")
    if not args.skip_link:
        if shutil.which("ip") is None or shutil.which("tc") is None or os.geteuid() != 0:
            raise SystemExit("the link part needs root and iproute2 (or --skip-link)")
        with TwoHosts(args.rate) as hosts:
            out = _run_pair(hosts, ["link", "--case", args.case, "--steps", str(args.steps),
                                    "--matrix-rank", str(args.matrix_rank)], script=__file__)
        print(f"{args.case} over {args.rate}: exact step {out['exact'] * 1e3:.0f} ms, PowerSGD "
              f"rank {args.matrix_rank} step {out['powersgd'] * 1e3:.0f} ms "
              f"({out['powersgd'] / out['exact']:.2f}x); wire numbers per step "
              f"{out['numbers_powersgd'] / out['numbers_exact']:.4f} of the exact all-reduce's")
    from everyo.distributed import spawn

    print(f"digits CNN, 2 shm ranks, {args.train_steps} steps of 2 x 32 rows, SGD momentum:")
    for rank_r in (0, 1, 2, 4):
        results = spawn(train_digits, 2, args=(args.train_steps, rank_r, 10), timeout=1800)
        name = "exact" if rank_r == 0 else f"PowerSGD r={rank_r}"
        print(f"  {name:<14} loss (last 20 steps) {results[0]['loss']:.4f}  held-out accuracy "
              f"{results[0]['accuracy']:.3f}  compression {results[0]['rate']:.1f}x", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
