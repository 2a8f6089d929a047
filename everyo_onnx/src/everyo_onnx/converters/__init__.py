"""ONNX converters, grouped by family; each module exports ``CONVERTERS``: layer class ->
``converter(layer, ctx, input_name) -> output_name`` (a layer emitted whole), or op class ->
``converter(ctx, *input_names, **attrs) -> output_name`` (one op met while tracing), each
table written by registered name (see ``everyo_onnx.converters.by_name``). None imports onnx:
they build the graph only through the context they are given (see ``everyo_onnx.graph``)."""

#: Converters of the core's ops: always registered.
CORE_MODULES = (
    "everyo_onnx.converters.ops_math",
    "everyo_onnx.converters.ops_shape",
    "everyo_onnx.converters.ops_layout",
    "everyo_onnx.converters.ops_write",
)

#: Converters of everyo-layers' layers and ops. They import its public module
#: ``everyo_layers.geometry``, so they are registered only where everyo-layers is installed:
#: a model of core ops exports without it.
LAYERS_MODULES = (
    "everyo_onnx.converters.dense",
    "everyo_onnx.converters.conv",
    "everyo_onnx.converters.norm",
    "everyo_onnx.converters.norm_group",
    "everyo_onnx.converters.activation",
    "everyo_onnx.converters.activation_smooth",
    "everyo_onnx.converters.resample",
    "everyo_onnx.converters.ops_layers",
)
