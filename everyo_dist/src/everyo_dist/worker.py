"""The inside of a ``spawn`` worker: a fresh interpreter started by the parent with
``python -c "from everyo_dist.worker import main; main()"``.

The parent writes two length-prefixed pickles to the worker's stdin — first how to re-create
the parent's ``__main__`` (so functions defined in the user's script resolve), then
``(fn, args)`` — and keeps stdin open: end-of-file on it means the parent died, and the worker
exits at once. The worker reports on the pipe whose descriptor is given in ``argv``: one frame
``kind (1 byte) + length (8 bytes) + payload``, kind ``R`` (the encoded return value) or
``E`` (exception type and traceback text).

The user's script is executed as ``__mp_main__`` (so its ``if __name__ == "__main__":`` block
is skipped); a ``spawn()`` call at the top level of an unguarded script stops that execution
early, keeping everything defined above the call (see :data:`BOOTSTRAPPING`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pickle
import struct
import sys
import threading
import traceback
import types

from everyo_dist.parent_death import kill_me_when_parent_dies

FRAME = struct.Struct("<cQ")
BOOTSTRAPPING = False
"""True while the worker executes the user's main script; ``spawn`` then raises
:class:`StopMainExecution` instead of starting workers of its own."""


class StopMainExecution(BaseException):
    """Raised by ``spawn`` called at the top level of the user's script inside a worker."""


def _read_exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError("the spawn parent closed the job pipe early")
    return data


def _read_message(stream):
    size = struct.unpack("<Q", _read_exactly(stream, 8))[0]
    return _read_exactly(stream, size)


def _die_with_parent(stdin) -> None:
    """Exit as soon as the parent dies: the kernel's parent-death signal where available, plus
    a thread waiting for end-of-file on stdin (the parent holds its only write end)."""
    kill_me_when_parent_dies()

    def watch():
        with contextlib.suppress(Exception):
            while stdin.read(65536):
                pass
        os._exit(70)

    threading.Thread(target=watch, name="everyo-parent-watchdog", daemon=True).start()


def _run_main_script(preparation: dict) -> None:
    """Re-create the parent's ``__main__`` as ``__mp_main__`` so pickled references resolve."""
    global BOOTSTRAPPING
    sys.path[:] = preparation["sys_path"]
    sys.argv[:] = preparation["sys_argv"]
    name, path = preparation.get("main_name"), preparation.get("main_path")
    if name is None and path is None:
        return
    module = types.ModuleType("__mp_main__")
    module.__builtins__ = __builtins__
    sys.modules["__mp_main__"] = sys.modules["__main__"] = module
    if name is not None:
        spec = importlib.util.find_spec(name)
        module.__spec__, module.__file__ = spec, spec.origin
        code = spec.loader.get_code(name)
    else:
        module.__file__ = path
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec")
    BOOTSTRAPPING = True
    try:  # the script's own prints already happened in the parent: do not repeat them
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, module.__dict__)
    except StopMainExecution:
        pass
    finally:
        BOOTSTRAPPING = False


def _send(fd: int, kind: bytes, payload: bytes) -> None:
    with os.fdopen(fd, "wb", closefd=True) as pipe:
        pipe.write(FRAME.pack(kind, len(payload)))
        pipe.write(payload)


def main() -> None:
    report_fd = int(sys.argv[1])
    stdin = sys.stdin.buffer
    group = None
    try:
        preparation = pickle.loads(_read_message(stdin))
        job = _read_message(stdin)
        _die_with_parent(stdin)
        _run_main_script(preparation)
        try:
            fn, args = pickle.loads(job)
        except AttributeError as exc:  # e.g. defined below the script's top-level spawn() call
            raise RuntimeError(
                f"the worker could not find what spawn() sent it ({exc}). In the workers the "
                f"script runs only up to its first top-level spawn() call: define worker "
                f"functions above it, or put the spawn() calls under "
                f"`if __name__ == \"__main__\":`.") from exc
        del job

        # NOTE: EveryO (NumPy, the plugins) is imported only now, after the user's script ran
        # as in the parent: what the script sets before its own `import everyo` (an
        # EVERYO_* variable, a thread count) must hold in the worker too.
        from everyo_dist.backend import registered_backend
        from everyo_dist.blas import warn_if_oversubscribed
        from everyo_dist.payload import encode

        backend = registered_backend(preparation["backend"], "spawn")
        group = backend(rank=preparation["rank"], world_size=preparation["world_size"],
                        timeout=preparation["timeout"], **preparation["options"])
        if group.rank == 0:
            warn_if_oversubscribed(group.world_size)
        result = fn(group, *args)
        group.close()
        payload = encode(result)
    except BaseException as exc:  # everything goes back to the parent
        text = "".join(traceback.format_exception(exc))
        if group is not None:
            with contextlib.suppress(Exception):
                group.close()
        _send(report_fd, b"E", f"{type(exc).__name__}\n{text}".encode("utf-8", "replace"))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    _send(report_fd, b"R", payload)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
