"""Initialisers of the layers' parameters (PyTorch's default schemes)."""

from __future__ import annotations

import math

import numpy as np

from everyo import Parameter, default_generator


def layer_generator(seed) -> np.random.Generator:
    """The generator a layer initialises from: its own for an explicit ``seed``, else EveryO's
    global one, so that ``eo.manual_seed`` makes a model's initialisation reproducible, as
    ``torch.manual_seed`` does."""
    return default_generator() if seed is None else np.random.default_rng(seed)


def uniform_parameter(rng: np.random.Generator, shape: tuple, bound: float) -> Parameter:
    """A float32 Parameter drawn from U(-bound, bound)."""
    return Parameter(rng.uniform(-bound, bound, size=shape).astype(np.float32))


def fan_in_bound(fan_in: int) -> float:
    """PyTorch's default bound for weights and biases: ``1/sqrt(fan_in)``.

    NOTE: torch.nn.Linear/Conv2d use kaiming_uniform_(a=sqrt(5)), whose bound
    ``gain * sqrt(3/fan_in)`` with ``gain = sqrt(2/(1+5))`` simplifies to ``1/sqrt(fan_in)``.
    """
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
