"""Names that first-party distributions provide, so a missing one explains how to get it."""

from __future__ import annotations

import importlib
import importlib.util

from everyo.errors import MissingDistributionError, MissingDistributionModuleError
from everyo.plugins import DISABLE_AUTOLOAD_ENV, PluginHost

PROVIDERS: dict[str, tuple[str, ...]] = {
    "everyo-layers": (
        "Linear", "Conv2D", "MaxPool2D", "AvgPool2D", "Flatten", "Dropout", "BatchNorm1D",
        "BatchNorm2D", "LayerNorm", "ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "GELU",
        "LeakyReLU", "RNN", "LSTM", "GRU", "Embedding", "MultiHeadAttention", "PositionalEncoding",
        "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "MSELoss",
        "L1Loss", "CrossEntropyLoss", "NLLLoss", "BCEWithLogitsLoss", "cross_entropy", "mse_loss",
        "l1_loss", "nll_loss", "binary_cross_entropy_with_logits", "clip_grad_norm_", "StepLR",
        "CosineAnnealingLR", "conv2d", "max_pool2d", "avg_pool2d",
    ),
    "everyo-amp": ("autocast", "GradScaler"),
    "everyo-onnx": ("export_onnx", "run_onnx", "onnx_available"),
    "everyo-dist": ("distributed", "distributed_tcp"),
}
DISTRIBUTION_OF = {name: dist for dist, names in PROVIDERS.items() for name in names}


def missing(name: str, dist: str, error=MissingDistributionError):
    """The error for ``eo.<name>`` when ``dist`` is not installed or its plugin did not load."""
    module = dist.replace("-", "_")
    if importlib.util.find_spec(module) is None:
        return error(
            f"everyo.{name} is provided by the {dist} distribution, which is not installed: "
            f"pip install {dist}"
        )
    if not PluginHost.autoload_enabled():
        why = (f"plugin autoloading is disabled ({DISABLE_AUTOLOAD_ENV} is set); register it "
               f"with everyo.register_plugin({module}.plugin)")
    else:
        from everyo.plugins import host

        failed = any(f.distribution == dist for f in host.failures)
        why = ("its plugin failed to load (see `everyo plugins`)" if failed
               else f"this version of {dist} registers no {name!r}")
    return error(f"everyo.{name} is provided by {dist}, which is installed "
                                    f"but not loaded: {why}")


def require(module: str, dist: str, name: str):
    """Import ``module`` or raise the install hint for ``everyo.<name>``."""
    if importlib.util.find_spec(module) is None:
        raise missing(name, dist, MissingDistributionModuleError)
    return importlib.import_module(module)

