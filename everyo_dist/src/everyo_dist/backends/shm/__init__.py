"""The ``shm`` backend: the ranks of one machine exchange data through POSIX shared memory."""
