"""Entry point of everyo-layers: registers every op, layer, loss and utility it provides.

Each concept module declares what it exports in dicts, ``OPS`` (name -> Op class),
``LAYERS`` (public name -> Module subclass or function), ``KERNELS`` (kernel name ->
``everyo.kernels.Kernel``, the NumPy reference a kernel provider may replace) and
``STATE_CONVERTERS`` (layer class -> its PyTorch state-dict converter); this file only
collects them, so adding a module means adding it to ``MODULES`` below.
"""

from __future__ import annotations

import importlib

from everyo import hookimpl

MODULES = (
    "everyo_layers.conv",
    "everyo_layers.conv_grouped",
    "everyo_layers.conv1d",
    "everyo_layers.conv_transpose",
    "everyo_layers.pool",
    "everyo_layers.resample",
    "everyo_layers.interpolate",
    "everyo_layers.pixel_shuffle",
    "everyo_layers.padding_layers",
    "everyo_layers.linear",
    "everyo_layers.activation",
    "everyo_layers.activation_smooth",
    "everyo_layers.dropout",
    "everyo_layers.reshape",
    "everyo_layers.norm",
    "everyo_layers.norm_group",
    "everyo_layers.norm_instance",
    "everyo_layers.loss",
    "everyo_layers.loss_robust",
    "everyo_layers.loss_binary",
    "everyo_layers.training",
    "everyo_layers.recurrent",
    "everyo_layers.recurrent_cell",
    "everyo_layers.embedding",
    "everyo_layers.attention",
    "everyo_layers.transformer",
    "everyo_layers.transformer_stack",
    "everyo_layers.conv_kernels",
    "everyo_layers.conv_transpose_kernels",
    "everyo_layers.conv_depthwise_kernels",
    "everyo_layers.pool_kernels",
    "everyo_layers.norm_kernels",
    "everyo_layers.recurrent_kernels",
    "everyo_layers.state_conversion",
    "everyo_layers.factory_arguments",  # device=/dtype= on the layers with parameters
)


def _modules():
    return [importlib.import_module(name) for name in MODULES]


@hookimpl
def everyo_register_ops(register):
    for module in _modules():
        for name, op in getattr(module, "OPS", {}).items():
            register(name, op)


@hookimpl
def everyo_register_layers(register):
    for module in _modules():
        for name, layer in getattr(module, "LAYERS", {}).items():
            register(name, layer)


@hookimpl
def everyo_register_kernels(register):
    for module in _modules():
        for name, kernel in getattr(module, "KERNELS", {}).items():
            register(name, kernel)


@hookimpl
def everyo_register_state_converters(register):
    layers = {name: layer for module in _modules()
              for name, layer in getattr(module, "LAYERS", {}).items()}
    for module in _modules():
        for layer_class, converter in getattr(module, "STATE_CONVERTERS", {}).items():
            register(layer_class, converter)
        # converters of layers another module provides, by public name (when it is there)
        for name, converter in getattr(module, "STATE_CONVERTERS_BY_NAME", {}).items():
            if name in layers:
                register(layers[name], converter)
