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

from contextlib import contextmanager
from typing import Iterator

from everyo.kernel_definitions import REFERENCE, Kernel, KernelProvider
from everyo.kernel_table import KERNELS_ENV, choose_provider, kernel
from everyo.registries import Registry

__all__ = ["KERNELS_ENV", "KernelRegistry", "coverage", "fingerprint", "kernel", "provider_name",
           "use"]

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
    kernel.select(choose_provider(kernel.registry, str(name).strip().lower()))
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
