"""``InstanceNorm1D`` (``(N, L, C)``) and ``InstanceNorm2D`` (NHWC): PyTorch's instance
normalisation, channels last.

Each sample's channels are normalised separately over the sample's positions — which is
group normalisation with one group per channel, so the layer runs the ``group_norm`` op with
``groups=C`` (its float64-accumulated statistics and second derivatives come with it). With
``track_running_stats`` the running statistics follow PyTorch: each training batch moves them
by ``momentum`` towards the batch average of the per-sample means and *unbiased* variances
(``momentum=None`` leaves them unchanged, as PyTorch's ``InstanceNorm`` passes 0 then), and
evaluation normalises by them through the ``batch_norm`` op; without it evaluation uses each
sample's own statistics, as training does.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, dispatch
from everyo_layers.norm import _BatchNorm
from everyo_layers.norm_stats import moments


class _InstanceNorm(_BatchNorm):
    """Shared by InstanceNorm1D/2D: batch norm's arguments, parameters, buffers and input
    check (``ranks``, ``layout`` set by the subclass), PyTorch's instance-norm defaults and
    forward."""

    ranks: tuple = ()
    layout = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum=0.1,
                 affine: bool = False, track_running_stats: bool = False):
        # NOTE: PyTorch keeps num_batches_tracked (its state dict has the key) but, for
        # instance norm, never counts.
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    @property
    def spatial(self) -> int:
        return self.ranks[0] - 1

    def forward(self, x):
        data = self._check(x)
        unbatched = data.ndim == self.spatial + 1
        if unbatched:
            x = dispatch("reshape", x, shape=(1,) + data.shape)
            data = data[None]
        params = (self.weight, self.bias) if self.affine else ()
        if self.training or not self.track_running_stats:
            positions = data[0].size // self.num_features if len(data) else 2
            if positions < 2:  # PyTorch refuses it too: every output would be the bias
                raise EveryOError(f"{self.label}: normalising by each sample's statistics "
                                  f"needs more than one position per channel, got input "
                                  f"shape {data.shape}")
            if self.training and self.track_running_stats:
                self._update_running_stats(data)
            out = dispatch("group_norm", x, *params, groups=self.num_features, eps=self.eps)
        else:
            out = dispatch("batch_norm", x, *params, running_mean=self.running_mean,
                           running_var=self.running_var, training=False, eps=self.eps)
        return out[0] if unbatched else out

    def _update_running_stats(self, data: np.ndarray) -> None:
        """PyTorch's rule: the batch average of each sample's mean and unbiased variance."""
        momentum = 0.0 if self.momentum is None else float(self.momentum)
        if not momentum or not len(data):
            return
        axes = tuple(range(1, data.ndim - 1))
        mean, _, var = moments(data, axes)
        count = data[0].size // self.num_features
        unbiased = var * (count / (count - 1))
        for buffer, batch in ((self.running_mean, mean), (self.running_var, unbiased)):
            buffer *= 1 - momentum
            average = batch.reshape(len(data), self.num_features).mean(axis=0)
            buffer += (momentum * average).astype(buffer.dtype, copy=False)



class InstanceNorm1D(_InstanceNorm):
    """Instance normalisation of ``(N, L, C)`` (or unbatched ``(L, C)``) input: each sample's
    channels over its ``L`` positions (PyTorch's ``InstanceNorm1d`` on ``(N, C, L)``).

    Args:
        num_features: channels ``C`` (the last axis).
        eps: added to the variance.
        momentum: of the running statistics (None: they stay as they are, as PyTorch).
        affine: learn a per-channel ``weight`` (ones) and ``bias`` (zeros); off by default, as
            PyTorch.
        track_running_stats: keep running statistics and normalise by them in eval mode.

    Example:
        >>> import everyo as eo
        >>> eo.InstanceNorm1D(3)(eo.randn(2, 5, 3, seed=0)).shape
        (2, 5, 3)
    """

    ranks = (2, 3)
    layout = "(N, L, C) or (L, C)"


class InstanceNorm2D(_InstanceNorm):
    """Instance normalisation of NHWC (or unbatched HWC) input: each sample's channels over
    its ``H * W`` pixels (PyTorch's ``InstanceNorm2d``); arguments as :class:`InstanceNorm1D`.

    Example:
        >>> import everyo as eo
        >>> norm = eo.InstanceNorm2D(4, affine=True)
        >>> norm(eo.randn(2, 5, 5, 4, seed=0)).shape, norm.weight.shape
        ((2, 5, 5, 4), (4,))
    """

    ranks = (3, 4)
    layout = "NHWC or HWC"


LAYERS = {"InstanceNorm1D": InstanceNorm1D, "InstanceNorm2D": InstanceNorm2D}
