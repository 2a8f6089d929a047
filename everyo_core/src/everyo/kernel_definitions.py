"""What a plugin registers through ``everyo_register_kernels``: a :class:`Kernel` (a named
kernel's NumPy reference and contract) or a :class:`KernelProvider` (faster implementations of
some kernels). The registry and the selection are in :mod:`everyo.kernel_registry`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from everyo.errors import EveryOError, PluginError

#: The name of the references taken as a provider: always available, never registered.
REFERENCE = "numpy"


@dataclass(frozen=True)
class Kernel:
    """One named kernel: the NumPy reference and the contract every implementation keeps.

    Args:
        reference: the NumPy implementation (today's code; the default and the oracle).
        contract: what an implementation must do: accepted dtypes and layouts, what it returns,
            which arguments it may overwrite, its accumulation rules.

    Example:
        >>> import numpy as np
        >>> k = Kernel(np.negative, "x (any dtype) -> -x, a new array")
        >>> k.reference(np.float32([1.0]))
        array([-1.], dtype=float32)
    """

    reference: Callable
    contract: str

    def __post_init__(self) -> None:
        if not callable(self.reference):
            raise EveryOError(f"a Kernel's reference must be callable, got {self.reference!r}")
        if not isinstance(self.contract, str) or not self.contract.strip():
            raise EveryOError("a Kernel needs a contract: the dtypes, layouts, inputs and outputs "
                              "an implementation must handle, and what it may overwrite")


@dataclass(frozen=True)
class KernelProvider:
    """Faster implementations of registered kernels, selected together under one name.

    Args:
        implementations: kernel name -> a callable with the reference's signature, or a
            ``"module:attribute"`` path imported on the kernel's first call (so registering a
            provider imports nothing heavy). An implementation returns ``NotImplemented`` for a
            call it does not support; the reference then runs.
        priority: the default selection is the installed provider with the highest priority
            (the references count as 0).
        version: recorded in ``everyo.kernels.fingerprint()``, so ranks that would compute
            different bits can tell; a string, or a function returning one (called once, when
            first needed: a metadata lookup need not slow ``import everyo``).
        description: one line for ``everyo plugins``.

    Example:
        >>> p = KernelProvider({"relu_forward": "mypkg.fast:relu"}, priority=5, version="1.0")
        >>> sorted(p.implementations)
        ['relu_forward']
    """

    implementations: Mapping[str, Callable | str]
    priority: int = 1
    version: str | Callable[[], str] = ""
    description: str = ""
    _resolved: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _version_text: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, impl in self.implementations.items():
            if not (callable(impl) or (isinstance(impl, str) and impl.count(":") == 1)):
                raise EveryOError(f"kernel provider implementation {name!r} must be callable or "
                                  f"a 'module:attribute' path, got {impl!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise EveryOError(f"a kernel provider's priority is an int, got {self.priority!r}")

    def version_text(self) -> str:
        """The version as text (a version function is called once)."""
        if not self._version_text:
            self._version_text.append(str(self.version() if callable(self.version)
                                          else self.version))
        return self._version_text[0]

    def resolve(self, name: str) -> Callable:
        """The implementation of kernel ``name`` (imported on first use when given as a path)."""
        impl = self._resolved.get(name)
        if impl is None:
            impl = self.implementations[name]
            if isinstance(impl, str):
                module, _, attribute = impl.partition(":")
                impl = getattr(importlib.import_module(module), attribute)
            self._resolved[name] = impl
        return impl


def validate_kernel_entry(key: str, thing: Any) -> None:
    """Refuse a ``kernels`` registration that is neither a Kernel nor a KernelProvider."""
    if not isinstance(thing, (Kernel, KernelProvider)):
        raise PluginError(f"kernels entry {key!r} must be an everyo.kernels.Kernel (a definition) "
                          f"or an everyo.kernels.KernelProvider, got {thing!r}")
    if key == REFERENCE:
        raise PluginError(f"{REFERENCE!r} names the reference kernels and cannot be registered")
