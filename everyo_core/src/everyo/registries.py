"""The registries plugins fill: things of one kind by key, each remembering the plugin owning it.

The plugin host (``everyo.plugins``) decides *whether* a registration is accepted; a
:class:`Registry` only stores what was accepted, remembers what an override replaced (so
unregistering the overriding plugin gives it back) and answers lookups with plain dict reads.
"""

from __future__ import annotations

from typing import Any

from everyo import hookspecs
from everyo.autograd import Op
from everyo.errors import PluginError
from everyo.kernel_definitions import validate_kernel_entry

NOUN = {h.kind: h.noun for h in hookspecs.HOOKS}

# Kinds whose keys are names (every kind but the two converter kinds, keyed by class).
_NAMED = frozenset(h.kind for h in hookspecs.HOOKS) - {"onnx_converters", "state_converters"}


def key_name(key: Any) -> str:
    """A registry key as text: a class by its name, a name as itself."""
    return key.__name__ if isinstance(key, type) else str(key)


class Registry:
    """Things of one kind (ops, layers, ...) by key, each remembering the plugin that owns it.

    Example:
        >>> import everyo as eo
        >>> ops = eo.registry("ops")
        >>> "matmul" in ops, ops.owners["matmul"]
        (True, 'everyo')
    """

    def __init__(self, kind: str, items: dict | None = None):
        self.kind = kind
        self.noun = NOUN[kind]
        self.items: dict = items if items is not None else {}
        self.owners: dict = {}
        self.overridden: set = set()  # keys whose current owner replaced them on purpose
        self.shadowed: dict = {}  # key -> [(thing, owner), ...] an override replaced, oldest first
        self.version = 0  # bumped on every change, so readers can cache what they derive

    def add(self, key, thing, *, owner: str, override: bool = False) -> None:
        """Store ``thing`` under ``key`` for ``owner``; ``override`` replaces another owner's."""
        current = self.owners.get(key)
        if current is not None and current != owner:
            if not override:
                raise PluginError(f"{self.noun} {key_name(key)!r} is owned by plugin {current!r}")
            self.shadowed.setdefault(key, []).append((self.items[key], current))
        self.items[key] = thing
        self.owners[key] = owner
        if override:
            self.overridden.add(key)
        else:
            self.overridden.discard(key)
        self.version += 1

    def remove_owner(self, owner: str) -> None:
        """Forget everything ``owner`` registered, giving back what it had overridden."""
        for key in [k for k, o in self.owners.items() if o == owner]:
            shadowed = self.shadowed.get(key)
            if shadowed:
                self.items[key], self.owners[key] = shadowed.pop()
                if not shadowed:
                    del self.shadowed[key]
            else:
                del self.items[key], self.owners[key]
            self.overridden.discard(key)
        for key, stack in list(self.shadowed.items()):
            stack[:] = [(thing, o) for thing, o in stack if o != owner]
            if not stack:
                del self.shadowed[key]
        self.version += 1

    def declared(self, attribute: str) -> dict:
        """``{key: value}`` for every registered thing that declares ``attribute``.

        The declarations each kind supports are listed in ``everyo.hookspecs.DECLARATIONS``.

        Example:
            >>> import everyo as eo
            >>> eo.registry("ops").declared("precision")["matmul"]
            'lower'
        """
        found = {}
        for key, thing in list(self.items.items()):  # a snapshot: plugins may register meanwhile
            value = getattr(thing, attribute, None)
            if value is not None:
                found[key] = value
        return found

    def owned_by(self, owner: str) -> list[str]:
        return [key_name(k) for k, o in self.owners.items() if o == owner]

    def __contains__(self, key) -> bool:
        return key in self.items

    def __getitem__(self, key):
        return self.items[key]

    def get(self, key, default=None):
        return self.items.get(key, default)


def validate(kind: str, key, thing) -> None:
    """Refuse a registration whose key or thing does not fit its kind (``PluginError``)."""
    if kind in _NAMED and not (isinstance(key, str) and key.isidentifier()):
        raise PluginError(f"{kind} must be registered under an identifier, got {key!r}")
    if kind == "ops" and not (isinstance(thing, type) and issubclass(thing, Op)):
        raise PluginError(f"op {key!r} must be a subclass of everyo.Op, got {thing!r}")
    if kind in ("layers", "api", "backends") and not callable(thing):
        raise PluginError(f"{kind} entry {key!r} must be callable, got {thing!r}")
    if kind == "modules" and not (isinstance(thing, str)
                                  and all(part.isidentifier() for part in thing.split("."))):
        raise PluginError(f"module {key!r} must be registered as a dotted import path such as "
                          f"'mypackage.api', got {thing!r}")
    if kind == "autocast_policies" and not (hasattr(thing, "ops") and hasattr(thing, "dtype")):
        raise PluginError(f"autocast policy {key!r} needs .ops and .dtype attributes")
    if kind == "kernels":
        validate_kernel_entry(key, thing)
    if kind == "onnx_converters" and not (isinstance(key, type) and callable(thing)):
        raise PluginError(f"an ONNX converter is registered as (layer_class, function), "
                          f"got ({key!r}, {thing!r})")
    if kind == "state_converters" and not (isinstance(key, type) and callable(thing)):
        raise PluginError(f"a state converter is registered as (layer_class, function), "
                          f"got ({key!r}, {thing!r})")
    for attribute, allowed in hookspecs.DECLARATIONS.get(kind, {}).items():
        value = getattr(thing, attribute, None)
        if value is not None and value not in allowed:
            raise PluginError(f"{NOUN[kind]} {key_name(key)!r} declares {attribute} = {value!r}; "
                              f"the declared values are {', '.join(map(repr, allowed))}")
