"""The kernel registry: named hot kernels, their NumPy references, and faster providers.

A *kernel* is an array-level function an op's ``forward`` or ``backward`` spends its time in
(max pooling's window scan, a norm's statistics, an optimizer's update). Each one is
registered once, through ``everyo_register_kernels``, as a :class:`Kernel`: its name, its NumPy
reference implementation (the default, and the oracle every other implementation is tested
against) and its contract (dtypes, layouts, inputs and outputs, what it may overwrite). A
*provider* plugin registers a :class:`KernelProvider` through the same hook: faster
implementations of any subset of the kernels, under the provider's name.

Ops call kernels through :data:`kernel` (``kernel.max_pool2d_forward(x, ...)``): an attribute
read on a plain object, the current implementation cached in its ``__dict__``. The table is
emptied whenever the selection or the registry changes, and the next read rebuilds the entry.

Selection, per process:

- ``EVERYO_KERNELS=numpy`` runs every reference; ``EVERYO_KERNELS=<provider>`` picks one;
  unset (or ``auto``), the installed provider with the highest ``priority`` is used;
- ``with everyo.kernels.use("numpy"):`` switches for a block (tests, A/B benchmarks);
- an implementation that does not support a call (a dtype, a layout) returns
  ``NotImplemented`` and the reference runs instead, for that call only.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable, Iterator

from everyo.errors import EveryOError
from everyo.kernel_definitions import REFERENCE, Kernel, KernelProvider
from everyo.registries import Registry

#: The environment variable naming the provider (``numpy`` for the references).
KERNELS_ENV = "EVERYO_KERNELS"
_AUTO = ("", "auto")


class KernelRegistry(Registry):
    """The ``kernels`` registry: :class:`Kernel` definitions and :class:`KernelProvider` s by
    name (one namespace), emptying the kernel table whenever it changes."""

    def add(self, key, thing, *, owner: str, override: bool = False) -> None:
        super().add(key, thing, owner=owner, override=override)
        kernel.changed()

    def remove_owner(self, owner: str) -> None:
        super().remove_owner(owner)
        kernel.changed()

    def definitions(self) -> dict:
        """``{name: Kernel}`` of every registered kernel."""
        return {k: v for k, v in self.items.items() if isinstance(v, Kernel)}

    def providers(self) -> dict:
        """``{name: KernelProvider}`` of every registered provider."""
        return {k: v for k, v in self.items.items() if isinstance(v, KernelProvider)}


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
    registry: KernelRegistry | None
    chosen: tuple | None
    pinned: bool

    def __init__(self) -> None:
        object.__setattr__(self, "registry", None)
        object.__setattr__(self, "chosen", None)  # (name, provider or None); None: not decided
        object.__setattr__(self, "pinned", False)  # chosen by use(), kept when plugins change

    def bind(self, registry: Registry) -> None:
        """Read kernels from ``registry`` (the plugin host's ``kernels`` registry)."""
        if not isinstance(registry, KernelRegistry):
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
            chosen = _choose(self.registry, _env_choice())
            self.select(chosen)
        return chosen

    def select(self, chosen: tuple | None) -> None:
        """Use ``chosen`` (``(name, provider)`` from :func:`_choose`; None: decide again)."""
        object.__setattr__(self, "chosen", chosen)
        self.invalidate()


def _env_choice() -> str:
    return os.environ.get(KERNELS_ENV, "").strip().lower()


def _choose(registry: KernelRegistry | None, name: str) -> tuple:
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


def provider_name() -> str:
    """The name of the kernel provider in use (``"numpy"`` for the references).

    Example:
        >>> import everyo.kernels as K
        >>> with K.use("numpy"):
        ...     K.provider_name()
        'numpy'
    """
    return kernel.selected()[0]


@contextmanager
def use(name: str) -> Iterator[str]:
    """Run a block with kernel provider ``name`` (``"numpy"``: the references), then restore
    the previous selection. Process-wide, not per thread.

    Example:
        >>> import everyo.kernels as K
        >>> with K.use("numpy") as chosen:
        ...     chosen
        'numpy'
    """
    previous, was_pinned = kernel.chosen, kernel.pinned
    kernel.select(_choose(kernel.registry, str(name).strip().lower()))
    object.__setattr__(kernel, "pinned", True)
    try:
        yield kernel.selected()[0]
    finally:
        object.__setattr__(kernel, "pinned", was_pinned)
        kernel.select(previous)


def coverage() -> dict:
    """``{kernel name: the provider that runs it}`` under the current selection.

    A provider's entry still falls back to the reference, per call, for what it does not
    support (see the kernel's contract and the provider's documentation).
    """
    registry = kernel.registry
    name, provider = kernel.selected()
    names = sorted(registry.definitions()) if registry is not None else []
    return {k: name if provider is not None and k in provider.implementations else REFERENCE
            for k in names}


def fingerprint() -> str:
    """What a rank announces about its kernels: the provider's name and version.

    Ranks whose fingerprints differ may compute different bits for the same step, so a
    process group refuses to form across them.

    Example:
        >>> import everyo.kernels as K
        >>> with K.use("numpy"):
        ...     K.fingerprint()
        'numpy'
    """
    name, provider = kernel.selected()
    if provider is None:
        return REFERENCE
    return f"{name} {provider.version_text()}".strip()
