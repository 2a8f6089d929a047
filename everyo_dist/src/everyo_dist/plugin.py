"""Entry point of the everyo-dist plugin: registers its process-group backends.

Each backend is named here as ``"module:factory"`` and imported only when a group of that backend
is created, so loading the plugin (which ``import everyo`` does) never imports sockets, shared
memory or mpi4py. Adding a backend is one line in ``BACKENDS``.
"""

from __future__ import annotations

import importlib

from everyo import hookimpl

BACKENDS: dict[str, str] = {
    "shm": "everyo_dist.shm:create_shm_group",
    "tcp": "everyo_dist.tcp.group:create_tcp_group",
    "mpi": "everyo_dist.mpi_backend:create_mpi_group",
}


def lazy_factory(name: str, target: str):
    """A factory that imports ``target`` ("module:function") on first call and forwards to it."""
    module_name, _, attribute = target.partition(":")

    def factory(**options):
        return getattr(importlib.import_module(module_name), attribute)(**options)

    factory.__name__ = f"create_{name}_group"
    factory.__qualname__ = factory.__name__
    factory.__doc__ = f"Create a {name!r} process group (imports {target} on first use)."
    factory.target = target
    return factory


@hookimpl
def everyo_register_backends(register):
    for name, target in BACKENDS.items():
        register(name, lazy_factory(name, target))


@hookimpl
def everyo_register_modules(register):
    register("distributed", "everyo_dist.api")
    register("distributed_tcp", "everyo_dist.tcp")
