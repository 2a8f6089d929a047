"""A timeline of one ``DistributedDataParallel`` step across the shaped link of ``bench_ddp.py``:
when backward starts, when each segment's gradients are final and handed to the communication
thread, when each segment is on the wire (its all-reduce call) and done, when each bucket is
written back and stepped (``optimizer=``), and when backward returns. Both ranks share one
clock (``time.perf_counter`` is system-wide); times are ms from the step's start on rank 0.

    python benchmarks/ddp_timeline.py [--case mlp_large] [--steps 3] [--mode ddp_opt|ddp]
        [--bucket-cap-mb default] [--rate 1gbit]

Needs root and iproute2, as ``bench_ddp.py``; the instrumentation wraps the wrapper's methods
from outside (nothing of it is in the library).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench_ddp import ENV, TwoHosts, tcp_pair


def _instrument(ddp_class, overlap_class, bucket_class, events: list):
    """Wrap DDP's hand-over (``_job``: a segment's values are final and copied, next it goes to
    the communication thread, or the training thread runs it in ``_finish``), the jobs
    themselves, finish, write-back and the per-bucket step."""
    now = time.perf_counter

    make_job = ddp_class._job

    def job(self, segment):
        inner = make_job(self, segment)  # (its values copied: final, about to be handed over)
        events.append(("handed", segment.index, now()))
        if inner is None:
            return None
        size = segment.stop - segment.start

        def timed():
            events.append(("wire_start", segment.index, now(), size))
            try:
                return inner()
            finally:
                events.append(("wire_end", segment.index, now()))
        return timed
    ddp_class._job = job

    finish = ddp_class._finish

    def finishing(self, last):
        events.append(("last_grad", -1, now()))
        return finish(self, last)
    ddp_class._finish = finishing

    write_back = bucket_class.write_back

    def writing(self):
        events.append(("write_back", self.index, now()))
        return write_back(self)
    bucket_class.write_back = writing

    step = overlap_class.step

    def stepping(self, bucket):
        start = now()
        step(self, bucket)
        events.append(("stepped", bucket.index, start, now()))
    overlap_class.step = stepping


def _relative(event: tuple, t0: float) -> tuple:
    """``(name, index, times in ms from t0..., extra)``: a "wire_start" carries its size."""
    name, index, *rest = event
    extra = rest[1:] if name == "wire_start" else []
    times = rest[:1] if name == "wire_start" else rest
    return (name, index, *[(v - t0) * 1e3 for v in times], *extra)


def worker(case, rank: int, steps: int, mode: str, cap, switch_interval: float | None) -> dict:
    import sys

    import numpy as np

    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)

    import everyo as eo
    from everyo_dist import buckets as buckets_module
    from everyo_dist import ddp as ddp_module
    from everyo_dist import overlap as overlap_module

    server, group = tcp_pair(rank, 29613)
    x, y = case.make_batch(np.random.default_rng(rank))
    inputs = eo.tensor(x)
    model = case.everyo_model()
    optimizer = eo.SGD(list(model.parameters()), lr=0.01)
    events: list = []
    _instrument(ddp_module.DistributedDataParallel, overlap_module.OverlappedStep,
                buckets_module.Bucket, events)
    ddp = ddp_module.DistributedDataParallel(model, group, bucket_cap_mb=cap,
                                             optimizer=optimizer if mode == "ddp_opt" else None)
    steps_out = []
    for _ in range(steps + 2):
        group.barrier()
        events.clear()
        t0 = time.perf_counter()
        events.append(("zero_grad", -1, t0))
        optimizer.zero_grad()
        loss = eo.cross_entropy(ddp(inputs), y)
        events.append(("forward_done", -1, time.perf_counter()))
        loss.backward()
        events.append(("backward_returned", -1, time.perf_counter()))
        if mode == "ddp":
            optimizer.step()
            events.append(("step_done", -1, time.perf_counter()))
        steps_out.append([_relative(event, 0.0) for event in events])  # (ms, absolute)
    layout = [(s.index, s.bucket.index, s.stop - s.start,
               f"rows {s.row_start}:{s.row_stop}" if s.row_stop is not None else
               f"{len(s.params)} params") for s in ddp._segments]
    ddp.close()
    group.close()
    if server is not None:
        server.close()
    return {"layout": layout, "steps": steps_out[2:]}


def run_pair(hosts: TwoHosts, argv: list[str]) -> list[dict]:
    """Both ranks' JSON results (``bench_ddp._run_pair`` keeps rank 0's only)."""
    commands = [["ip", "netns", "exec", hosts.names[rank], sys.executable, __file__, "--worker",
                 *argv, "--rank", str(rank), "--device", hosts.devices[rank]] for rank in (0, 1)]
    processes = [subprocess.Popen(c, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for c in commands]
    outputs = [p.communicate(timeout=900) for p in processes]
    for process, (_, err) in zip(processes, outputs):
        if process.returncode != 0:
            raise SystemExit(f"timeline worker failed:\n{err}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def summary(events: list) -> str:
    origin = events[0][2]  # zero_grad
    events = [(n, i, *[v - origin if isinstance(v, float) else v for v in rest])
              for n, i, *rest in events]
    return _summary(events)


def _summary(events: list) -> str:
    """Forward end, the first segment's hand-over -> wire gap, the sum of every hand-over ->
    wire gap while the thread was idle, the time the link was not carrying a segment between
    the first and the last, and backward's return."""
    first = {}
    for name, index, time_, *_ in events:
        first.setdefault((name, index), time_)
    wires = sorted((v, first[("wire_end", i)]) for (n, i), v in first.items()
                   if n == "wire_start")
    idle = sum(b[0] - a[1] for a, b in zip(wires, wires[1:]) if b[0] > a[1])
    handoff = first[("wire_start", 0)] - first[("handed", 0)]
    return (f"forward {first[('forward_done', -1)]:7.2f}  first handed "
            f"{first[('handed', 0)]:7.2f} on wire {wires[0][0]:7.2f} (+{handoff:5.2f})  link idle "
            f"between segments {idle:6.2f}  last wire end {wires[-1][1]:7.2f}  returned "
            f"{first[('backward_returned', -1)]:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--device", default="")
    parser.add_argument("--case", default="mlp_large")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mode", default="ddp_opt", choices=("ddp", "ddp_opt"))
    parser.add_argument("--bucket-cap-mb", default="default")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval in the workers (the GIL's; default 0.005 s)")
    parser.add_argument("--summary", action="store_true", help="one line per step")
    args = parser.parse_args()
    from bench_training import CASES

    case = {c.name: c for c in CASES}[args.case]
    cap = None if args.bucket_cap_mb == "default" else float(args.bucket_cap_mb)
    if args.worker:
        print(json.dumps(worker(case, args.rank, args.steps, args.mode, cap,
                                args.switch_interval)))
        return
    with TwoHosts(args.rate) as hosts:
        results = run_pair(hosts, ["--case", args.case, "--steps", str(args.steps), "--mode",
                                   args.mode, "--bucket-cap-mb", args.bucket_cap_mb,
                                   "--rate", args.rate]
                           + ([] if args.switch_interval is None else
                              ["--switch-interval", str(args.switch_interval)]))
    if args.summary:
        for rank, result in enumerate(results):
            for events in result["steps"]:
                print(f"rank {rank}: {summary(events)}")
        return
    print("segments (index, bucket, elements, what):")
    for row in results[0]["layout"]:
        print("  ", *row)
    for number in range(len(results[0]["steps"])):
        # NOTE: one clock (perf_counter is CLOCK_MONOTONIC, system-wide, in every namespace)
        steps = [result["steps"][number] for result in results]
        origin = steps[0][0][2]  # rank 0's zero_grad
        print(f"step {number} (ms from rank 0's zero_grad; rank 0 | rank 1):")
        merged = sorted((event[2], rank, (event[0], event[1], *[
            v - origin if isinstance(v, float) else v for v in event[2:]]))
            for rank, events in enumerate(steps) for event in events)
        for _, rank, (name, index, *rest) in merged:
            times = " ".join(f"{v:8.2f}" if isinstance(v, float) else str(v) for v in rest)
            print(f"  {'':>{28 * rank}}{name:<18} {index:>3} {times}")


if __name__ == "__main__":
    main()
