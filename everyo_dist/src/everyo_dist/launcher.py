"""``everyo-run``: start the ranks of a data-parallel job, stream their output, stop them all
when one fails.

One machine::

    everyo-run --nproc-per-node 2 train.py --epochs 3

Several machines (run on each, changing ``--node-rank``)::

    everyo-run --nnodes 2 --node-rank 0 --master 10.0.0.1:29500 --token-file job.token \\
        --nproc-per-node 2 train.py

Each rank runs ``python train.py ...`` with ``EVERYO_BACKEND``, ``EVERYO_RANK``,
``EVERYO_WORLD_SIZE``, ``EVERYO_LOCAL_RANK``, ``EVERYO_MASTER_ADDR``, ``EVERYO_MASTER_PORT``
and the token set, so the script only calls ``eo.distributed.init()``. Node 0's launcher hosts
the ``TCPRendezvousServer``. BLAS thread variables default to 1 in every rank.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from everyo_dist.backend import registered_backend
from everyo_dist.backends.tcp.tls import tls_contexts_from_environment
from everyo_dist.blas import worker_environment
from everyo_dist.errors import DistributedError
from everyo_dist.group import check_timeout
from everyo_dist.initialize import ENVIRONMENT_OPTIONS
from everyo_dist.parent_death import kill_me_when_parent_dies

STOP_GRACE_SECONDS = 5.0


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="everyo-run", description="Launch the ranks of an EveryO data-parallel job.")
    parser.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                        help="ranks to start on this machine (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, metavar="N",
                        help="number of machines in the job (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, metavar="K",
                        help="this machine's index, 0 .. nnodes-1 (node 0 hosts the rendezvous)")
    parser.add_argument("--master", metavar="HOST:PORT",
                        help="rendezvous address; required with --nnodes > 1 (default: "
                             "127.0.0.1 and a free port)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="file holding the shared token (required with --nnodes > 1; "
                             "a random token is generated for a single machine)")
    parser.add_argument("--backend", default="tcp",
                        help="process-group backend the ranks' init() uses (default tcp)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="EVERYO_TIMEOUT: how long a collective waits for its peers")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="when a rank fails, stop every rank and start the job again, up "
                             "to N times (single machine); the script must resume from its "
                             "last checkpoint (default 0)")
    parser.add_argument("script", help="the Python training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1 or args.nnodes < 1:
        parser.error("--nproc-per-node and --nnodes must be at least 1")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in 0..{args.nnodes - 1}, got {args.node_rank}")
    if args.max_restarts < 0:
        parser.error("--max-restarts must be at least 0")
    if args.timeout is not None:  # refused here, once, not by every rank of every restart
        try:
            args.timeout = check_timeout(args.timeout)
        except DistributedError as exc:
            parser.error(f"--timeout: {exc}")
    if args.max_restarts and args.nnodes > 1:
        parser.error("--max-restarts restarts the ranks of one machine; a job of several "
                     "machines needs every node's launcher to restart together, which "
                     "everyo-run does not coordinate")
    if args.nnodes > 1 and (args.master is None or args.token_file is None):
        parser.error("several machines need --master HOST:PORT and --token-file FILE "
                     "(the same on every node)")
    if args.master is not None:
        host, _, port = args.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            parser.error(f"--master must be HOST:PORT with a port in 1..65535, got "
                         f"{args.master!r}")
        args.master_host, args.master_port = host.strip("[]"), int(port)
    return args


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise SystemExit(f"everyo-run: cannot read --token-file {path}: {exc}") from None
    if len(token) < 16:
        raise SystemExit(f"everyo-run: the token in {path} is too short ({len(token)} "
                         "characters); use at least 16 random characters, e.g. "
                         "`python -c 'import secrets; print(secrets.token_hex(32))'`")
    return token


def _option_environment(options: dict) -> dict[str, str]:
    """The ``EVERYO_*`` variables through which ``init()`` reads a backend's prepared options
    (e.g. the shm backend's control segment)."""
    return {ENVIRONMENT_OPTIONS[name][0]: str(value) for name, value in options.items()
            if name in ENVIRONMENT_OPTIONS}


def _rank_environment(args, rank: int, local_rank: int, world_size: int, host: str,
                      port: int, token: str, attempt: int = 0,
                      prepared: dict | None = None) -> dict[str, str]:
    env = worker_environment()  # one BLAS thread per rank unless the user chose otherwise
    env.update(_option_environment(prepared or {}))
    env.update(EVERYO_BACKEND=args.backend, EVERYO_RANK=str(rank),
               EVERYO_WORLD_SIZE=str(world_size), EVERYO_LOCAL_RANK=str(local_rank),
               EVERYO_MASTER_ADDR=host, EVERYO_MASTER_PORT=str(port), EVERYO_TOKEN=token,
               EVERYO_LOCAL_WORLD_SIZE=str(args.nproc_per_node), EVERYO_RESTART=str(attempt),
               PYTHONUNBUFFERED="1")
    env.pop("EVERYO_TOKEN_FILE", None)
    if args.timeout is not None:
        env["EVERYO_TIMEOUT"] = str(args.timeout)
    return env


def _server_tls_context():
    """The rendezvous server's TLS context when the ranks are told to use TLS (the same
    ``EVERYO_TLS_*`` files they read), else None."""
    try:
        contexts = tls_contexts_from_environment(os.environ)
    except DistributedError as exc:
        raise SystemExit(f"everyo-run: {exc}") from None
    return contexts.server if contexts else None


# A rank that failed with one of these lost a peer or waited for one: a consequence of another
# rank's failure, which is what the job's status should name.
_CONSEQUENCES = (b"PeerLostError", b"CollectiveTimeoutError")
FAILURE_GRACE_SECONDS = 1.0  # after a first failure, how long to wait for the root cause's exit


class _RankOutput:
    """What the launcher remembers of a rank's output: its last line (a traceback's names the
    exception) and whether the output has ended."""

    def __init__(self):
        self.last_line = b""
        self.ended = threading.Event()

    def failed_as_consequence(self) -> bool:
        """The rank failed because it lost a peer or waited for one in vain."""
        self.ended.wait(FAILURE_GRACE_SECONDS)
        return any(name in self.last_line for name in _CONSEQUENCES)


def _stream(rank: int, pipe, lock: threading.Lock, output: _RankOutput) -> None:
    """Copy one rank's output to ours, a ``[rank K]`` prefix on every line."""
    prefix = f"[rank {rank}] ".encode()
    out = sys.stdout.buffer
    for line in iter(pipe.readline, b""):
        output.last_line = line
        with lock:
            out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            out.flush()
    pipe.close()
    output.ended.set()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _stop(ranks: dict[int, subprocess.Popen]) -> None:
    """SIGTERM every rank still running, SIGKILL what remains after a grace period."""
    for process in ranks.values():
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in ranks.values():
        try:
            process.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def run(args: argparse.Namespace) -> int:
    """Run the job, restarting every rank after a failure up to ``--max-restarts`` times;
    the exit status of the last attempt."""
    for attempt in range(args.max_restarts + 1):
        status = _run_once(args, attempt)
        if status in (0, 130) or attempt == args.max_restarts:
            return status
        print(f"everyo-run: restarting every rank (restart {attempt + 1} of "
              f"{args.max_restarts}); the script resumes from its last checkpoint",
              file=sys.stderr, flush=True)
    return status


def _run_once(args: argparse.Namespace, attempt: int) -> int:
    """Start this node's ranks and supervise them; the exit status of this attempt."""
    world_size = args.nnodes * args.nproc_per_node
    if args.nnodes == 1 and args.master is None:
        token = _read_token(args.token_file) if args.token_file else secrets.token_hex(32)
        host, port = "127.0.0.1", 0
    else:
        token = _read_token(args.token_file) if args.token_file else ""
        host, port = args.master_host, args.master_port
    with contextlib.ExitStack() as job:
        backend = registered_backend(args.backend, "everyo-run")
        if args.node_rank == 0:
            # NOTE: a backend whose ranks meet at a server (tcp) hosts it here, for the whole
            # job; the others have nothing to host.
            port = job.enter_context(backend.host_rendezvous(
                host, port, world_size, token or None, _server_tls_context()))
        # What the backend prepares for each job, as spawn has it do (the shm backend: its
        # control segment); left after the ranks are stopped, so its segments go with them.
        prepared = job.enter_context(backend.prepare_job(
            world_size, {"master_addr": host, "master_port": port}))
        return _start_and_supervise(args, attempt, world_size, host, port, token, prepared)


def _start_and_supervise(args: argparse.Namespace, attempt: int, world_size: int, host: str,
                         port: int, token: str, prepared: dict) -> int:
    ranks: dict[int, subprocess.Popen] = {}
    lock = threading.Lock()
    readers = []
    outputs: dict[int, _RankOutput] = {}
    try:
        for local_rank in range(args.nproc_per_node):
            rank = args.node_rank * args.nproc_per_node + local_rank
            outputs[rank] = _RankOutput()
            ranks[rank] = subprocess.Popen(
                [sys.executable, args.script, *args.script_args],
                env=_rank_environment(args, rank, local_rank, world_size, host, port, token,
                                      attempt, prepared),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=kill_me_when_parent_dies)
            reader = threading.Thread(target=_stream,
                                      args=(rank, ranks[rank].stdout, lock, outputs[rank]),
                                      daemon=True)
            reader.start()
            readers.append(reader)
        return _supervise(ranks, outputs)
    except KeyboardInterrupt:
        print("everyo-run: interrupted; stopping every rank", file=sys.stderr)
        return 130
    finally:
        _stop(ranks)
        for reader in readers:
            reader.join(timeout=2)


def _supervise(ranks: dict[int, subprocess.Popen], outputs: dict[int, "_RankOutput"]) -> int:
    """Wait for every rank; on failure report the root cause: a rank that failed on its own
    beats one that only lost its peer (which often exits first: its peer's sockets close
    before its interpreter has finished exiting)."""
    exits: queue.Queue[tuple[int, int]] = queue.Queue()
    for rank, process in ranks.items():
        threading.Thread(target=lambda r=rank, p=process: exits.put((r, p.wait())),
                         daemon=True).start()
    failures: list[tuple[int, int]] = []
    for _ in ranks:
        try:
            rank, code = exits.get(timeout=FAILURE_GRACE_SECONDS if failures else None)
        except queue.Empty:
            break
        if code != 0:
            failures.append((rank, code))
            if not outputs[rank].failed_as_consequence():
                break  # a failure of its own: the root cause
    if not failures:
        return 0
    rank, code = min(failures, key=lambda failure: outputs[failure[0]].failed_as_consequence())
    others = sorted(r for r, p in ranks.items() if p.poll() is None)
    print(f"everyo-run: rank {rank} {_describe_exit(code)}; stopping the job"
          + (f" (terminating ranks {', '.join(map(str, others))})" if others else ""),
          file=sys.stderr, flush=True)
    return code if code > 0 else 128 - code


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``everyo-run``."""
    args = parse_arguments(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated launcher stops its ranks too
    try:
        status = run(args)
    except DistributedError as exc:  # the job could not be set up (a busy --master port, ...)
        raise SystemExit(f"everyo-run: {exc}") from None
    sys.exit(status)


if __name__ == "__main__":
    main()
