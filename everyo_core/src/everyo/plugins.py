"""The plugin host: finds plugins, calls their registration hooks, keeps the registries.

Plugins are loaded once, when ``everyo`` is imported, in this order (as pytest loads its own
plugins before anyone else's):

1. the core's own plugin;
2. the first-party plugins, in the order of ``everyo.first_party.FIRST_PARTY``;
3. every other entry point of the ``everyo`` group, by entry-point name.

A plugin is refused as a whole when it registers a name another plugin owns (unless it passes
``override=True``), implements a hook that does not exist (a misspelling such as
``everyo_register_layer``), or breaks the one-meaning-per-public-name rule (see
``PluginHost._check_public_names``). An installed plugin that is refused or fails to import is
reported with a warning naming its distribution (and the distribution it collided with) and
``import everyo`` carries on without it, so earlier plugins always keep what they own.

``EVERYO_DISABLE_PLUGIN_AUTOLOAD`` (1/true/yes/on) loads no entry point at all;
``EVERYO_DISABLE_PLUGINS=name1,name2`` skips the named ones (like pytest's ``-p no:name``).
After loading, dispatch never calls a hook: it reads the registries, which are plain dicts.
"""

from __future__ import annotations

import difflib
import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from importlib import metadata

import pluggy

from everyo import hookspecs
from everyo.dispatch import OPS
from everyo.errors import PluginError
from everyo.first_party import FIRST_PARTY
from everyo.kernel_registry import KernelRegistry, kernel
from everyo.registries import Registry, key_name, validate

ENTRY_POINT_GROUP = "everyo"
#: The name the core registers its own plugin under (its ops, Tensor API, modules).
CORE_PLUGIN_NAME = "everyo"
DISABLE_AUTOLOAD_ENV = "EVERYO_DISABLE_PLUGIN_AUTOLOAD"
DISABLE_PLUGINS_ENV = "EVERYO_DISABLE_PLUGINS"
_TRUTHY = ("1", "true", "yes", "on")

#: Kinds whose names become ``eo.<name>`` (ops do too, but only where no such name exists).
PUBLIC_KINDS = ("layers", "api", "modules")


@dataclass
class PluginInfo:
    """One loaded plugin: its name, where it came from and what it registered."""

    name: str
    distribution: str
    version: str
    registered: dict = field(default_factory=dict)


@dataclass
class PluginFailure:
    """An installed plugin that was not loaded (it raised, or the host refused it), and why."""

    name: str
    distribution: str
    error: str


