"""everyo-onnx: ONNX export of EveryO models by tracing their forward pass, verified with ONNX
Runtime and onnx.reference.

Importing this package is cheap: ``onnx`` and ``onnxruntime`` are imported only when a model
is exported or run. The public functions are reached as ``eo.export_onnx``, ``eo.run_onnx`` and
``eo.onnx_available`` (see ``docs/onnx.md``).
"""

# NOTE: importing everyo first loads every plugin, this one included, before any submodule of
# this package starts executing; otherwise `import everyo_onnx.converters.x` in a fresh
# interpreter would reach the plugin loader while x is still half-initialised.
import everyo
