"""Entry point of the everyo-dist plugin: registers its process-group backends.

Each backend is registered as a :class:`~everyo_dist.backend.Backend` whose factory and job
preparation are named as ``"module:function"`` and imported only when used, so loading the
plugin (which ``import everyo`` does) never imports sockets, shared memory or mpi4py. A
third-party backend registers itself the same way.
"""

from __future__ import annotations

from everyo import hookimpl
from everyo_dist.backend import Backend
from everyo_dist.reduction_kernels import KERNELS

BACKENDS = (
    Backend("shm", "everyo_dist.backends.shm.group:create_shm_group",
            prepare_job="everyo_dist.backends.shm.job:prepare_shm_job"),
    Backend("tcp", "everyo_dist.backends.tcp.group:create_tcp_group",
            prepare_job="everyo_dist.backends.tcp.job:prepare_tcp_job",
            host_rendezvous="everyo_dist.backends.tcp.job:host_launch_rendezvous"),
    Backend("tcp_hierarchical",
            "everyo_dist.backends.hierarchical.group:create_hierarchical_group",
            prepare_job="everyo_dist.backends.tcp.job:prepare_tcp_job",
            host_rendezvous="everyo_dist.backends.tcp.job:host_launch_rendezvous"),
    Backend("mpi", "everyo_dist.backends.mpi.group:create_mpi_group"),
)


@hookimpl
def everyo_register_backends(register):
    for backend in BACKENDS:
        register(backend.name, backend)


@hookimpl
def everyo_register_kernels(register):
    for name, kernel in KERNELS.items():
        register(name, kernel)


@hookimpl
def everyo_register_modules(register):
    register("distributed", "everyo_dist.api")
    register("distributed_tcp", "everyo_dist.tcp")
