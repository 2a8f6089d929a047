"""``spawn``: run a function in N fresh worker processes, each holding a process group.

Workers are new interpreters (``subprocess``, i.e. fork+exec: never a bare ``fork`` of a parent
whose NumPy may already run threads), started with one BLAS thread each (see
``everyo_dist.blas``). The parent watches them: results come back over private pipes; the
first worker that raises or dies makes the parent stop the others (SIGTERM, then SIGKILL) and
raise ``WorkerError`` with that rank's traceback or signal. Workers exit when the parent dies,
and the job's shared-memory segments are removed whatever happens.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import time

from everyo_dist import worker as worker_module
from everyo_dist.backend import registered_backend
from everyo_dist.blas import worker_environment
from everyo_dist.errors import (
    CollectiveTimeoutError,
    DistributedError,
    PeerLostError,
    WorkerError,
)
from everyo_dist.payload import decode

STOP_GRACE_SECONDS = 2.0
FAILURE_GRACE_SECONDS = 0.5  # after a first failure, how long to collect the others' reports
_WORKER_COMMAND = "from everyo_dist.worker import main; main()"
_CONSEQUENCES = (PeerLostError.__name__, CollectiveTimeoutError.__name__)


def _preparation_data() -> dict:
    """What a worker needs to re-create this process's ``__main__`` (as multiprocessing's spawn
    start method does): module name for ``python -m``, else the script path."""
    main = sys.modules.get("__main__")
    data = {"sys_path": list(sys.path), "sys_argv": list(sys.argv)}
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__",) and not spec.name.endswith(
            ".__main__"):
        data["main_name"] = spec.name
    elif spec is None and getattr(main, "__file__", None):
        path = os.path.abspath(main.__file__)
        if os.path.basename(path) != "__main__.py" and os.path.exists(path):
            data["main_path"] = path
    return data


def _pickled_job(fn, args, preparation: dict) -> bytes:
    if getattr(fn, "__module__", None) == "__main__" and "main_name" not in preparation \
            and "main_path" not in preparation:
        raise DistributedError(
            f"spawn cannot send {fn.__qualname__!r} to the workers: it is defined in an "
            f"interactive session or executed code, which the workers cannot import. Define it "
            f"in a module or script file.")
    try:
        return pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise DistributedError(
            f"spawn sends the function and its args to the workers by reference, which failed "
            f"for {getattr(fn, '__qualname__', fn)!r}: {exc}. Use a function defined at the "
            f"top level of a module or script (not a lambda or a nested function).") from exc


def _message(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


class _Worker:
    """The parent's view of one worker process."""

    def __init__(self, rank: int, process: subprocess.Popen, report_fd: int):
        self.rank = rank
        self.process = process
        self.report_fd = report_fd
        self.received = bytearray()
        self.eof = False
        self.failed_at: float | None = None

    def frame(self) -> tuple[bytes, bytes] | None:
        """The worker's complete report, once its pipe closed."""
        if len(self.received) < worker_module.FRAME.size:
            return None
        kind, size = worker_module.FRAME.unpack_from(self.received)
        payload = bytes(self.received[worker_module.FRAME.size:])
        return (kind, payload) if len(payload) == size else None


def spawn(fn, world_size: int, args: tuple = (), backend: str = "shm",
          timeout: float | None = None, backend_options: dict | None = None) -> list:
    """Run ``fn(group, *args)`` in ``world_size`` new worker processes; return their results.

    Each worker receives its own :class:`~everyo_dist.group.ProcessGroup` (``group.rank``,
    ``group.world_size``, collectives). ``fn`` must be importable by the workers: defined at the
    top level of a module or of the script being run. The workers re-execute that script as
    ``__mp_main__`` (its ``if __name__ == "__main__":`` block does not run; a script without one
    stops at its ``spawn`` call, with its output silenced).

    Workers start with ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` (and
    the other BLAS thread variables) set to 1, unless the user set them: several workers with a
    BLAS thread per core each would fight over the cores.

    Args:
        fn: the worker function, called as ``fn(group, *args)``.
        world_size: number of workers (see ``available_workers()``).
        args: extra arguments, pickled to every worker.
        backend: a registered backend: ``"shm"`` (shared memory on this machine), ``"tcp"``
            (a loopback rendezvous with a fresh token), or any installed backend; its
            ``prepare_job`` step runs here, around the whole job (see ``Backend``).
        timeout: seconds any collective (and start-up) may wait for the peers before raising
            ``CollectiveTimeoutError`` (default ``DEFAULT_TIMEOUT``). Not a limit on the job.
        backend_options: extra keyword arguments for the backend's factory.
    Returns:
        The workers' return values, ordered by rank. Arrays, numbers, strings and
        lists/tuples/dicts of them come back without pickle.
    Raises:
        WorkerError: a worker raised (its traceback text is in the message) or died (the
            signal is named); the other workers were stopped.
    """
    if worker_module.BOOTSTRAPPING:
        raise worker_module.StopMainExecution
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise DistributedError(f"spawn: world_size must be a positive integer, got {world_size!r}")
    if not callable(fn):
        raise DistributedError(f"spawn: fn must be callable, got {fn!r}")
    chosen = registered_backend(backend, "spawn")
    preparation = _preparation_data()
    job_bytes = _pickled_job(fn, tuple(args), preparation)
    workers: list[_Worker] = []
    with chosen.prepare_job(world_size, dict(backend_options or {})) as options:
        try:
            workers = _start_workers(world_size)
            for rank, worker in enumerate(workers):  # all started first: they boot in parallel
                header = dict(preparation, rank=rank, world_size=world_size, backend=backend,
                              timeout=timeout, options=options)
                _send_job(worker, pickle.dumps(header), job_bytes)
            return _monitor(workers)
        finally:
            _stop(workers)


