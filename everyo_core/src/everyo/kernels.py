"""NumPy kernels for writing ops: the array-level building blocks the core's own ops use.

An op's ``forward`` and ``backward`` work on NumPy arrays; these functions are the pieces worth
sharing between ops, with the dtype care that is easy to get wrong: float16/bfloat16 products
through float32 BLAS, exact gradient selection, overflow-free sigmoid and log-softmax, the
16-bit conversions, "is this dtype floating?" (NumPy reports bfloat16 as ``kind == "V"``), and
where a large gradient is cut into row blocks (``row_block_stops``, see docs/autograd.md), and
the one rule for an axis argument (``check_axis``).

It is also the kernel registry's public face (docs/architecture.md, "Kernels"): ``Kernel`` and
``KernelProvider`` are what ``everyo_register_kernels`` takes; ops call the selected
implementation as ``kernel.<name>(...)``; ``use(name)`` switches providers for a block,
``provider_name()``, ``coverage()`` and ``fingerprint()`` tell what runs.
The Tensor-level twins an op's ``backward_graph`` needs (``unbroadcast_tensor``,
``broadcast_tensor``, ``expand_reduced``, ``swap_last``) are here too, with ``as_tensors`` (operands
converted to Tensors exactly as dispatch converts them) and ``parse_einsum_equation``. They are public and
stable: a plugin imports them from here, never from ``everyo.ops.*``, ``everyo.dtypes`` or
``everyo.half_precision`` (the core's private layout, which may move).

Example:
    >>> import numpy as np
    >>> from everyo.kernels import blas_matmul, is_floating, stable_sigmoid
    >>> blas_matmul(np.ones((2, 3), np.float16), np.ones((3, 1), np.float16)).dtype
    dtype('float16')
    >>> stable_sigmoid(np.array([-1000.0, 0.0, 1000.0])).tolist()
    [0.0, 0.5, 1.0]
    >>> is_floating(np.dtype("bfloat16")), is_floating(np.dtype("int8"))
    (True, False)
"""

from __future__ import annotations

from everyo.autograd import _as_tensors as as_tensors
from everyo.autograd import gradients_from_parts
from everyo.axes import check_axis
from everyo.dtypes import HALF_DTYPES, is_floating, resolve_dtype
from everyo.grad_rows import row_block_stops
from everyo.half_precision import narrow, widen
from everyo.kernel_definitions import REFERENCE, Kernel, KernelProvider
from everyo.kernel_registry import KERNELS_ENV, coverage, fingerprint, kernel, provider_name, use
from everyo.ops.activation_kernels import keep_where
from everyo.ops.einsum import parse_equation as parse_einsum_equation
from everyo.ops.graph_math import broadcast_tensor, expand_reduced, swap_last, unbroadcast_tensor
from everyo.ops.linalg import blas_matmul
from everyo.ops.reduction import log_softmax_array
from everyo.ops.unary import stable_sigmoid
from everyo.versioning import check_operand_unchanged

__all__ = ["HALF_DTYPES", "KERNELS_ENV", "Kernel", "KernelProvider", "REFERENCE", "as_tensors",
           "blas_matmul", "broadcast_tensor", "check_axis", "check_operand_unchanged", "coverage",
           "expand_reduced", "fingerprint", "gradients_from_parts", "is_floating", "keep_where",
           "kernel", "log_softmax_array", "narrow", "parse_einsum_equation", "provider_name",
           "resolve_dtype", "row_block_stops", "stable_sigmoid", "swap_last",
           "unbroadcast_tensor", "use", "widen"]
