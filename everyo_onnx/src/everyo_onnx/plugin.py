"""Entry point of the everyo-onnx plugin: its hookimpls register what it provides.

It registers the converters of the core's ops, those of everyo-layers' layers and ops where
everyo-layers is installed (``everyo_register_onnx_converters``), and ``export_onnx``,
``run_onnx`` and ``onnx_available`` as ``eo.<name>``. Nothing here imports ``onnx`` or
``onnxruntime``: they load when a model is first exported or run.
"""

from __future__ import annotations

import importlib
import importlib.util

from everyo import hookimpl
from everyo_onnx.converters import CORE_MODULES, LAYERS_MODULES
from everyo_onnx.export import export_onnx
from everyo_onnx.runtime import onnx_available, run_onnx


def converter_modules() -> tuple:
    """The converter modules to register: the core ops' always, everyo-layers' where it is
    installed (its plugin loads before this one, so its names are registered by now)."""
    if importlib.util.find_spec("everyo_layers") is None:
        return CORE_MODULES
    return CORE_MODULES + LAYERS_MODULES


@hookimpl
def everyo_register_onnx_converters(register):
    for name in converter_modules():
        for cls, converter in importlib.import_module(name).CONVERTERS.items():
            register(cls, converter)


@hookimpl
def everyo_register_api(register):
    register("export_onnx", export_onnx)
    register("run_onnx", run_onnx)
    register("onnx_available", onnx_available)
