"""Entry point of the everyo-amp plugin: its hookimpls register what it provides."""

from everyo import hookimpl
from everyo_amp.autocast_mode import autocast
from everyo_amp.grad_scaler import GradScaler
from everyo_amp.policy import BFLOAT16_POLICY, DEFAULT_POLICY
from everyo_amp.scaler_kernels import KERNELS as SCALER_KERNELS


@hookimpl
def everyo_register_autocast_policies(register):
    register("default", DEFAULT_POLICY)
    register("bfloat16", BFLOAT16_POLICY)


@hookimpl
def everyo_register_api(register):
    register("autocast", autocast)
    register("GradScaler", GradScaler)


@hookimpl
def everyo_register_kernels(register):
    for name, kernel in SCALER_KERNELS.items():
        register(name, kernel)
