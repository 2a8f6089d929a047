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

The first five (rank, world size, local rank, rendezvous address) are read by
:func:`~everyo_dist.environment.detect_environment`, which also understands torchrun's, Slurm's
and ``mpiexec``'s variables. A variable only fills a parameter the backend's factory declares,
and an explicit keyword argument always wins over the variable. A backend whose factory
declares ``serve_rendezvous`` (tcp) is told to host its rendezvous on rank 0 when the launcher
is not everyo-run (which hosts it itself). ``EVERYO_LOCAL_WORLD_SIZE`` (ranks on this machine)
fills no parameter: local rank 0 uses it to warn when those ranks run multi-threaded BLAS.
"""

from __future__ import annotations

import os
from pathlib import Path

from everyo_dist.backend import as_backend, registered_backend
from everyo_dist.blas import warn_if_oversubscribed
from everyo_dist.environment import EVERYO_RUN_VARIABLES, detect_environment
from everyo_dist.errors import DistributedError

# option name -> (environment variable, parser); rank, world size, local rank and the
# rendezvous address come from detect_environment (any launcher's variables) instead
ENVIRONMENT_OPTIONS: dict[str, tuple[str, type]] = {
    "token": ("EVERYO_TOKEN", str),
    "timeout": ("EVERYO_TIMEOUT", float),
    "segment": ("EVERYO_SHM_SEGMENT", str),
    "wire_dtype": ("EVERYO_WIRE_DTYPE", str),
}
MEMBERSHIP_OPTIONS = ("rank", "world_size", "local_rank", "master_addr", "master_port")
BACKEND_VARIABLE = "EVERYO_BACKEND"
LOCAL_WORLD_SIZE_VARIABLE = "EVERYO_LOCAL_WORLD_SIZE"  # ranks on this machine (BLAS warning)
LOCAL_RANK_VARIABLE = "EVERYO_LOCAL_RANK"  # everyo-run's local rank (the BLAS warning's)
TOKEN_FILE_VARIABLE = "EVERYO_TOKEN_FILE"
SERVE_RENDEZVOUS = "serve_rendezvous"  # a factory option: rank 0 hosts the rendezvous
# the backend init() picks, by launcher, when neither backend= nor EVERYO_BACKEND says
LAUNCHER_BACKENDS = {"openmpi": "mpi", "pmi": "mpi", "torchrun": "tcp", "slurm": "tcp",
                     "everyo-run": "tcp"}


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
    function or a :class:`~everyo_dist.backend.Backend`) declares: rank, world size, local
    rank and rendezvous address from :func:`detect_environment` (any launcher), the rest from
    ``EVERYO_*`` variables.

    Example:
        >>> def factory(rank, world_size, timeout=None): ...
        >>> resolve_options(factory, {"rank": 1}, {"EVERYO_RANK": "0", "EVERYO_WORLD_SIZE": "2"})
        {'rank': 1, 'world_size': 2}
    """
    environ = os.environ if environ is None else environ
    declared, takes_any = as_backend("(options)", factory).parameters()
    wanted = [option for option in (*MEMBERSHIP_OPTIONS, *ENVIRONMENT_OPTIONS, SERVE_RENDEZVOUS)
              if option not in explicit and (option in declared or
                                             (takes_any and option != SERVE_RENDEZVOUS))]
    options = dict(explicit)
    if any(variable in environ for variable in EVERYO_RUN_VARIABLES.values()):
        # an explicit option completes an EVERYO_* environment (e.g. rank= with
        # EVERYO_WORLD_SIZE), as each variable filled its option alone before
        environ = {**environ, **{EVERYO_RUN_VARIABLES[o]: str(explicit[o])
                                 for o in MEMBERSHIP_OPTIONS if explicit.get(o) is not None}}
    cluster = detect_environment(environ) if set(wanted) & set(MEMBERSHIP_OPTIONS) else None
    for option in wanted:
        if option in ENVIRONMENT_OPTIONS:
            value = _environment_value(option, environ)
        elif option == SERVE_RENDEZVOUS:  # nobody else hosts it (everyo-run does)
            value = True if cluster is not None and cluster.launcher != "everyo-run" and \
                options.get("rank", cluster.rank) == 0 else None
        else:
            value = None if cluster is None else getattr(cluster, option)
        if value is not None:
            options[option] = value
    return options


def init(backend: str | None = None, **options):
    """Create the process group of this process.

    With no arguments, everything comes from the environment that launched the process:
    rank, world size and rendezvous address through :func:`detect_environment` (everyo-run,
    torchrun, Slurm, Open MPI's or MPICH's ``mpiexec``), the backend from ``$EVERYO_BACKEND``
    or else from the launcher (``mpi`` under ``mpiexec``, ``tcp`` otherwise).

    Args:
        backend: a registered backend name (``"shm"``, ``"tcp"``, ``"mpi"``, ...); defaults to
            ``$EVERYO_BACKEND``, then to the launcher's.
        **options: passed to the backend's factory (``rank``, ``world_size``, ``timeout``,
            ...); parameters left out are read from the environment (this module's docstring).
    Returns:
        A :class:`~everyo_dist.group.ProcessGroup`.

    Example:
        >>> import everyo.distributed as dist
        >>> with dist.init(backend="shm", rank=0, world_size=1) as group:
        ...     group.all_reduce_sum([1.0, 2.0])
        array([1., 2.], dtype=float32)
    """
    chosen = registered_backend(backend or os.environ.get(BACKEND_VARIABLE)
                                or _launcher_backend(os.environ), "init()")
    group = chosen(**resolve_options(chosen, options))
    _warn_about_threaded_blas(group, os.environ)
    return group


def _launcher_backend(environ) -> str | None:
    cluster = detect_environment(environ)
    return None if cluster is None else LAUNCHER_BACKENDS[cluster.launcher]


def _warn_about_threaded_blas(group, environ) -> None:
    """Once per machine (local rank 0): warn if this machine's ranks run threaded BLAS pools."""
    local_size = environ.get(LOCAL_WORLD_SIZE_VARIABLE, "")
    local_rank = environ.get(LOCAL_RANK_VARIABLE, "")
    ranks_here = int(local_size) if local_size.isdigit() else group.ranks_on_this_machine
    first_here = int(local_rank) == 0 if local_rank.isdigit() else group.rank == 0
    if first_here:
        warn_if_oversubscribed(ranks_here)
