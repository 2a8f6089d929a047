"""Entry point of everyo-numba: registers the Numba kernel provider.

Nothing here imports Numba: each implementation is a ``"module:function"`` path that the
kernel registry imports on the kernel's first call, so ``import everyo`` stays fast with this
plugin installed and a kernel never used is never compiled.
"""

from __future__ import annotations

from importlib import metadata

from everyo import hookimpl
from everyo.kernels import KernelProvider

#: Kernel name -> its implementation, by module.
IMPLEMENTATIONS = {
    "unscale_all_finite": "everyo_numba.scaler:unscale_all_finite",
    "float16_to_float32": "everyo_numba.convert:float16_to_float32",
    "float32_to_float16": "everyo_numba.convert:float32_to_float16",
    "sgd_step": "everyo_numba.optim:sgd_step",
    "adam_step": "everyo_numba.optim:adam_step",
    "relu_forward": "everyo_numba.activation:relu_forward",
    "max_pool2d_forward": "everyo_numba.pool:max_pool2d_forward",
    "max_pool2d_backward": "everyo_numba.pool:max_pool2d_backward",
    "conv2d_input_grad": "everyo_numba.conv:conv2d_input_grad",
    # conv (#25): the window matrix and the transposed convolution's data movements
    "conv2d_columns": "everyo_numba.conv:conv2d_columns",
    "conv2d_transpose_interleave": "everyo_numba.conv:conv2d_transpose_interleave",
    "conv2d_transpose_phase_rows": "everyo_numba.conv:conv2d_transpose_phase_rows",
    "conv_bias_grad": "everyo_numba.conv:conv_bias_grad",
    # conv3 (#25): the transposed convolution without phases (one GEMM per group of images)
    "conv2d_transpose_forward": "everyo_numba.conv_transpose:conv2d_transpose_forward",
    "conv2d_transpose_weight_grad": "everyo_numba.conv_transpose:conv2d_transpose_weight_grad",
    "conv2d_transpose_input_grad": "everyo_numba.conv_transpose:conv2d_transpose_input_grad",
    "depthwise_conv2d_forward": "everyo_numba.conv_depthwise:depthwise_conv2d_forward",
    "depthwise_conv2d_backward": "everyo_numba.conv_depthwise:depthwise_conv2d_backward",
    "layer_norm_forward": "everyo_numba.norm:layer_norm_forward",
    "layer_norm_backward": "everyo_numba.norm:layer_norm_backward",
    "batch_norm_forward": "everyo_numba.norm:batch_norm_forward",
    "batch_norm_backward": "everyo_numba.norm:batch_norm_backward",
    "group_norm_forward": "everyo_numba.norm:group_norm_forward",
    "group_norm_backward": "everyo_numba.norm:group_norm_backward",
    "lstm_forward_steps": "everyo_numba.recurrent:lstm_forward_steps",
    "lstm_backward_steps": "everyo_numba.recurrent:lstm_backward_steps",
    # overhead (#25: a small classifier's loss)
    "log_softmax": "everyo_numba.softmax:log_softmax",
    # dist: the distributed backends' float64 reduction
    "reduce_rows": "everyo_numba.reduce:reduce_rows",
    # amp: the folded weight casts' rounding, bfloat16 conversions
    "round_to_float16_values": "everyo_numba.convert:round_to_float16_values",
    "round_to_bfloat16_values": "everyo_numba.convert:round_to_bfloat16_values",
    "float32_to_bfloat16": "everyo_numba.convert:float32_to_bfloat16",
}


def _version() -> str:
    """This provider's version with Numba's (both decide the compiled code's bits)."""
    def of(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    return f"{of('everyo-numba')} (numba {of('numba')})"


@hookimpl
def everyo_register_kernels(register):
    register("numba", KernelProvider(IMPLEMENTATIONS, priority=10, version=_version,
                                     description="compiled CPU loops (Numba, cached on disk)"))
