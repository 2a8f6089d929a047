"""One BLAS thread per worker: the environment ``spawn`` gives its workers, and the warning when
several workers still run multi-threaded BLAS pools.

NumPy's BLAS (OpenBLAS, MKL, ...) starts a thread pool per process, one thread per core. Four
workers on four cores then run sixteen BLAS threads that fight over the cores, and training gets
slower than not parallelising at all. The pool size is read from these variables when the
library loads, so they must be set before NumPy is imported in the worker — which ``spawn`` can
do (it starts the workers) and a running process cannot.
"""

from __future__ import annotations

import os
import warnings

from everyo_dist.cores import available_workers

BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                         "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS")


class BlasOversubscriptionWarning(RuntimeWarning):
    """Several workers each run a multi-threaded BLAS on the same cores."""


def worker_environment(environ=None) -> dict[str, str]:
    """The environment for a worker: ``environ`` with every BLAS thread variable the user did not
    set forced to ``"1"`` (a value the user set is kept, and :func:`warn_if_oversubscribed`
    reports it).

    Example:
        >>> env = worker_environment({"MKL_NUM_THREADS": "4"})
        >>> env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]
        ('1', '4')
    """
    env = dict(os.environ if environ is None else environ)
    for variable in BLAS_THREAD_VARIABLES:
        env.setdefault(variable, "1")
    return env


def blas_thread_pools() -> list[tuple[str, int]]:
    """``(library, threads)`` of every BLAS/OpenMP pool loaded in this process (threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # a declared dependency, but never let a diagnostic break training
        return []
    return [(info.get("internal_api", info.get("prefix", "?")), int(info["num_threads"]))
            for info in threadpool_info() if info.get("user_api") in ("blas", "openmp")]


def warn_if_oversubscribed(workers_per_machine: int, cores: int | None = None) -> bool:
    """Warn when ``workers_per_machine`` processes each run a multi-threaded BLAS pool.

    Args:
        workers_per_machine: processes training on this machine at the same time.
        cores: usable cores (default: :func:`everyo_dist.cores.available_workers`).
    Returns:
        Whether it warned.
    """
    if workers_per_machine < 2:
        return False
    threaded = [(library, threads) for library, threads in blas_thread_pools() if threads > 1]
    if not threaded:
        return False
    if cores is None:
        cores = available_workers()
    pools = ", ".join(f"{library} with {threads} threads" for library, threads in threaded)
    warnings.warn(
        f"{workers_per_machine} workers on {cores} cores each run a multi-threaded BLAS "
        f"({pools}): they will fight over the cores and train slower. Set OMP_NUM_THREADS=1 "
        f"(and OPENBLAS_NUM_THREADS/MKL_NUM_THREADS) before Python starts; spawn() does this "
        f"for its workers unless the variables are already set.",
        BlasOversubscriptionWarning,
        stacklevel=3,
    )
    return True
