"""The plugin host: finds plugins, calls their registration hooks, keeps the registries.

Plugins are loaded once, when ``everyo`` is imported: the core's own plugin first, then every
entry point in the ``everyo`` group (unless ``EVERYO_DISABLE_PLUGIN_AUTOLOAD=1``). After that,
dispatch never calls a hook: it reads the registries, which are plain dicts.
"""

from __future__ import annotations

import os
import traceback
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from everyo import hookspecs
from everyo.dispatch import OPS
from everyo.errors import PluginError

ENTRY_POINT_GROUP = "everyo"
DISABLE_AUTOLOAD_ENV = "EVERYO_DISABLE_PLUGIN_AUTOLOAD"


_SINGULAR = {"ops": "op", "layers": "layer", "api": "name", "autocast_policies": "autocast policy",
             "onnx_converters": "ONNX converter for", "backends": "backend"}


def _key_name(key: Any) -> str:
    return key.__name__ if isinstance(key, type) else str(key)


class Registry:
    """Things of one kind (ops, layers, ...) by name, each remembering the plugin that owns it."""

    def __init__(self, kind: str, items: dict | None = None):
        self.kind = kind
        self.items: dict = items if items is not None else {}
        self.owners: dict = {}
        self.overridden: set = set()  # keys whose current owner replaced them on purpose
        self.version = 0  # bumped on every change, so readers can cache what they derive
        self.shadowed: dict = {}  # key -> [(thing, owner), ...] replaced by an override

    def add(self, key, thing, *, owner: str, override: bool = False) -> None:
        if key in self.items and not override:
            raise PluginError(
                f"{self.kind} {_key_name(key)!r} is registered twice: by plugin "
                f"{self.owners[key]!r} and again by plugin {owner!r} (pass override=True to "
                f"replace it on purpose)"
            )
        if key in self.items and self.owners[key] != owner:
            self.shadowed.setdefault(key, []).append((self.items[key], self.owners[key]))
        self.items[key] = thing
        self.owners[key] = owner
        self.version += 1
        if override:
            self.overridden.add(key)

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
        """``{name: value}`` for every registered thing that declares ``attribute``.

        The declarations a kind supports are listed in ``everyo.hookspecs.DECLARATIONS``.

        Example:
            >>> import everyo as eo
            >>> eo.registry("ops").declared("precision")["matmul"]
            'lower'
        """
        found = {}
        for key, thing in self.items.items():
            value = getattr(thing, attribute, None)
            if value is not None:
                found[key] = value
        return found

    def owned_by(self, owner: str) -> list[str]:
        return [_key_name(k) for k, o in self.owners.items() if o == owner]

    def __contains__(self, key) -> bool:
        return key in self.items

    def __getitem__(self, key):
        return self.items[key]

    def get(self, key, default=None):
        return self.items.get(key, default)


def _validate(kind: str, key, thing) -> None:
    from everyo.autograd import Op

    if kind in ("ops", "layers", "api", "backends", "autocast_policies"):
        if not isinstance(key, str) or not key.isidentifier():
            raise PluginError(f"{kind} must be registered under an identifier, got {key!r}")
    if kind == "ops" and not (isinstance(thing, type) and issubclass(thing, Op)):
        raise PluginError(f"op {key!r} must be a subclass of everyo.Op, got {thing!r}")
    if kind in ("layers", "api", "backends") and not callable(thing):
        raise PluginError(f"{kind} entry {key!r} must be callable, got {thing!r}")
    if kind == "autocast_policies" and not (hasattr(thing, "ops") and hasattr(thing, "dtype")):
        raise PluginError(f"autocast policy {key!r} needs .ops and .dtype attributes")
    if kind == "onnx_converters" and not (isinstance(key, type) and callable(thing)):
        raise PluginError(f"an ONNX converter is registered as (layer_class, function), "
                          f"got ({key!r}, {thing!r})")
    for attribute, allowed in hookspecs.DECLARATIONS.get(kind, {}).items():
        value = getattr(thing, attribute, None)
        if value is not None and value not in allowed:
            raise PluginError(f"{_SINGULAR[kind]} {key!r} declares {attribute} = {value!r}; "
                              f"the declared values are {', '.join(map(repr, allowed))}")


@dataclass
class PluginInfo:
    """One loaded plugin: its name, where it came from and what it registered."""

    name: str
    distribution: str
    version: str
    registered: dict = field(default_factory=dict)


@dataclass
class PluginFailure:
    """A plugin that could not be loaded, and why."""

    name: str
    distribution: str
    error: str