class PluginHost:
    """Owns the pluggy manager and one :class:`~everyo.registries.Registry` per hook kind."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.manager.add_hookspecs(hookspecs)
        self.registries = {h.kind: Registry(h.kind) for h in hookspecs.HOOKS}
        self.registries["ops"] = Registry("ops", OPS)
        self.registries["kernels"] = KernelRegistry("kernels")
        self.plugins: list[PluginInfo] = []
        self.failures: list[PluginFailure] = []
        self.disabled: list[PluginFailure] = []  # skipped through EVERYO_DISABLE_PLUGINS

    # -- registration -------------------------------------------------------------------------
    def register_plugin(self, plugin, name: str | None = None, distribution: str = "(local)",
                        version: str = "") -> PluginInfo:
        """Register ``plugin`` (a module or object with hookimpls) and run its hooks now.

        Raises ``PluginError`` when the plugin implements an unknown hook, registers something
        invalid, or claims a name another plugin owns; in that case nothing it registered is
        kept.
        """
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if self.manager.has_plugin(name):
            owner = self.info(name)
            where = f" (distribution {owner.distribution})" if owner else ""
            raise PluginError(f"a plugin named {name!r} is already registered{where}")
        registered_as = self.manager.get_name(plugin)
        if registered_as is not None:
            raise PluginError(f"plugin {name!r} is already registered, as {registered_as!r}")
        self.manager.register(plugin, name=name)
        try:
            self._check_hooks(plugin, name)
            staged = self._stage(plugin)
            self._commit(staged, name, distribution)
        except BaseException:
            self.manager.unregister(name=name)
            raise
        info = PluginInfo(name, distribution, version,
                          {kind: [key_name(k) for k, _, _ in items]
                           for kind, items in staged.items() if items})
        self.plugins.append(info)
        return info

    def unregister_plugin(self, name: str) -> None:
        """Remove plugin ``name`` and everything it registered (what it overrode comes back).

        The core's own plugin is refused: removing it would take every core op with it.
        """
        if name == CORE_PLUGIN_NAME:
            raise PluginError(f"the core plugin {name!r} cannot be unregistered: it owns "
                              f"every core op; unregister the plugin that overrode an op instead")
        if not self.manager.has_plugin(name):
            raise PluginError(f"no plugin named {name!r} is registered")
        self.manager.unregister(name=name)
        for registry in self.registries.values():
            registry.remove_owner(name)
        self.plugins = [info for info in self.plugins if info.name != name]

    def info(self, name: str) -> PluginInfo | None:
        """The loaded plugin called ``name``, or None."""
        return next((info for info in self.plugins if info.name == name), None)

    def _check_hooks(self, plugin, name: str) -> None:
        """Refuse hooks that do not exist: a misspelled hook would otherwise never be called."""
        try:
            self.manager.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r}: {exc}{_did_you_mean(str(exc))}") from None
        for attribute in dir(plugin):
            if attribute.startswith("everyo_register") and callable(getattr(plugin, attribute)):
                if attribute not in hookspecs.HOOK_KINDS.values():
                    raise PluginError(f"plugin {name!r} defines {attribute!r}, which is not an "
                                      f"EveryO hook{_did_you_mean(attribute)}")
                if not self._implements(plugin, attribute):
                    raise PluginError(f"plugin {name!r} defines {attribute!r} without "
                                      f"@everyo.hookimpl, so it would never be called")

    def _implements(self, plugin, hook: str) -> bool:
        implementations = getattr(self.manager.hook, hook).get_hookimpls()
        return any(impl.plugin is plugin for impl in implementations)

    def _stage(self, plugin) -> dict:
        """Call ``plugin``'s registration hooks, collecting (key, thing, override) per kind."""
        staged: dict = {}
        for kind, hook_name in hookspecs.HOOK_KINDS.items():
            items = staged.setdefault(kind, [])

            def register(key, thing, *, override: bool = False, _kind=kind, _items=items):
                validate(_kind, key, thing)
                _items.append((key, thing, override))

            for impl in getattr(self.manager.hook, hook_name).get_hookimpls():
                if impl.plugin is plugin:
                    impl.function(**{arg: register for arg in impl.argnames})
        return staged

    def _commit(self, staged: dict, owner: str, distribution: str) -> None:
        """Check every staged registration, then store them all (or none)."""
        yielded: set = set()  # (kind, key) this plugin leaves to an earlier explicit override
        for kind, items in staged.items():
            keys = [key for key, _, _ in items]
            duplicates = {key_name(k) for k in keys if keys.count(k) > 1}
            if duplicates:
                raise PluginError(f"plugin {owner!r} registers {kind} {sorted(duplicates)} twice")
            registry = self.registries[kind]
            for key, _, override in items:
                current = registry.owners.get(key)
                if current is None or current == owner or override:
                    continue
                if key in registry.overridden:
                    # NOTE: an explicit override wins whichever plugin loads first, so
                    # entry-point order never decides which implementation is used.
                    yielded.add((kind, key))
                    continue
                raise PluginError(
                    f"{registry.noun} {key_name(key)!r} is registered twice: by plugin "
                    f"{current!r} and again by plugin {owner!r} (distributions "
                    f"{self._distribution_of(current)} and {distribution}); pass "
                    f"override=True to replace it on purpose")
        self._check_public_names(staged, owner)
        for kind, items in staged.items():
            for key, thing, override in items:
                if kind == "ops":  # also when kept underneath: it may come back
                    thing.name = key
                if (kind, key) in yielded:
                    # kept underneath the override, so it comes back if the overrider leaves
                    self.registries[kind].shadowed.setdefault(key, []).insert(0, (thing, owner))
                    continue
                self.registries[kind].add(key, thing, owner=owner, override=override)

    def _check_public_names(self, staged: dict, owner: str) -> None:
        """One meaning per ``eo.<name>``.

        A layer, API or module name must not be a name the core itself defines, nor be
        registered under another of those kinds. An op may share its name with a layer, API or
        module name only when both come from the same plugin (the function is then the op's
        functional form: ``eo.cross_entropy`` is the function, ``eo.dispatch("cross_entropy")``
        the op). Replacing an existing entry with ``override=True`` keeps the names that exist.
        """
        core = sys.modules.get("everyo")
        core_names = {n for n in vars(core) if not n.startswith("_")} if core else set()

        def new_names(kind):
            registry = self.registries[kind]
            return {key for key, _, _ in staged[kind] if key not in registry}

        def owner_elsewhere(name, kinds):
            for other in kinds:
                current = self.registries[other].owners.get(name)
                if current is not None:
                    return other, current
                if any(key == name for key, _, _ in staged[other]):
                    return other, owner
            return None

        for kind in PUBLIC_KINDS:
            noun = self.registries[kind].noun
            for name in sorted(new_names(kind)):
                if kind == "modules" and _is_core_path(core, name):
                    pass  # the core's import path for this module: everyo/<name>.py
                elif name in core_names:
                    raise PluginError(f"plugin {owner!r} registers {noun} {name!r}, a name the "
                                      f"core already defines (everyo.{name}); pick another name")
                clash = owner_elsewhere(name, [k for k in PUBLIC_KINDS if k != kind])
                if clash is None:
                    op = self.registries["ops"].owners.get(name)
                    clash = ("ops", op) if op not in (None, owner) else None
                if clash is not None:
                    raise PluginError(self._clash_message(kind, name, owner, *clash))
        for name in sorted(new_names("ops")):
            clash = owner_elsewhere(name, PUBLIC_KINDS)
            if clash is not None and clash[1] != owner:
                raise PluginError(self._clash_message("ops", name, owner, *clash))

    def _clash_message(self, kind: str, name: str, owner: str, other_kind: str,
                       other_owner: str) -> str:
        return (f"plugin {owner!r} registers {self.registries[kind].noun} {name!r}, but "
                f"{name!r} is already the {self.registries[other_kind].noun} of plugin "
                f"{other_owner!r}; a name means one thing (see docs/plugins.md, \"Duplicates "
                f"and overrides\")")

    def _distribution_of(self, plugin_name: str) -> str:
        info = self.info(plugin_name)
        return info.distribution if info else "(unknown)"

    # -- entry points -------------------------------------------------------------------------
    def load_entry_points(self) -> None:
        """Load the ``everyo`` entry points: first-party ones first, then the rest by name."""
        disabled = disabled_plugin_names()
        entry_points = ordered_entry_points(metadata.entry_points(group=ENTRY_POINT_GROUP))
        unknown = disabled - {ep.name for ep in entry_points}
        if unknown:  # a misspelt (or distribution) name would otherwise disable nothing
            warnings.warn(f"{DISABLE_PLUGINS_ENV} names no installed plugin: "
                          f"{', '.join(sorted(unknown))}; the entry-point names are "
                          f"{', '.join(ep.name for ep in entry_points)}", RuntimeWarning,
                          stacklevel=2)
        for ep in entry_points:
            dist = ep.dist.name if ep.dist is not None else "(unknown)"
            version = ep.dist.version if ep.dist is not None else ""
            if ep.name in disabled:
                self.disabled.append(PluginFailure(ep.name, dist, f"{DISABLE_PLUGINS_ENV}"))
                continue
            if self.manager.has_plugin(ep.name) and self._distribution_of(ep.name) == dist:
                continue  # the same plugin found twice on sys.path
            try:
                self.register_plugin(ep.load(), name=ep.name, distribution=dist, version=version)
            except Exception as exc:  # a broken plugin must not break `import everyo`
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                detail += _half_imported_hint(ep.module)
                self.failures.append(PluginFailure(ep.name, dist, detail))
                warnings.warn(f"EveryO plugin {ep.name!r} from distribution {dist!r} was not "
                              f"loaded: {detail}", RuntimeWarning, stacklevel=2)

    @staticmethod
    def autoload_enabled() -> bool:
        return os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in _TRUTHY


