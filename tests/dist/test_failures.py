"""Never hang, never leak: every failure mode with real processes and real signals, each with a
bound on how long it may take and a check that /dev/shm is left clean."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dist_workers
import pytest

from everyo.distributed import WorkerError, spawn
from everyo_dist.backends.shm import segments

START_UP = 10.0  # seconds a few interpreters may take to start on a loaded 2-core machine


def _pids(directory: Path) -> list[int]:
    """Pids the workers wrote (a file being written may still be empty: skipped)."""
    texts = [p.read_text().strip() for p in directory.glob("*.pid")]
    return [int(text) for text in texts if text]


def _assert_all_gone(pids, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(segments.process_alive(pid) for pid in pids):
            return
        time.sleep(0.05)
    alive = [pid for pid in pids if segments.process_alive(pid)]
    raise AssertionError(f"worker processes {alive} outlived the job")


def test_different_collectives_fail_fast_naming_both_sides(clean_shm):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(dist_workers.mismatched_op, 2, timeout=120)
    assert time.monotonic() - start < START_UP  # immediate: nowhere near the 120 s timeout
    message = str(info.value)
    assert "CollectiveMismatchError" in message
    assert "all_reduce_mean #0 on float32[4]" in message and "barrier #0" in message


def test_different_shapes_fail_fast_naming_both_shapes(clean_shm):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(dist_workers.mismatched_shape, 2, timeout=120)
    assert time.monotonic() - start < START_UP
    assert "float32[4]" in str(info.value) and "float32[5]" in str(info.value)


def test_timeout_names_the_collective_and_the_missing_rank(clean_shm):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(dist_workers.skip_collective, 3, args=(2,), timeout=1.5)
    elapsed = time.monotonic() - start
    assert START_UP + 1.5 > elapsed >= 1.5
    message = str(info.value)
    assert "CollectiveTimeoutError" in message
    assert "all_reduce_sum #0 on float32[3] timed out after 1.5s" in message
    assert "rank 2 did not arrive" in message


def test_worker_exception_reaches_the_parent_and_stops_the_others(tmp_path, clean_shm):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(dist_workers.raise_on_rank, 3, args=(1, str(tmp_path)), timeout=120)
    assert time.monotonic() - start < START_UP
    error = info.value
    assert error.rank == 1 and error.signal is None
    assert "worker rank 1 raised ValueError: boom from rank 1" in str(error)
    assert "Traceback" in error.details and "raise_on_rank" in error.details
    pids = _pids(tmp_path)
    assert len(pids) == 3
    _assert_all_gone(pids, within=0.5)  # spawn returned only after stopping them


def test_sigkilled_worker_is_reported_with_its_signal(tmp_path, clean_shm, monkeypatch):
    # let the survivor report what it saw instead of being stopped first
    monkeypatch.setattr("everyo_dist.spawn.FAILURE_GRACE_SECONDS", 30.0)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(dist_workers.sigkill_on_rank, 2, args=(1, str(tmp_path)), timeout=120)
    assert time.monotonic() - start < START_UP  # the survivor noticed well before 120 s
    assert info.value.rank == 1 and info.value.signal == "SIGKILL"
    message = str(info.value)
    assert "worker rank 1 was killed by signal SIGKILL" in message
    assert "also failed: rank 0 raised PeerLostError: all_reduce_mean #1 on float32[1000]: " \
           "rank 1 was lost" in message
    _assert_all_gone(_pids(tmp_path), within=0.5)


PARENT_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from everyo.distributed import spawn

    if __name__ == "__mp_main__":  # inside a worker, before it joins the group
        path = os.path.join(sys.argv[1], f"{os.getpid()}")
        open(path, "w").write(str(os.getpid()))
        os.rename(path, path + ".pid")  # appears complete or not at all
        time.sleep(120)

    def work(group):
        return group.rank

    if __name__ == "__main__":
        spawn(work, 2)
""")


def test_workers_die_with_a_sigkilled_parent_and_its_segment_is_swept(tmp_path, clean_shm):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        deadline = time.monotonic() + START_UP * 2
        while len(_pids(tmp_path)) < 2:
            assert time.monotonic() < deadline, "the workers never started"
            assert parent.poll() is None, "the parent script failed"
            time.sleep(0.05)
        left_behind = [name for name in segments.our_segments()
                       if segments.parse_name(name)[0] == parent.pid]
        assert left_behind, "the job should own a segment while its workers start"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _assert_all_gone(_pids(tmp_path), within=5.0)
        still_there = set(left_behind) & set(segments.our_segments())  # nobody cleaned up...
        removed = segments.sweep_stale_segments()  # ...until the next job starts
        assert still_there <= set(removed)
        assert not set(left_behind) & set(segments.our_segments())
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_sweep_keeps_segments_of_live_processes(clean_shm):
    alive = segments.Segment(segments.segment_name(segments.new_job_id(), "ctl"), 64, True)
    try:
        assert alive.name not in segments.sweep_stale_segments()
        assert alive.name in segments.our_segments()
    finally:
        alive.close()
        assert segments.unlink(alive.name)


def test_success_leaves_no_process_and_no_segment(tmp_path, clean_shm):
    results = spawn(dist_workers.report_blas_pools, 2)
    assert len(results) == 2


def test_unpicklable_function_is_refused_before_starting(clean_shm):
    with pytest.raises(Exception, match="top level of a module"):
        spawn(lambda group: None, 2)
    with pytest.raises(Exception, match="world_size"):
        spawn(dist_workers.report_blas_pools, 0)


LATE_DEFINITION = textwrap.dedent("""
    from everyo.distributed import spawn

    def first(group):
        return group.rank

    spawn(first, 1)

    def second(group):  # defined after the first top-level spawn(): the workers never see it
        return group.rank

    spawn(second, 1)
""")


def test_function_defined_below_the_first_spawn_gets_a_hint(tmp_path, clean_shm):
    script = tmp_path / "late.py"
    script.write_text(LATE_DEFINITION)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "define worker functions above it" in done.stderr


def test_a_failed_resize_of_shared_memory_leaves_no_segment(clean_shm):
    """Rank 0 creates the larger data segment, then times out waiting for rank 1 to map it:
    the new segment's name must not stay in /dev/shm while rank 0's process lives on."""
    import threading

    from everyo_dist.backends.shm.group import ShmTransport
    from everyo_dist.contract import Collective
    from everyo_dist.errors import CollectiveTimeoutError

    job = segments.new_job_id()
    name = segments.segment_name(job, "ctl")
    transports = [None, None]

    def join(rank):
        transports[rank] = ShmTransport(rank, 2, name, Collective.starting(rank, 2, 10.0))

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    try:
        with pytest.raises(CollectiveTimeoutError):  # rank 1 never comes to the resize
            transports[0]._ensure_capacity(Collective.starting(0, 2, 0.3), 1 << 20)
        assert segments.our_segments(job) == []
    finally:
        for transport in transports:
            if transport is not None:
                transport.close()
