"""``detect_environment``: where this process stands in a job, read from the variables the
launcher that started it set, without connecting anywhere.

Launchers are looked for innermost first, because they nest: ``everyo-run`` or ``torchrun``
inside a Slurm step, ``mpiexec`` inside a Slurm allocation. Each launcher's own variables must
be complete and agree with each other; otherwise the environment is refused, naming them.

============  ===========================================================================
launcher      variables (rank, world size, local rank; rendezvous address)
============  ===========================================================================
everyo-run    ``EVERYO_RANK``, ``EVERYO_WORLD_SIZE``, ``EVERYO_LOCAL_RANK``;
              ``EVERYO_MASTER_ADDR``, ``EVERYO_MASTER_PORT``
torchrun      ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (``LOCAL_WORLD_SIZE``);
              ``MASTER_ADDR``, ``MASTER_PORT``
openmpi       ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK`` (``_LOCAL_SIZE``)
pmi           ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` (``MPI_LOCALNRANKS``): MPICH's
              hydra ``mpiexec``, Intel MPI and other PMI launchers
slurm         ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``; the first host of
              ``SLURM_JOB_NODELIST`` and a port derived from ``SLURM_JOB_ID``
============  ===========================================================================

Under the MPI launchers and Slurm, ``MASTER_ADDR`` and ``MASTER_PORT`` (when set) give the
rendezvous address (MPI launchers give none of their own; the ``mpi`` backend needs none).
``master_port`` is where EveryO's rendezvous listens: under torchrun itself, whose agent
already serves ``MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE=True``), the port after it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from everyo_dist.errors import DistributedError
from everyo_dist.nodelist import first_host

TORCHRUN_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "True": torchrun's agent holds the port
SLURM_BASE_PORT = 29500  # PyTorch's default MASTER_PORT
SLURM_PORT_SPREAD = 1000  # jobs whose first node is the same get different ports


@dataclass(frozen=True)
class ClusterEnvironment:
    """This process's place in its job, as its launcher described it.

    Attributes:
        rank: this process's rank, ``0 .. world_size - 1``.
        world_size: number of processes in the job.
        local_rank: rank among the processes of this machine (None when the launcher does
            not say).
        master_addr, master_port: the rendezvous address (None when the launcher gives none).
        launcher: ``"everyo-run"``, ``"torchrun"``, ``"openmpi"``, ``"pmi"`` or ``"slurm"``.
    """

    rank: int
    world_size: int
    local_rank: int | None
    master_addr: str | None
    master_port: int | None
    launcher: str


# launcher -> (rank, world size, local rank, local world size) variables
_LAUNCHERS: dict[str, tuple[str, str, str, str | None]] = {
    "everyo-run": ("EVERYO_RANK", "EVERYO_WORLD_SIZE", "EVERYO_LOCAL_RANK",
                   "EVERYO_LOCAL_WORLD_SIZE"),
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
}
_ADDRESS = {"everyo-run": ("EVERYO_MASTER_ADDR", "EVERYO_MASTER_PORT")}
_GENERIC_ADDRESS = ("MASTER_ADDR", "MASTER_PORT")
EVERYO_RUN_VARIABLES = dict(zip(("rank", "world_size", "local_rank", "master_addr",
                                 "master_port"),
                                (*_LAUNCHERS["everyo-run"][:3], *_ADDRESS["everyo-run"])))
"""The ``EVERYO_*`` variable of each field (``init``'s explicit options complete them)."""
_MPI_FAMILY = ("openmpi", "pmi")
_DECIMAL = re.compile(r"-?[0-9]+")


def _integer(environ, variable: str, lowest: int) -> int | None:
    raw = environ.get(variable)
    if raw is None:
        return None
    # NOTE: ASCII digits only: int() also reads "1_0", "+2" and other scripts' digits, which
    # no launcher writes, and would make them another rank without a word
    if _DECIMAL.fullmatch(raw.strip()) is None:
        raise DistributedError(f"environment variable {variable}={raw!r} is not a valid "
                               f"int")
    value = int(raw.strip())
    if value < lowest:
        raise DistributedError(f"environment variable {variable}={raw!r} must be at least "
                               f"{lowest}")
    return value


def _membership(launcher: str, environ) -> tuple[int, int, int | None]:
    """``(rank, world_size, local_rank)`` of one launcher, checked for agreement."""
    rank_var, size_var, local_var, local_size_var = _LAUNCHERS[launcher]
    missing = [v for v in (rank_var, size_var) if v not in environ]
    if missing:
        present = [v for v in _LAUNCHERS[launcher] if v and v in environ]
        raise DistributedError(f"incomplete {launcher} environment: {', '.join(present)} "
                               f"set but {' and '.join(missing)} not")
    rank, size = _integer(environ, rank_var, 0), _integer(environ, size_var, 1)
    local = _integer(environ, local_var, 0)
    local_size = _integer(environ, local_size_var, 1) if local_size_var else None
    if rank >= size:
        raise DistributedError(f"inconsistent {launcher} environment: {rank_var}={rank} is not "
                               f"below {size_var}={size}")
    if local is not None and local > rank:
        raise DistributedError(f"inconsistent {launcher} environment: {local_var}={local} is "
                               f"above {rank_var}={rank} (the machine would hold ranks below 0)")
    if local_size is not None and local_size > size:
        raise DistributedError(f"inconsistent {launcher} environment: {local_size_var}="
                               f"{local_size} is above {size_var}={size}")
    if local_size is not None and local is not None and local >= local_size:
        raise DistributedError(f"inconsistent {launcher} environment: {local_var}={local} is "
                               f"not below {local_size_var}={local_size}")
    return rank, size, local


def _address(launcher: str, environ, required: bool) -> tuple[str | None, int | None]:
    """The rendezvous address: both variables or neither (``required``: both)."""
    addr_var, port_var = _ADDRESS.get(launcher, _GENERIC_ADDRESS)
    present = [v for v in (addr_var, port_var) if environ.get(v)]
    if len(present) == 1 or (required and not present):
        missing = [v for v in (addr_var, port_var) if v not in present]
        raise DistributedError(f"incomplete {launcher} environment: the rendezvous address "
                               f"needs {' and '.join(missing)} too"
                               + (f" ({present[0]} is set)" if present else ""))
    if not present:
        return None, None
    # (everyo-run's 0: a backend without rendezvous; elsewhere rank 0 would listen on a
    # random port that no peer can dial)
    port = _integer(environ, port_var, 0 if launcher == "everyo-run" else 1)
    if port > 65535:
        raise DistributedError(f"environment variable {port_var}={environ[port_var]!r} is not "
                               f"a port (0..65535)")
    return environ[addr_var], port


def _slurm_address(environ) -> tuple[str, int]:
    """``MASTER_ADDR``/``MASTER_PORT`` when set, else the job's first node and a port from
    its job id (two jobs sharing a first node then rarely pick the same port)."""
    addr, port = _address("slurm", environ, required=False)
    if addr is not None:
        return addr, port
    if not environ.get("SLURM_JOB_NODELIST"):
        raise DistributedError("incomplete slurm environment: SLURM_PROCID is set but neither "
                               "SLURM_JOB_NODELIST nor MASTER_ADDR and MASTER_PORT")
    job = _integer(environ, "SLURM_JOB_ID", 0)
    offset = 0 if job is None else job % SLURM_PORT_SPREAD
    return first_host(environ["SLURM_JOB_NODELIST"]), SLURM_BASE_PORT + offset


def _present(launcher: str, environ) -> bool:
    return any(v and v in environ for v in _LAUNCHERS[launcher])


def _check_mpi_agreement(found: str, environ) -> None:
    """Open MPI's and PMI's variables both set (one process, two MPI launchers): they must
    describe the same place."""
    other = next(name for name in _MPI_FAMILY if name != found)
    if not _present(other, environ):
        return
    mine, theirs = _membership(found, environ)[:2], _membership(other, environ)[:2]
    if mine != theirs:
        names = [f"{v}={environ[v]}" for name in (found, other) for v in _LAUNCHERS[name][:2]]
        raise DistributedError(f"inconsistent MPI environment: {', '.join(names)} describe "
                               f"different ranks or world sizes")


def detect_environment(environ=None) -> ClusterEnvironment | None:
    """Rank, world size, local rank and rendezvous address from the launcher's variables
    (see this module's table), or None when no known launcher started this process.

    Args:
        environ: the variables to read (default ``os.environ``).
    Returns:
        A :class:`ClusterEnvironment`, or None.
    Raises:
        DistributedError: a launcher's variables are partial, not integers, or disagree.

    Example:
        >>> env = detect_environment({"SLURM_PROCID": "5", "SLURM_NTASKS": "8",
        ...                           "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242",
        ...                           "SLURM_JOB_NODELIST": "node[01-04,07]"})
        >>> env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port
        (5, 8, 1, 'node01', 29742)
    """
    environ = os.environ if environ is None else environ
    for launcher in _LAUNCHERS:
        if not _present(launcher, environ):
            continue
        rank, world_size, local_rank = _membership(launcher, environ)
        if launcher in _MPI_FAMILY:
            _check_mpi_agreement(launcher, environ)
        if launcher == "slurm":
            addr, port = _slurm_address(environ)
        else:
            addr, port = _address(launcher, environ, required=launcher == "torchrun")
        if launcher == "torchrun" and environ.get(TORCHRUN_AGENT_STORE) == "True":
            port = port + 1 if port < 65535 else port - 1  # torchrun's agent serves MASTER_PORT
        return ClusterEnvironment(rank, world_size, local_rank, addr, port, launcher)
    return None
