"""``Dropout``: inverted dropout (scaled at training time, identity in eval mode)."""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, default_generator, dispatch
from everyo_layers.checks import argument, check_float


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


class Dropout(Module):
    """Zero each element with probability ``p`` while training and scale the rest by
    ``1/(1-p)``, so that evaluation needs no rescaling (inverted dropout).

    Args:
        p: drop probability in [0, 1).
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

    def __init__(self, p: float = 0.5, seed=None):
        super().__init__()
        if argument("Dropout", "p", p, "probability") == 1.0:
            raise EveryOError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)
        self.rng = None if seed is None else np.random.default_rng(seed)

    def forward(self, x):
        check_float(f"Dropout(p={self.p})", x)
        if not self.training or self.p == 0.0:
            return x
        rng = self.rng if self.rng is not None else default_generator()
        return dispatch("dropout", x, p=self.p, rng=rng)

    def extra_repr(self) -> str:
        return f"p={self.p}"


OPS = {"dropout": DropoutOp}
LAYERS = {"Dropout": Dropout}
