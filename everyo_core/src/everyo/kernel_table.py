"""The kernel table ops call through: ``kernel.<name>(...)``, the implementation the current
selection picks (see :mod:`everyo.kernel_registry` for the registry, the selection rules and
``use()``).

Apart from the registry so that the lowest layers of the core (the 16-bit conversions, which
``autograd`` and the registries themselves import) can call kernels without an import circle:
this module imports nothing but the kernel definitions.
"""

from __future__ import annotations

import os
from typing import Callable, Protocol

from everyo.errors import EveryOError
from everyo.kernel_definitions import REFERENCE


class KernelSource(Protocol):
    """What the table reads: the ``kernels`` registry (:class:`~everyo.kernel_registry.
    KernelRegistry`)."""

    def definitions(self) -> dict: ...

    def providers(self) -> dict: ...


#: The environment variable naming the provider (``numpy`` for the references).
KERNELS_ENV = "EVERYO_KERNELS"
_AUTO = ("", "auto")


def _with_fallback(impl: Callable, reference: Callable) -> Callable:
    def call(*args, **kwargs):
        out = impl(*args, **kwargs)
        if out is NotImplemented:
            return reference(*args, **kwargs)
        return out

    call.__wrapped__ = impl  # type: ignore[attr-defined]
    return call


class KernelTable:
    """The current implementation of every kernel, as attributes: ``kernel.<name>(...)``.

    A missing attribute is looked up (registry, selection) once and cached in the instance's
    ``__dict__``, so later reads are plain attribute reads; ``invalidate`` empties the cache.
    The selection is process-wide, like ``torch.backends`` flags.
    """

    __slots__ = ("registry", "chosen", "pinned", "__dict__")
    registry: KernelSource | None
    chosen: tuple | None
    pinned: bool

    def __init__(self) -> None:
        object.__setattr__(self, "registry", None)
        object.__setattr__(self, "chosen", None)  # (name, provider or None); None: not decided
        object.__setattr__(self, "pinned", False)  # chosen by use(), kept when plugins change

    def bind(self, registry: object) -> None:
        """Read kernels from ``registry`` (the plugin host's ``kernels`` registry)."""
        if not (callable(getattr(registry, "definitions", None))
                and callable(getattr(registry, "providers", None))):
            raise EveryOError(f"the kernel table reads a KernelRegistry, got {registry!r}")
        object.__setattr__(self, "registry", registry)
        self.invalidate()

    def invalidate(self) -> None:
        """Forget every cached entry (the registry or the selection changed)."""
        self.__dict__.clear()

    def changed(self) -> None:
        """The registry changed: rebuild every entry, and decide the default again (a provider
        may have arrived or left) unless a ``use()`` block chose one."""
        if not self.pinned:
            object.__setattr__(self, "chosen", None)
        self.invalidate()

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_"):
            raise AttributeError(name)
        registry = self.registry
        definition = registry.definitions().get(name) if registry is not None else None
        if definition is None:
            raise EveryOError(f"unknown kernel {name!r}: no installed plugin registers it "
                              f"(see `everyo plugins`)")
        provider = self.selected()[1]
        entry = definition.reference
        if provider is not None and name in provider.implementations:
            entry = _with_fallback(provider.resolve(name), definition.reference)
        self.__dict__[name] = entry
        return entry

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("kernels are selected with everyo.kernels.use(), not assigned")

    def selected(self) -> tuple:
        """``(name, KernelProvider or None)`` of the provider in use (None: the references)."""
        chosen = self.chosen
        if chosen is None:
            chosen = choose_provider(self.registry, _env_choice())
            self.select(chosen)
        return chosen

    def select(self, chosen: tuple | None) -> None:
        """Use ``chosen`` (``(name, provider)`` from :func:`choose_provider`; None: decide again)."""
        object.__setattr__(self, "chosen", chosen)
        self.invalidate()


def _env_choice() -> str:
    return os.environ.get(KERNELS_ENV, "").strip().lower()


def choose_provider(registry: KernelSource | None, name: str) -> tuple:
    """``(name, KernelProvider or None)`` for selection ``name`` (``""``/``auto``: the installed
    provider of highest priority; ``numpy``: the references), or an error naming the installed
    ones."""
    providers = registry.providers() if registry is not None else {}
    if name in _AUTO:
        if not providers:
            return REFERENCE, None
        best = max(providers.items(), key=lambda item: (item[1].priority, item[0]))
        return best if best[1].priority > 0 else (REFERENCE, None)
    if name == REFERENCE:
        return REFERENCE, None
    if name not in providers:
        installed = ", ".join([REFERENCE] + sorted(providers))
        raise EveryOError(f"kernel provider {name!r} (from {KERNELS_ENV} or kernels.use) is not "
                          f"installed; the installed providers are: {installed}")
    return name, providers[name]


#: The kernel table ops call through.
kernel = KernelTable()
