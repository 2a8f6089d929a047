"""``ModuleList`` and ``ModuleDict``: sub-modules held in a list or a dict, registered so that
their parameters are trained, saved and moved with the model (a plain list is not)."""

from __future__ import annotations

from typing import Iterable, Iterator

from everyo.errors import EveryOError, EveryOIndexError
from everyo.module import Module


def _checked(module, where: str) -> Module:
    if not isinstance(module, Module):
        raise EveryOError(f"{where} takes Modules, got a {type(module).__name__}")
    return module


class ModuleList(Module):
    """A list of modules whose parameters belong to the model (names ``"0"``, ``"1"``, ...).

    Example:
        >>> import everyo as eo
        >>> class Stack(eo.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.blocks = eo.ModuleList([eo.Linear(4, 4) for _ in range(3)])
        ...     def forward(self, x):
        ...         for block in self.blocks:
        ...             x = block(x)
        ...         return x
        >>> len(list(Stack().parameters()))
        6
    """

    def __init__(self, modules: Iterable[Module] = ()):
        super().__init__()
        self.extend(modules)

    def _items(self) -> list:
        return [self.__dict__[name] for name in self._module_names]

    def _reset(self, modules: list) -> None:
        for name in list(self._module_names):
            delattr(self, name)
        self._module_names.clear()
        for i, module in enumerate(modules):
            setattr(self, str(i), module)

    def append(self, module: Module) -> "ModuleList":
        """Add ``module`` at the end."""
        setattr(self, str(len(self)), _checked(module, "ModuleList.append"))
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        """Add every module of ``modules`` at the end."""
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index``."""
        items = self._items()
        items.insert(index, _checked(module, "ModuleList.insert"))
        self._reset(items)

    def __getitem__(self, index):
        items = self._items()
        if isinstance(index, slice):
            return ModuleList(items[index])
        try:
            return items[index]
        except IndexError:
            raise EveryOIndexError(f"ModuleList index {index} out of range for {len(items)} "
                                   f"modules") from None

    def __setitem__(self, index: int, module: Module) -> None:
        items = self._items()
        items[index] = _checked(module, "ModuleList")
        self._reset(items)

    def __delitem__(self, index) -> None:
        items = self._items()
        del items[index]
        self._reset(items)

    def __len__(self) -> int:
        return len(self._module_names)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items())

    def __iadd__(self, modules: Iterable[Module]) -> "ModuleList":
        return self.extend(modules)

    def forward(self, *args, **kwargs):
        raise EveryOError("ModuleList has no forward(): iterate over it and call its modules")


class ModuleDict(Module):
    """A dict of modules (string keys, insertion order) whose parameters belong to the model.

    Example:
        >>> import everyo as eo
        >>> heads = eo.ModuleDict({"cls": eo.Linear(8, 3), "box": eo.Linear(8, 4)})
        >>> list(heads.keys()), [name for name, _ in heads.named_parameters()][:2]
        (['cls', 'box'], ['cls.weight', 'cls.bias'])
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(key, str) or not key or "." in key:
            raise EveryOError(f"ModuleDict keys are non-empty strings without '.', got {key!r}")
        if key in self.__dict__ and key not in self._module_names:
            raise EveryOError(f"ModuleDict key {key!r} would hide the attribute of that name")
        setattr(self, key, _checked(module, f"ModuleDict[{key!r}]"))

    def __getitem__(self, key: str) -> Module:
        if key not in self._module_names:
            raise KeyError(key)
        return self.__dict__[key]

    def __delitem__(self, key: str) -> None:
        if key not in self._module_names:
            raise KeyError(key)
        self._module_names.remove(key)
        object.__delattr__(self, key)

    def __contains__(self, key) -> bool:
        return key in self._module_names

    def __len__(self) -> int:
        return len(self._module_names)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._module_names))

    def keys(self) -> list:
        return list(self._module_names)

    def values(self) -> list:
        return [self.__dict__[k] for k in self._module_names]

    def items(self) -> list:
        return [(k, self.__dict__[k]) for k in self._module_names]

    def update(self, modules) -> None:
        """Add (or replace) entries from a dict or an iterable of ``(key, module)`` pairs."""
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, module in pairs:
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def forward(self, *args, **kwargs):
        raise EveryOError("ModuleDict has no forward(): look its modules up by key")
