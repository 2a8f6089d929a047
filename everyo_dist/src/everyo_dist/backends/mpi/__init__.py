"""The ``mpi`` backend: collectives over mpi4py's ``COMM_WORLD``, run under ``mpiexec``."""
