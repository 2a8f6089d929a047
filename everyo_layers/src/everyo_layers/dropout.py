"""``Dropout``: inverted dropout (scaled at training time, identity in eval mode)."""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, Tensor, default_generator, dispatch, is_grad_enabled
from everyo_layers.checks import argument, array_of, check_float


class DropoutOp(Op):
    """Multiply by a keep-mask scaled by ``1/(1-p)``; ``rng`` draws the mask."""

    __slots__ = ()

    def forward(self, x, p, rng):
        keep = rng.random(x.shape, dtype=np.float32) >= p
        # NOTE: fold the 1/(1-p) scale into the mask once: one multiply forward and backward.
        mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - p))
        self.saved = mask
        return x * mask

    def backward(self, g):
        return (g * self.saved,)

    def composite(self, x):
        """``x`` times the mask forward drew."""
        return x * self.saved


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False, *,
            generator=None):
    """PyTorch's ``F.dropout``: zero each element with probability ``p`` and scale the rest
    by ``1/(1-p)`` when ``training``; the input itself otherwise. ``p=1`` gives zeros.

    Args:
        input: a floating tensor.
        p: drop probability in [0, 1].
        training: apply dropout (``False``: return ``input`` unchanged, as PyTorch).
        inplace: write the result into ``input`` and return it. Allowed where the write takes
            no part in gradient recording (inside ``eo.no_grad()``, or an input that does not
            require grad), as every in-place write in EveryO; otherwise refused by name
            (PyTorch would record it; use ``x = eo.dropout(x, p)``).
        generator: the NumPy generator the mask is drawn from; by default EveryO's global one
            (``eo.manual_seed``), as ``Dropout`` without ``seed=``.

    Example:
        >>> import everyo as eo
        >>> sorted(set(eo.dropout(eo.ones(100), 0.5, generator=np.random.default_rng(0))
        ...            .data.tolist()))
        [0.0, 2.0]
        >>> eo.dropout(eo.ones(2), 0.5, training=False).data
        array([1., 1.], dtype=float32)
    """
    p = float(argument("dropout", "p", p, "probability"))
    training = argument("dropout", "training", training, "bool")
    inplace = argument("dropout", "inplace", inplace, "bool")
    check_float(f"dropout(p={p})", input)
    if inplace and not isinstance(input, Tensor):
        raise EveryOError(f"dropout(inplace=True): writes into an eo.Tensor, got a "
                          f"{type(input).__name__}")
    return _dropped(input, p, training, inplace, generator)


def _dropped(x, p: float, training: bool, inplace: bool, generator):
    """:func:`dropout` after its checks (what the layer calls, its arguments checked once)."""
    if not training or p == 0.0:
        return x
    if inplace and x.requires_grad and is_grad_enabled():
        raise EveryOError(f"dropout(inplace=True) on a tensor of shape {x.shape} that takes "
                          f"part in gradient recording: in-place writes are not recorded in "
                          f"EveryO's graph. Use the result, x = eo.dropout(x, p), or write "
                          f"inside eo.no_grad()")
    if p == 1.0:  # PyTorch's: times zero, so an inf or NaN input gives NaN as there, quietly
        with np.errstate(invalid="ignore"):  # (an op, so an array input gives a Tensor too)
            out = dispatch("mul", x, np.zeros((), dtype=array_of(x).dtype))
    else:
        rng = generator if generator is not None else default_generator()
        out = dispatch("dropout", x, p=p, rng=rng)
    return dispatch("copy_", x, out) if inplace else out


class Dropout(Module):
    """Zero each element with probability ``p`` while training and scale the rest by
    ``1/(1-p)``, so that evaluation needs no rescaling (inverted dropout).

    Args:
        p: drop probability in [0, 1] (``1`` drops everything, as PyTorch).
        inplace: PyTorch's argument, accepted; the layer returns its output as a new tensor
            and leaves its input as it is (what every use of a layer's output sees).
        seed: seed of the layer's own mask generator; two layers with the same seed drop
            the same elements on the same calls. Without it the layer draws from the global
            generator (``eo.manual_seed``), as PyTorch's dropout does.

    Example:
        >>> import everyo as eo
        >>> layer = eo.Dropout(0.5, seed=0)
        >>> sorted(set(layer(eo.ones(100)).data.tolist()))
        [0.0, 2.0]
        >>> layer.eval()(eo.ones(3)).data
        array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, p: float = 0.5, inplace: bool = False, seed=None):
        super().__init__()
        self.p = float(argument("Dropout", "p", p, "probability"))
        self.inplace = argument("Dropout", "inplace", inplace, "bool")
        self.rng = None if seed is None else np.random.default_rng(seed)

    def forward(self, x):
        check_float(f"Dropout(p={self.p})", x)
        return _dropped(x, self.p, self.training, False, self.rng)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", inplace=True" if self.inplace else "")


OPS = {"dropout": DropoutOp}
LAYERS = {"Dropout": Dropout, "dropout": dropout}
