"""The core's own plugin: it registers the core ops and kernels through the same hooks as everyone
else."""

from everyo.half_precision import KERNELS as CONVERSION_KERNELS
from everyo.hookspecs import hookimpl
from everyo.ops import core_ops
from everyo.ops.activation_kernels import KERNELS as ACTIVATION_KERNELS
from everyo.ops.softmax_kernels import KERNELS as SOFTMAX_KERNELS

# NOTE: not `from everyo import optim_kernels`: while the package is still being built, that
# first asks everyo's module __getattr__, which computes install hints (importing every
# first-party plugin).
from everyo.optim_kernels import KERNELS as OPTIM_KERNELS


@hookimpl
def everyo_register_ops(register):
    for name, op in core_ops().items():
        register(name, op)


@hookimpl
def everyo_register_kernels(register):
    for table in (ACTIVATION_KERNELS, OPTIM_KERNELS, CONVERSION_KERNELS, SOFTMAX_KERNELS):
        for name, kernel in table.items():
            register(name, kernel)
