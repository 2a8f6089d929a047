"""ONNX converters, grouped by family; each module exports ``CONVERTERS``: layer class ->
``converter(layer, ctx, input_name) -> output_name`` (a layer emitted whole), or op class ->
``converter(ctx, *input_names, **attrs) -> output_name`` (one op met while tracing). None
imports onnx: they build the graph only through the context they are given (see
``everyo_onnx.graph``)."""

MODULES = (
    "everyo_onnx.converters.dense",
    "everyo_onnx.converters.conv",
    "everyo_onnx.converters.norm",
    "everyo_onnx.converters.activation",
    "everyo_onnx.converters.conv_breadth",
    "everyo_onnx.converters.resample",
    "everyo_onnx.converters.norm_group",
    "everyo_onnx.converters.activation_smooth",
    "everyo_onnx.converters.ops_math",
    "everyo_onnx.converters.ops_shape",
    "everyo_onnx.converters.ops_layout",
    "everyo_onnx.converters.ops_layers",
)
