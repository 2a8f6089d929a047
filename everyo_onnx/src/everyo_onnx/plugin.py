"""Entry point of the everyo-onnx plugin: its hookimpls register what it provides.

It registers one converter per supported layer class (``everyo_register_onnx_converters``)
and ``export_onnx``, ``run_onnx`` and ``onnx_available`` as ``eo.<name>``. Nothing here imports
``onnx`` or ``onnxruntime``: they load when a model is first exported or run.
"""

from __future__ import annotations

import importlib

from everyo import hookimpl
from everyo_onnx.converters import MODULES


@hookimpl
def everyo_register_onnx_converters(register):
    for name in MODULES:
        for layer_class, converter in importlib.import_module(name).CONVERTERS.items():
            register(layer_class, converter)


@hookimpl
def everyo_register_api(register):
    from everyo_onnx.export import export_onnx
    from everyo_onnx.runtime import onnx_available, run_onnx

    register("export_onnx", export_onnx)
    register("run_onnx", run_onnx)
    register("onnx_available", onnx_available)