def disabled_plugin_names() -> set[str]:
    """Plugin (entry-point) names listed in ``EVERYO_DISABLE_PLUGINS``, comma-separated."""
    return {name.strip() for name in os.environ.get(DISABLE_PLUGINS_ENV, "").split(",")
            if name.strip()}


def ordered_entry_points(entry_points) -> list:
    """First-party entry points in ``FIRST_PARTY`` order, then every other one by name."""
    rank = {dist: i for i, dist in enumerate(FIRST_PARTY)}

    def order(ep):
        dist = ep.dist.name if ep.dist is not None else ""
        return (0, rank[dist], ep.name) if dist in rank else (1, 0, ep.name)

    return sorted(entry_points, key=order)


def registrations(plugin) -> dict:
    """What ``plugin`` would register, by kind, without registering it (``{kind: [keys]}``).

    Example:
        >>> import everyo_amp.plugin
        >>> registrations(everyo_amp.plugin)["api"]
        ['autocast', 'GradScaler']
    """
    scratch = PluginHost()
    scratch.manager.register(plugin, name="scratch")
    return {kind: [key_name(key) for key, _, _ in items]
            for kind, items in scratch._stage(plugin).items() if items}


def _half_imported_hint(plugin_module: str) -> str:
    """Why a plugin failed when the cause is its own package being half-imported: one of its
    modules imported first (``import pkg.layer``) runs ``import everyo``, which loads every
    plugin, this one included, while that module is still executing."""
    package = plugin_module.partition(".")[0]
    half = sorted(name for name, module in list(sys.modules.items())
                  if name.startswith(package + ".")
                  # NOTE: importlib marks a module's spec while its code runs (CPython)
                  and getattr(getattr(module, "__spec__", None), "_initializing", False))
    if not half:
        return ""
    return (f" ({', '.join(half)} was still being imported when `import everyo` loaded the "
            f"plugins: make `import everyo` the first statement of {package}/__init__.py, as "
            f"docs/plugins.md says)")


def _is_core_path(core, name: str) -> bool:
    # NOTE: vars(), not getattr(): everyo's module __getattr__ would resolve the name itself.
    return getattr(vars(core).get(name), "__name__", None) == f"everyo.{name}"


def _did_you_mean(text: str) -> str:
    words = [w.strip("'\",.:()") for w in text.split()]
    candidates = [w for w in words if w.startswith("everyo_")]
    for word in candidates:
        close = difflib.get_close_matches(word, hookspecs.HOOK_KINDS.values(), n=1)
        if close and close[0] != word:
            return f" (did you mean {close[0]!r}?)"
    return ""


host = PluginHost()
kernel.bind(host.registries["kernels"])


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
        >>> eo.unregister_plugin("mine-doc")
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
    """The registry of one kind: one of the ``kind`` values of ``everyo.hookspecs.HOOKS``
    (``"ops"``, ``"layers"``, ``"api"``, ``"modules"``, ``"onnx_converters"``,
    ``"state_converters"``, ``"backends"``, ``"autocast_policies"``)."""
    try:
        return host.registries[kind]
    except KeyError:
        raise PluginError(f"unknown registry {kind!r}; kinds are {sorted(host.registries)}") from None
