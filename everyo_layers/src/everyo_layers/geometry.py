"""The window geometry of everyo-layers, public for other plugins: how padding resolves, what
window arguments an op takes, how long a transposed convolution's output is, and the
resampling matrices of ``UpSampling2D`` and ``AdaptiveAvgPool2D``.

The ONNX exporter writes a layer's pads and matrices into its graph from these very functions,
so an exported model pads and resamples exactly as the layer does. Everything else in
everyo-layers is private to it (other plugins reach its layers and ops by their registered
names); this module is its one public module, and what it lists in ``__all__`` keeps its
signature.

Example:
    >>> from everyo_layers.geometry import resolve_padding
    >>> resolve_padding("same", (8, 8), (4, 4))
    ((1, 2), (1, 2))
"""

from everyo_layers.conv_transpose import transpose_output_size
from everyo_layers.padding import resolve_padding
from everyo_layers.resample import adaptive_average_matrix, bilinear_matrix, nearest_matrix
from everyo_layers.windows import window_arguments

__all__ = [
    "adaptive_average_matrix",
    "bilinear_matrix",
    "nearest_matrix",
    "resolve_padding",
    "transpose_output_size",
    "window_arguments",
]