class PluginHost:
    """Owns the pluggy manager and one :class:`Registry` per hook kind."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.manager.add_hookspecs(hookspecs)
        self.registries = {kind: Registry(_SINGULAR[kind]) for kind in hookspecs.HOOK_KINDS}
        self.registries["ops"] = Registry("op", OPS)
        self.plugins: list[PluginInfo] = []
        self.failures: list[PluginFailure] = []

    # -- registration -------------------------------------------------------------------------
    def register_plugin(self, plugin, name: str | None = None, distribution: str = "(local)",
                        version: str = "") -> PluginInfo:
        """Register ``plugin`` (a module or object with hookimpls) and run its hooks now.

        Raises ``PluginError`` if it registers a name another plugin owns; in that case nothing
        it registered is kept.
        """
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if self.manager.has_plugin(name):
            raise PluginError(f"a plugin named {name!r} is already registered")
        self.manager.register(plugin, name=name)
        try:
            staged = self._collect(plugin, name)
            self._commit(staged, name)
        except BaseException:
            self.manager.unregister(name=name)
            raise
        info = PluginInfo(name, distribution, version,
                          {kind: [_key_name(k) for k, _, _ in items] for kind, items in staged.items()
                           if items})
        self.plugins.append(info)
        return info

    def unregister_plugin(self, name: str) -> None:
        """Remove plugin ``name`` and everything it registered (what it overrode comes back)."""
        if not self.manager.has_plugin(name):
            raise PluginError(f"no plugin named {name!r} is registered")
        self.manager.unregister(name=name)
        for registry in self.registries.values():
            registry.remove_owner(name)
        self.plugins = [info for info in self.plugins if info.name != name]

    def _collect(self, plugin, name: str) -> dict:
        """Call ``plugin``'s registration hooks, staging what it registers."""
        staged: dict = {}
        for kind, hook_name in hookspecs.HOOK_KINDS.items():
            items = staged.setdefault(kind, [])

            def register(key, thing, *, override: bool = False, _kind=kind, _items=items):
                _validate(_kind, key, thing)
                _items.append((key, thing, override))

            for impl in getattr(self.manager.hook, hook_name).get_hookimpls():
                if impl.plugin is plugin:
                    impl.function(**{arg: register for arg in impl.argnames})
        return staged

    def _commit(self, staged: dict, owner: str) -> None:
        yielded: set = set()  # (kind, key) this plugin leaves to an earlier explicit override
        for kind, items in staged.items():
            registry = self.registries[kind]
            for key, thing, override in items:
                if key in registry.items and not override and registry.owners[key] != owner:
                    if key in registry.overridden:
                        # NOTE: an explicit override wins whichever plugin loads first, so
                        # entry-point order never decides which implementation is used.
                        yielded.add((kind, key))
                        continue
                    registry.add(key, thing, owner=owner)  # raises, naming both plugins
            keys = [key for key, _, _ in items]
            duplicates = {_key_name(k) for k in keys if keys.count(k) > 1}
            if duplicates:
                raise PluginError(f"plugin {owner!r} registers {kind} {sorted(duplicates)} twice")
        for kind, items in staged.items():
            for key, thing, override in items:
                if (kind, key) in yielded:
                    continue
                if kind == "ops":
                    thing.name = key
                self.registries[kind].add(key, thing, owner=owner, override=True)
                if not override:
                    self.registries[kind].overridden.discard(key)

    def load_entry_points(self) -> None:
        """Load every plugin of the ``everyo`` entry-point group, reporting broken ones."""
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist is not None else "(unknown)"
            version = ep.dist.version if ep.dist is not None else ""
            if self.manager.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
                self.register_plugin(plugin, name=ep.name, distribution=dist, version=version)
            except Exception as exc:  # a broken plugin must not break `import everyo`
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                self.failures.append(PluginFailure(ep.name, dist, detail))
                warnings.warn(
                    f"EveryO plugin {ep.name!r} from distribution {dist!r} failed to load: "
                    f"{detail}",
                    RuntimeWarning,
                    stacklevel=2,
                )

    @staticmethod
    def autoload_enabled() -> bool:
        return os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in ("1", "true", "yes")


host = PluginHost()


def register_plugin(plugin, name: str | None = None) -> PluginInfo:
    """Register a plugin explicitly (for tests, notebooks, or with autoload disabled).

    Example:
        >>> import everyo as eo
        >>> class Mine:
        ...     @eo.hookimpl
        ...     def everyo_register_layers(self, register):
        ...         register("Identity2", lambda: (lambda x: x))
        >>> eo.register_plugin(Mine(), name="mine-doc").registered
        {'layers': ['Identity2']}
        >>> eo.Identity2()(3)
        3
    """
    return host.register_plugin(plugin, name=name)


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered under ``name`` and everything it registered.

    What the plugin replaced with ``override=True`` is given back to its previous owner. Tests
    use this to leave the process as they found it.

    Example:
        >>> import everyo as eo
        >>> class Mine:
        ...     @eo.hookimpl
        ...     def everyo_register_api(self, register):
        ...         register("answer_doc", lambda: 42)
        >>> _ = eo.register_plugin(Mine(), name="mine-unregister-doc")
        >>> eo.answer_doc()
        42
        >>> eo.unregister_plugin("mine-unregister-doc")
        >>> hasattr(eo, "answer_doc")
        False
    """
    host.unregister_plugin(name)


def registry(kind: str) -> Registry:
    """The registry of one kind: ``"ops"``, ``"layers"``, ``"api"``, ``"autocast_policies"``,
    ``"onnx_converters"`` or ``"backends"``."""
    try:
        return host.registries[kind]
    except KeyError:
        raise PluginError(f"unknown registry {kind!r}; kinds are {sorted(host.registries)}") from None
