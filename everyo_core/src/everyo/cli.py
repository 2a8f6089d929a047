"""The ``everyo`` command: ``everyo plugins`` lists loaded plugins and what each registered.

Like a Unix tool, it stops quietly when its reader goes away (``everyo plugins | head -2``):
no traceback, exit status 141 (128 + SIGPIPE, what a shell reports for a tool that SIGPIPE
stopped).
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from everyo.errors import EveryOError
from everyo.hookspecs import HOOKS
from everyo.kernel_definitions import REFERENCE
from everyo.kernel_registry import KERNELS_ENV, coverage, fingerprint, provider_name
from everyo.plugins import DISABLE_AUTOLOAD_ENV, DISABLE_PLUGINS_ENV, PluginHost, host

PLURAL = {h.kind: h.plural for h in HOOKS}
#: The exit status after the reader closed the pipe: 128 + SIGPIPE (13), as a shell shows it.
BROKEN_PIPE_STATUS = 141


def _plugins(out) -> int:
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
    try:
        chosen = fingerprint()
        covered = coverage()
    except EveryOError as error:  # EVERYO_KERNELS names no installed provider
        print(f"kernel provider: {error}", file=out)
        return
    name = provider_name()
    mine = [k for k, provider in covered.items() if provider == name != REFERENCE]
    print(f"kernel provider: {chosen} (select with {KERNELS_ENV}=numpy|<provider>)",
          file=out)
    if name != REFERENCE:
        print(f"    runs {len(mine)} of {len(covered)} kernels: {', '.join(mine)}", file=out)
        rest = [k for k in covered if k not in mine]
        if rest:
            print(f"    references: {', '.join(rest)}", file=out)


def _version() -> str:
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
    try:
        if args.command == "plugins":
            status = _plugins(sys.stdout)
        else:  # NOTE: no command is a request for help (as git and pip do), not an error.
            parser.print_help(sys.stdout)
            status = 0
        sys.stdout.flush()  # (a broken pipe shows here, not in the interpreter's exit)
    except BrokenPipeError:
        _discard_stdout()
        return BROKEN_PIPE_STATUS
    return status


def _discard_stdout() -> None:
    """Point stdout at the null device: what is still buffered for the reader that left must
    not raise again when the interpreter flushes stdout at exit (Python's documented recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