def _start_workers(world_size: int) -> list[_Worker]:
    """Start ``world_size`` worker interpreters, each with a private report pipe."""
    env = worker_environment()
    workers: list[_Worker] = []
    try:
        for rank in range(world_size):
            read_fd, write_fd = os.pipe()
            try:
                process = subprocess.Popen(
                    [sys.executable, "-c", _WORKER_COMMAND, str(write_fd)],
                    stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
            workers.append(_Worker(rank, process, read_fd))
    except BaseException:
        _stop(workers)
        raise
    return workers


def _send_job(worker: _Worker, header: bytes, job_bytes: bytes) -> None:
    """Write the worker's header and the pickled job to its stdin (kept open: see worker)."""
    try:
        worker.process.stdin.write(_message(header) + _message(job_bytes))
        worker.process.stdin.flush()
    except BrokenPipeError:
        pass  # it died at start-up: reported by the monitor


def _monitor(workers: list[_Worker]) -> list:
    """Collect every worker's report; on the first failure stop and raise."""
    selector = selectors.DefaultSelector()
    for worker in workers:
        selector.register(worker.report_fd, selectors.EVENT_READ, worker)
    results: dict[int, object] = {}
    failures: list[_Worker] = []
    try:
        while len(results) + len(failures) < len(workers):
            first_failure = min((w.failed_at for w in failures), default=None)
            if first_failure is not None and time.monotonic() - first_failure > \
                    FAILURE_GRACE_SECONDS:
                break
            for key, _ in selector.select(timeout=0.1):
                worker = key.data
                chunk = os.read(worker.report_fd, 1 << 20)
                if chunk:
                    worker.received += chunk
                    continue
                selector.unregister(worker.report_fd)
                worker.eof = True
                frame = worker.frame()
                if frame is not None and frame[0] == b"R":
                    results[worker.rank] = frame[1]
                else:
                    worker.failed_at = time.monotonic()
                    failures.append(worker)
            for worker in workers:  # a worker can die without closing the pipe (grandchild)
                if not worker.eof and worker.failed_at is None \
                        and worker.process.poll() is not None and not _readable(worker):
                    worker.failed_at = time.monotonic()
                    failures.append(worker)
    finally:
        selector.close()
    if failures:
        _stop(workers)
        raise _failure_error(failures)
    for worker in workers:
        worker.process.wait(timeout=STOP_GRACE_SECONDS * 5)
    return [decode(results[rank]) for rank in range(len(workers))]


def _readable(worker: _Worker) -> bool:
    ready = selectors.DefaultSelector()
    try:
        ready.register(worker.report_fd, selectors.EVENT_READ)
        return bool(ready.select(timeout=0))
    finally:
        ready.close()


def _describe(worker: _Worker) -> tuple[str, str, str | None, str]:
    """(summary, details, signal name, exception type) of a failed worker."""
    frame = worker.frame()
    if frame is not None and frame[0] == b"E":
        exc_type, _, text = frame[1].decode("utf-8", "replace").partition("\n")
        last = text.strip().splitlines()[-1] if text.strip() else ""
        _, colon, detail = last.partition(": ")
        summary = f"{exc_type}: {detail}" if colon else exc_type
        return f"worker rank {worker.rank} raised {summary}", text, None, exc_type
    try:
        code = worker.process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        code = None
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        return (f"worker rank {worker.rank} was killed by signal {name}",
                f"process {worker.process.pid} killed by {name}", name, "")
    return (f"worker rank {worker.rank} exited with code {code} without a result",
            f"process {worker.process.pid} exited with code {code}", None, "")


def _failure_error(failures: list[_Worker]) -> WorkerError:
    """The error naming the root cause: a death or an exception of its own beats a peer's
    "rank N was lost" or timeout, which are consequences; ties go to the earliest."""
    described = [(worker, *_describe(worker)) for worker in failures]
    described.sort(key=lambda item: (item[4] in _CONSEQUENCES, item[0].failed_at))
    worker, summary, details, signal_name, _ = described[0]
    message = f"{summary}; the other workers were stopped"
    for _, other_summary, *_ in described[1:]:
        message += f"\nalso failed: {other_summary.removeprefix('worker ')}"
    if details:
        message += f"\n\n--- rank {worker.rank} ---\n{details.rstrip()}"
    return WorkerError(message, worker.rank, details, signal_name)


def _stop(workers: list[_Worker]) -> None:
    """Stop every worker still running (SIGTERM, then SIGKILL) and reap them all."""
    running = [w for w in workers if w.process.poll() is None]
    for worker in running:
        _signal(worker, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for worker in running:
        try:
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(worker, signal.SIGKILL)
            worker.process.wait()
    for worker in workers:
        if worker.process.stdin is not None and not worker.process.stdin.closed:
            try:
                worker.process.stdin.close()
            except OSError:
                pass
        if worker.report_fd >= 0:
            os.close(worker.report_fd)
            worker.report_fd = -1


def _signal(worker: _Worker, signum: int) -> None:
    try:
        worker.process.send_signal(signum)
    except ProcessLookupError:
        pass
