"""``Backend``: everything ``init`` and ``spawn`` need to know about a process-group backend,
registered in one piece through the ``everyo_register_backends`` hook.

A backend is a factory that creates this process's group, plus an optional ``prepare_job`` step
that ``spawn`` runs in the parent before starting the workers (shm creates the segment they
join, tcp hosts a loopback rendezvous). Either may be given as ``"module:function"``, imported
on first use, so registering a backend imports nothing heavy. A plain factory function may be
registered too: it is a backend without a preparation step.
"""

from __future__ import annotations

import importlib
import inspect
from contextlib import contextmanager

# NOTE: nothing here imports everyo (or everyo_dist.errors, which does) at module level: the
# plugin module imports this one while ``import everyo`` is still loading plugins.


def _resolve(target):
    """``target`` itself, or the function a ``"module:function"`` string names."""
    if not isinstance(target, str):
        return target
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


@contextmanager
def _no_preparation(world_size: int, options: dict):
    yield options


@contextmanager
def _no_rendezvous(host: str, port: int, world_size: int, token: str | None, ssl_context):
    yield port


class Backend:
    """A registered process-group backend.

    Args:
        name: the name ``init(backend=...)`` and ``spawn(backend=...)`` use.
        factory: ``factory(**options) -> ProcessGroup`` (or ``"module:function"``); ``init``
            fills the parameters it declares from ``EVERYO_*`` variables, ``spawn`` calls it in
            every worker with ``rank``, ``world_size``, ``timeout`` and the prepared options.
        prepare_job: optional ``prepare_job(world_size, options)`` context manager (or
            ``"module:function"``) run by ``spawn`` in the parent around the whole job; it
            yields the options every worker's factory receives and cleans up on exit.
        host_rendezvous: optional ``host_rendezvous(host, port, world_size, token,
            ssl_context)`` context manager (or ``"module:function"``) that ``everyo-run`` on
            node 0 enters around the job, for a backend whose ranks meet at a server the
            launcher hosts (tcp); it yields the port it listens on.

    Example:
        >>> from everyo_dist.backend import Backend
        >>> backend = Backend("solo", "everyo_dist.backends.shm.group:create_shm_group")
        >>> sorted(backend.parameters()[0])
        ['rank', 'segment', 'timeout', 'world_size']
    """

    def __init__(self, name: str, factory, prepare_job=None, host_rendezvous=None):
        if not isinstance(name, str) or not name:
            from everyo_dist.errors import DistributedError

            raise DistributedError(f"a backend needs a non-empty name, got {name!r}")
        self.name = name
        self._factory, self._prepare_job = factory, prepare_job
        self._host_rendezvous = host_rendezvous
        self.__doc__ = f"Create a {name!r} process group."

    def __call__(self, **options):
        """Create this process's group (what ``init`` does after reading the environment)."""
        return self.factory(**options)

    def __repr__(self) -> str:
        return f"<Backend {self.name!r}>"

    @property
    def factory(self):
        """The factory function (imported now if it was registered by name)."""
        self._factory = _resolve(self._factory)
        return self._factory

    def parameters(self) -> tuple[set[str], bool]:
        """The keyword parameters the factory declares, and whether it takes ``**options``."""
        parameters = inspect.signature(self.factory).parameters.values()
        names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        return names, any(p.kind == p.VAR_KEYWORD for p in parameters)

    def prepare_job(self, world_size: int, options: dict):
        """The context manager ``spawn`` enters before starting ``world_size`` workers."""
        if self._prepare_job is None:
            return _no_preparation(world_size, options)
        return _resolve(self._prepare_job)(world_size, options)

    def host_rendezvous(self, host: str, port: int, world_size: int, token: str | None,
                        ssl_context):
        """The context manager ``everyo-run`` enters on node 0; yields the port ranks dial."""
        if self._host_rendezvous is None:
            return _no_rendezvous(host, port, world_size, token, ssl_context)
        return _resolve(self._host_rendezvous)(host, port, world_size, token, ssl_context)


def as_backend(name: str, registered) -> Backend:
    """The :class:`Backend` behind a registry entry (a plain factory becomes one)."""
    return registered if isinstance(registered, Backend) else Backend(name, registered)


def registered_backend(name: str | None, caller: str) -> Backend:
    """The backend registered as ``name``; a clear error naming the registered ones otherwise."""
    import everyo as eo
    from everyo_dist.errors import DistributedError

    backends = eo.registry("backends").items
    listed = ", ".join(sorted(backends)) or "none"
    if not name:
        raise DistributedError(f"{caller} needs a backend: pass backend=... or set "
                               f"EVERYO_BACKEND (registered: {listed})")
    if name not in backends:
        raise DistributedError(f"{caller}: unknown process-group backend {name!r}; "
                               f"registered: {listed}")
    return as_backend(name, backends[name])
