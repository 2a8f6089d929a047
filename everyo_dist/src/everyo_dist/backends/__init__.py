"""The built-in process-group backends, one package each: ``shm`` (shared memory on one
machine), ``tcp`` (authenticated sockets between machines) and ``mpi`` (mpi4py).

Each implements the transport contract of :mod:`everyo_dist.contract` and is registered in
:mod:`everyo_dist.plugin` exactly as a third-party backend would be. Importing this package
imports none of them.
"""
