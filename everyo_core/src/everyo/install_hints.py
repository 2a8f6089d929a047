"""Install hints: which first-party distribution to install or load for a missing name.

When ``eo.<name>`` is missing and a first-party distribution (``everyo.first_party``) is
installed but not loaded (autoload off, disabled, failed), the host asks that distribution's
plugin module what it *would* register (``everyo.plugins.registrations``) and names it
precisely. A distribution that is not installed cannot be asked; the rule then is to name
every first-party distribution that is not installed, with the command that installs it.
The module registry's lookups (``everyo.distributed`` and the like) raise these hints too.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

from everyo.errors import MissingDistributionError, MissingDistributionModuleError
from everyo.first_party import FIRST_PARTY
from everyo.plugins import DISABLE_AUTOLOAD_ENV, DISABLE_PLUGINS_ENV, PluginHost, host, registrations

_PUBLIC_KINDS = ("layers", "api", "modules", "ops")


def _package(plugin_module: str) -> str:
    return plugin_module.partition(".")[0]


@functools.lru_cache(maxsize=None)
def _public_names(plugin_module: str) -> frozenset:
    """Every public name ``plugin_module`` would register (asked once per process)."""
    try:
        found = registrations(importlib.import_module(plugin_module))
    except Exception:  # a broken plugin cannot tell; the caller falls back to the rule
        return frozenset()
    return frozenset(name for kind in _PUBLIC_KINDS for name in found.get(kind, ()))


def _provides(plugin_module: str, name: str) -> bool:
    return name in _public_names(plugin_module)


def _why_not_loaded(dist: str, plugin_module: str) -> str:
    if not PluginHost.autoload_enabled():
        return (f"plugin autoloading is disabled ({DISABLE_AUTOLOAD_ENV} is set); register it "
                f"with everyo.register_plugin({plugin_module})")
    if any(d.distribution == dist for d in host.disabled):
        return f"its plugin is disabled by {DISABLE_PLUGINS_ENV}"
    if any(f.distribution == dist for f in host.failures):
        return "its plugin failed to load (see `everyo plugins`)"
    return "its plugin is not registered"


def missing(name: str, error=MissingDistributionError):
    """The error for ``eo.<name>``/``everyo.<name>`` that no loaded plugin provides, or None.

    Args:
        name: the public name asked for.
        error: the exception class to build (``MissingDistributionModuleError`` for imports).

    Returns:
        An ``error`` naming the first-party distribution to install or load, or None when every
        first-party distribution is loaded (the name simply does not exist).

    Example:
        >>> import everyo as eo
        >>> missing("no_such_name") is None  # everything first-party is installed and loaded
        True
    """
    loaded = {info.distribution for info in host.plugins}
    not_installed = []
    for dist, party in FIRST_PARTY.items():
        if dist in loaded:
            continue
        if importlib.util.find_spec(_package(party.plugin)) is None:
            not_installed.append(dist)
        elif _provides(party.plugin, name):
            return error(f"everyo.{name} is provided by {dist}, which is installed but not "
                         f"loaded: {_why_not_loaded(dist, party.plugin)}")
    if not not_installed:
        return None
    if len(not_installed) == 1:
        dist = not_installed[0]
        return error(f"everyo.{name} is not provided by any installed plugin; it may come from "
                     f"{dist}, which is not installed: {FIRST_PARTY[dist].install}")
    listed = ", ".join(f"{dist} ({FIRST_PARTY[dist].install})" for dist in not_installed)
    return error(f"everyo.{name} is not provided by any installed plugin; it may come from one "
                 f"of the first-party distributions that are not installed: {listed}")


def public_module(name: str):
    """The module a plugin registered under ``name`` (``everyo_register_modules``), imported.

    Raises ``MissingDistributionModuleError`` (an ``ImportError``) with an install hint when no
    loaded plugin registered it.

    Example:
        >>> hasattr(public_module("distributed"), "spawn")
        True
    """
    target = host.registries["modules"].get(name)
    if target is None:
        raise (missing(name, MissingDistributionModuleError)
               or MissingDistributionModuleError(f"no plugin registers the module {name!r}"))
    return importlib.import_module(target)


def fill_from_public_module(name: str, namespace: dict) -> list[str]:
    """Copy the public names of the module registered as ``name`` into ``namespace``.

    It is what the core's import paths (``everyo/distributed.py``) do with their globals, so
    ``from everyo.distributed import spawn`` works whichever plugin provides the module.

    Returns:
        The names copied (the provider's ``__all__``), for the caller's ``__all__``.

    Example:
        >>> namespace = {}
        >>> "spawn" in fill_from_public_module("distributed", namespace), "spawn" in namespace
        (True, True)
    """
    provider = public_module(name)
    names = list(provider.__all__)
    namespace.update({attribute: getattr(provider, attribute) for attribute in names})
    return names

