"""The core's own plugin: it registers the core ops through the same hook as everyone else."""

from everyo.hookspecs import hookimpl
from everyo.ops import core_ops


@hookimpl
def everyo_register_ops(register):
    for name, op in core_ops().items():
        register(name, op)
