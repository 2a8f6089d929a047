"""The core's own plugin: it registers the core ops and kernels through the same hooks as everyone
else."""

from everyo import optim_kernels
from everyo.hookspecs import hookimpl
from everyo.ops import activation_kernels, core_ops


@hookimpl
def everyo_register_ops(register):
    for name, op in core_ops().items():
        register(name, op)


@hookimpl
def everyo_register_kernels(register):
    for module in (activation_kernels, optim_kernels):
        for name, kernel in module.KERNELS.items():
            register(name, kernel)
