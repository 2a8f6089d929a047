"""The ``everyo`` command: ``everyo plugins`` lists loaded plugins and what each registered."""

from __future__ import annotations

import argparse
import sys

from everyo.errors import EveryOError
from everyo.hookspecs import HOOKS

PLURAL = {h.kind: h.plural for h in HOOKS}


def _plugins(out) -> int:
    import everyo  # noqa: F401  (loads the plugins)
    from everyo.plugins import DISABLE_AUTOLOAD_ENV, DISABLE_PLUGINS_ENV, PluginHost, host

    if not PluginHost.autoload_enabled():
        print(f"(plugin autoloading is disabled by {DISABLE_AUTOLOAD_ENV})", file=out)
    for info in host.plugins:
        version = f" {info.version}" if info.version else ""
        print(f"{info.name}  [{info.distribution}{version}]", file=out)
        if not info.registered:
            print("    (registers nothing yet)", file=out)
        for kind in PLURAL:
            if kind in info.registered:
                print(f"    {PLURAL[kind]}: {', '.join(info.registered[kind])}", file=out)
    for skipped in host.disabled:
        print(f"{skipped.name}  [{skipped.distribution}]  disabled by {DISABLE_PLUGINS_ENV}",
              file=out)
    for failure in host.failures:
        print(f"{failure.name}  [{failure.distribution}]  FAILED TO LOAD: {failure.error}",
              file=out)
    _kernels(out)
    return 1 if host.failures else 0


def _kernels(out) -> None:
    """The kernel provider in use and which kernels it runs (the rest run the references)."""
    from everyo import kernels  # (like _plugins: importing everyo loads the plugins)

    try:
        chosen = kernels.fingerprint()
        covered = kernels.coverage()
    except EveryOError as error:  # EVERYO_KERNELS names no installed provider
        print(f"kernel provider: {error}", file=out)
        return
    name = kernels.provider_name()
    mine = [k for k, provider in covered.items() if provider == name != kernels.REFERENCE]
    print(f"kernel provider: {chosen} (select with {kernels.KERNELS_ENV}=numpy|<provider>)",
          file=out)
    if name != kernels.REFERENCE:
        print(f"    runs {len(mine)} of {len(covered)} kernels: {', '.join(mine)}", file=out)
        rest = [k for k in covered if k not in mine]
        if rest:
            print(f"    references: {', '.join(rest)}", file=out)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("everyo-core")
    except PackageNotFoundError:  # pragma: no cover - a source tree without an install
        return "0+unknown"


def main(argv=None) -> int:
    """Run the ``everyo`` command (also ``python -m everyo``); returns the exit status."""
    parser = argparse.ArgumentParser(prog="everyo", description="EveryO command-line tools")
    parser.add_argument("--version", action="version", version=f"everyo {_version()}")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("plugins", help="list loaded plugins and what each registered")
    args = parser.parse_args(argv)
    if args.command == "plugins":
        return _plugins(sys.stdout)
    # NOTE: no command is a request for help (as git and pip do), not an error.
    parser.print_help(sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
