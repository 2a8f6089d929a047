"""EveryO: a deep-learning framework on NumPy.

``import everyo as eo`` gives the core (Tensor, autograd, Module, optimizers, save/load) and,
through plugins, everything installed distributions register: ``eo.Linear`` from
everyo-layers, ``eo.autocast`` from everyo-amp, ``eo.export_onnx`` from everyo-onnx, and
``everyo.distributed`` from everyo-dist.
"""

from __future__ import annotations

import importlib as _importlib
import importlib.util as _importlib_util
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _distribution_version

# NOTE: `import everyo.x as x`, not `from everyo import x`: the latter first asks the half-built
# package for the attribute, and our __getattr__ below would then build a "not installed" hint.
import everyo.core_plugin as _core_plugin
import everyo.install_hints as _install_hints
import everyo.plugins as _plugins
from everyo import allocator as _allocator
from everyo import functional as _functional
from everyo import init
from everyo.autograd import Op, unbroadcast
from everyo.containers import ModuleDict, ModuleList
from everyo.conveniences import (
    chunk,
    cumsum,
    diag,
    einsum,
    expand,
    gather,
    masked_fill,
    permute,
    split,
    swapaxes,
    tril,
    triu,
    unsqueeze,
    view,
)
from everyo.data import DataLoader, TensorDataset
from everyo.dispatch import dispatch
from everyo.engine import grad
from everyo.errors import (
    EveryOError,
    EveryOFileNotFoundError,
    EveryOIndexError,
    EveryOIsADirectoryError,
    EveryOMemoryError,
    EveryOSerializationError,
    MissingDistributionError,
    MissingDistributionModuleError,
    PluginError,
)
from everyo.functional import (
    abs,
    add,
    clip,
    concatenate,
    div,
    exp,
    log,
    log_softmax,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    mul,
    neg,
    pad,
    pow,
    relu,
    reshape,
    sigmoid,
    softmax,
    sqrt,
    stack,
    sub,
    sum,
    tanh,
    transpose,
    var,
    where,
)
from everyo.grad_mode import enable_grad, is_grad_enabled, no_grad
from everyo.gradcheck import GradcheckError, gradcheck, gradgradcheck
from everyo.hookspecs import hookimpl
from everyo.lr_scheduler import (
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    StepLR,
)
from everyo.lr_scheduler_composite import OneCycleLR, ReduceLROnPlateau, SequentialLR
from everyo.module import Module, Parameter, Sequential
from everyo.optim import SGD, Adam, AdamW, Optimizer, applied_in_backward, mark_applied_in_backward
from everyo.optim_adaptive import Adadelta, Adagrad, RMSprop
from everyo.optim_lbfgs import LBFGS
from everyo.plugins import register_plugin, registry, unregister_plugin
from everyo.porting import convert_state_dict
from everyo.random import default_generator, get_rng_state, manual_seed, set_rng_state
from everyo.serialization import load, save
from everyo.tensor import (
    Tensor,
    arange,
    argmax,
    argmin,
    full,
    full_like,
    multinomial,
    ones,
    ones_like,
    rand,
    rand_like,
    randn,
    randn_like,
    tensor,
    zeros,
    zeros_like,
)
from everyo.versioning import bump_version

_allocator.tune_malloc()  # freed large arrays stay mapped for the next step: see its docstring


def _installed_version() -> str:
    try:
        return _distribution_version("everyo-core")
    except _PackageNotFoundError:  # a source tree on sys.path without an install
        return "0+unknown"


__version__ = _installed_version()


def __getattr__(name: str):
    """``eo.<name>`` for what plugins registered (layers, API names, modules, ops) or a hint."""
    host = _plugins.host
    for kind in ("layers", "api"):
        found = host.registries[kind].get(name)
        if found is not None:
            return found
    if name in host.registries["modules"]:
        return _public_module(name)
    if name in host.registries["ops"]:
        return _op_function(name)
    error = _install_hints.missing(name)
    if error is not None:
        raise error
    raise AttributeError(f"module 'everyo' has no attribute {name!r}")


def _public_module(name: str):
    """``everyo.<name>`` where the core has that import path, else the registered module."""
    if _importlib_util.find_spec(f"everyo.{name}") is not None:
        return _importlib.import_module(f"everyo.{name}")
    return _install_hints.public_module(name)


def _op_function(name: str):
    def op_function(*operands, **attrs):
        # NOTE: a trailing optional operand given as None (``eo.conv2d(x, w, None)``) is
        # absent, as the same keyword left out.
        while operands and operands[-1] is None:
            operands = operands[:-1]
        return dispatch(name, *operands, **attrs)

    op_function.__name__ = op_function.__qualname__ = name
    op_function.__doc__ = f"Apply the registered op {name!r} (see ``everyo plugins``)."
    return op_function


def __dir__():
    host = _plugins.host
    return sorted(set(globals()) | set(host.registries["layers"].items)
                  | set(host.registries["api"].items) | set(host.registries["modules"].items))


def _load_plugins() -> None:
    host = _plugins.host
    host.register_plugin(_core_plugin, name=_plugins.CORE_PLUGIN_NAME,
                         distribution="everyo-core", version=__version__)
    if host.autoload_enabled():
        host.load_entry_points()


_load_plugins()
del _load_plugins, _installed_version, annotations
