"""The public API of everyo-dist, re-exported as ``everyo.distributed``.

``from everyo.distributed import spawn, average_gradients, shard_indices, available_workers,
init, detect_environment, ProcessGroup``; a backend author also uses ``Backend``,
``Collective`` and ``reduce_rows`` (see ``docs/distributed.md``, "Writing a backend").
Communication hooks for ``DistributedDataParallel.register_comm_hook`` are in
``everyo.distributed.comm_hooks``.
"""

from everyo_dist import comm_hooks
from everyo_dist.backend import Backend
from everyo_dist.contract import Collective, Transport
from everyo_dist.cores import available_workers
from everyo_dist.ddp import DistributedDataParallel
from everyo_dist.environment import ClusterEnvironment, detect_environment
from everyo_dist.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DistributedError,
    PeerLostError,
    WorkerError,
)
from everyo_dist.gradients import average_gradients
from everyo_dist.group import DEFAULT_TIMEOUT, ProcessGroup
from everyo_dist.initialize import init
from everyo_dist.reduction import reduce_rows, reduce_rows_f64
from everyo_dist.sharding import shard_indices
from everyo_dist.spawn import spawn
from everyo_dist.zero import ZeroRedundancyOptimizer

__all__ = [
    "spawn", "average_gradients", "shard_indices", "available_workers", "init", "ProcessGroup",
    "DEFAULT_TIMEOUT", "DistributedError", "CollectiveMismatchError", "CollectiveTimeoutError",
    "PeerLostError", "WorkerError", "Backend", "Collective", "Transport", "reduce_rows",
    "reduce_rows_f64", "DistributedDataParallel", "detect_environment", "ClusterEnvironment",
    "comm_hooks", "ZeroRedundancyOptimizer",
]
