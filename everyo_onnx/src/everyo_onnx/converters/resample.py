"""Global pooling as reductions; PixelShuffle as DepthToSpace (CRD); UpSampling2D and
AdaptiveAvgPool2D as the layers compute them:
two MatMuls with the same constant interpolation matrices (exact for every size, where ONNX's
Resize/AveragePool would need mode-by-mode care)."""

from __future__ import annotations

from everyo_layers.geometry import adaptive_average_matrix, bilinear_matrix, nearest_matrix
from everyo_onnx.converters.by_name import by_layer_name
from everyo_onnx.converters.conv import in_nchw
from everyo_onnx.converters.reduce import reduce_node


def convert_global_avg_pool(layer, ctx, x: str) -> str:
    return reduce_node(ctx, "ReduceMean", x, [1, 2], layer.keepdims)


def convert_global_max_pool(layer, ctx, x: str) -> str:
    return reduce_node(ctx, "ReduceMax", x, [1, 2], layer.keepdims)


def resample(ctx, x: str, rows, cols) -> str:
    """``rows @ x @ cols.T`` over H and W of NHWC ``x``."""
    by_h = ctx.node("Transpose", [x], perm=[0, 2, 3, 1])  # (N, W, C, H)
    by_h = ctx.node("MatMul", [by_h, ctx.constant(rows.T, "rows")])  # (N, W, C, Ho)
    by_w = ctx.node("Transpose", [by_h], perm=[0, 3, 2, 1])  # (N, Ho, C, W)
    by_w = ctx.node("MatMul", [by_w, ctx.constant(cols.T, "cols")])  # (N, Ho, C, Wo)
    return ctx.node("Transpose", [by_w], perm=[0, 1, 3, 2])


def convert_upsampling(layer, ctx, x: str) -> str:
    make = nearest_matrix if layer.interpolation == "nearest" else bilinear_matrix
    (h, w), (sh, sw) = ctx.shape(x)[1:3], layer.size
    return resample(ctx, x, make(h, h * sh), make(w, w * sw))


def convert_adaptive_avg_pool(layer, ctx, x: str) -> str:
    (h, w), (ho, wo) = ctx.shape(x)[1:3], layer.output_size
    return resample(ctx, x, adaptive_average_matrix(h, ho), adaptive_average_matrix(w, wo))


def convert_pixel_shuffle(layer, ctx, x: str) -> str:
    """ONNX's DepthToSpace in mode CRD is PyTorch's channel order (the layer's, on NCHW)."""
    if len(ctx.shape(x)) != 4:
        ctx.refuse(f"PixelShuffle: DepthToSpace takes 4-D input, got shape {ctx.shape(x)}")
    return in_nchw(ctx, x, "DepthToSpace", blocksize=layer.upscale_factor, mode="CRD")


CONVERTERS = by_layer_name({"GlobalAvgPool2D": convert_global_avg_pool,
                            "PixelShuffle": convert_pixel_shuffle,
                            "GlobalMaxPool2D": convert_global_max_pool,
                            "UpSampling2D": convert_upsampling,
                            "AdaptiveAvgPool2D": convert_adaptive_avg_pool})
