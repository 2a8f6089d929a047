"""``init()``: create the process group of the current process from arguments or ``EVERYO_*``
environment variables (what ``everyo-run`` sets), through the backend registry.

The variables, and the factory parameter each one fills:

=========================  ==============  ===================================================
``EVERYO_BACKEND``         (backend)       registered backend name: ``shm``, ``tcp``, ``mpi``
``EVERYO_RANK``            ``rank``        this process's rank
``EVERYO_WORLD_SIZE``      ``world_size``  number of processes
``EVERYO_LOCAL_RANK``      ``local_rank``  rank among the processes of this machine
``EVERYO_MASTER_ADDR``     ``master_addr`` host of the rendezvous (rank 0's machine)
``EVERYO_MASTER_PORT``     ``master_port`` its port
``EVERYO_TOKEN``           ``token``       shared secret authenticating the ranks
``EVERYO_TOKEN_FILE``      ``token``       file holding it (when ``EVERYO_TOKEN`` is unset)
``EVERYO_TIMEOUT``         ``timeout``     seconds a collective may wait
``EVERYO_SHM_SEGMENT``     ``segment``     shared-memory name of an ``shm`` group
``EVERYO_WIRE_DTYPE``      ``wire_dtype``  tcp wire compression: ``float16``/``bfloat16``
=========================  ==============  ===================================================

A variable only fills a parameter the backend's factory declares, and an explicit keyword
argument always wins over the variable. ``EVERYO_LOCAL_WORLD_SIZE`` (ranks on this machine)
fills no parameter: local rank 0 uses it to warn when those ranks run multi-threaded BLAS.
"""

from __future__ import annotations

import os
from pathlib import Path

from everyo_dist.backend import as_backend, registered_backend
from everyo_dist.errors import DistributedError

# option name -> (environment variable, parser)
ENVIRONMENT_OPTIONS: dict[str, tuple[str, type]] = {
    "rank": ("EVERYO_RANK", int),
    "world_size": ("EVERYO_WORLD_SIZE", int),
    "local_rank": ("EVERYO_LOCAL_RANK", int),
    "master_addr": ("EVERYO_MASTER_ADDR", str),
    "master_port": ("EVERYO_MASTER_PORT", int),
    "token": ("EVERYO_TOKEN", str),
    "timeout": ("EVERYO_TIMEOUT", float),
    "segment": ("EVERYO_SHM_SEGMENT", str),
    "wire_dtype": ("EVERYO_WIRE_DTYPE", str),
}
BACKEND_VARIABLE = "EVERYO_BACKEND"
LOCAL_WORLD_SIZE_VARIABLE = "EVERYO_LOCAL_WORLD_SIZE"  # ranks on this machine (BLAS warning)
TOKEN_FILE_VARIABLE = "EVERYO_TOKEN_FILE"


def _environment_value(option: str, environ) -> object | None:
    variable, parse = ENVIRONMENT_OPTIONS[option]
    raw = environ.get(variable)
    if raw is None and option == "token" and environ.get(TOKEN_FILE_VARIABLE):
        path = Path(environ[TOKEN_FILE_VARIABLE])
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise DistributedError(f"{TOKEN_FILE_VARIABLE}={path} cannot be read: {exc}") from None
    if raw is None:
        return None
    try:
        return parse(raw)
    except ValueError:
        raise DistributedError(f"environment variable {variable}={raw!r} is not a valid "
                               f"{parse.__name__}") from None


def resolve_options(factory, explicit: dict, environ=None) -> dict:
    """Explicit options, completed from the environment for the parameters ``factory`` (a
    function or a :class:`~everyo_dist.backend.Backend`) declares.

    Example:
        >>> def factory(rank, world_size, timeout=None): ...
        >>> resolve_options(factory, {"rank": 1}, {"EVERYO_RANK": "0", "EVERYO_WORLD_SIZE": "2"})
        {'rank': 1, 'world_size': 2}
    """
    environ = os.environ if environ is None else environ
    declared, takes_any = as_backend("(options)", factory).parameters()
    options = dict(explicit)
    for option in ENVIRONMENT_OPTIONS:
        if option in options or not (takes_any or option in declared):
            continue
        value = _environment_value(option, environ)
        if value is not None:
            options[option] = value
    return options


def init(backend: str | None = None, **options):
    """Create the process group of this process.

    Args:
        backend: a registered backend name (``"shm"``, ``"tcp"``, ``"mpi"``, ...); defaults to
            ``$EVERYO_BACKEND``.
        **options: passed to the backend's factory (``rank``, ``world_size``, ``timeout``,
            ...); parameters left out are read from the ``EVERYO_*`` variables listed in this
            module's docstring.
    Returns:
        A :class:`~everyo_dist.group.ProcessGroup`.

    Example:
        >>> import everyo.distributed as dist
        >>> with dist.init(backend="shm", rank=0, world_size=1) as group:
        ...     group.all_reduce_sum([1.0, 2.0])
        array([1., 2.], dtype=float32)
    """
    chosen = registered_backend(backend or os.environ.get(BACKEND_VARIABLE), "init()")
    group = chosen(**resolve_options(chosen, options))
    _warn_about_threaded_blas(group, os.environ)
    return group


def _warn_about_threaded_blas(group, environ) -> None:
    """Once per machine (local rank 0): warn if this machine's ranks run threaded BLAS pools."""
    from everyo_dist.blas import warn_if_oversubscribed

    local_size = environ.get(LOCAL_WORLD_SIZE_VARIABLE, "")
    local_rank = environ.get(ENVIRONMENT_OPTIONS["local_rank"][0], "")
    ranks_here = int(local_size) if local_size.isdigit() else group.ranks_on_this_machine
    first_here = int(local_rank) == 0 if local_rank.isdigit() else group.rank == 0
    if first_here:
        warn_if_oversubscribed(ranks_here)
