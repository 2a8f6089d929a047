"""The optimizers' update kernels, one call per parameter group: SGD (momentum, dampening,
Nesterov, weight decay) and Adam/AdamW (bias correction per parameter, AMSGrad).

The NumPy references below are PyTorch's update rules, one parameter at a time; a kernel
provider may run the whole group in one compiled call. Scalars enter the arithmetic in the
parameters' dtype (NumPy's rule for a Python float meeting a float32 array), so an
implementation that converts them once computes the same products.
"""

from __future__ import annotations

import numpy as np

from everyo.kernel_definitions import Kernel


def sgd_step(weights: list, grads: list, buffers: list, lr: float, momentum: float,
             dampening: float, nesterov: bool, weight_decay: float) -> list:
    """One SGD step for every parameter (``weights[i]`` updated in place from ``grads[i]``);
    ``buffers[i]`` is its momentum buffer, None before its first step. Returns the buffers
    (with momentum, new ones for the None entries; without, as given)."""
    out = []
    for w, g, buf in zip(weights, grads, buffers):
        if weight_decay:
            g = g + weight_decay * w
        if momentum:
            if buf is None:
                buf = np.array(g, dtype=w.dtype, copy=True)
            else:
                buf *= momentum
                buf += (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        w -= (lr * g).astype(w.dtype, copy=False)
        out.append(buf)
    return out


def adam_step(weights: list, grads: list, exp_avgs: list, exp_avg_sqs: list,
              max_exp_avg_sqs: list | None, steps: list, lr: float, beta1: float, beta2: float,
              eps: float, weight_decay: float, decoupled: bool) -> None:
    """One Adam (``decoupled``: AdamW) step for every parameter, in place: ``weights[i]``,
    ``exp_avgs[i]``, ``exp_avg_sqs[i]`` (and ``max_exp_avg_sqs[i]`` with AMSGrad, else None);
    ``steps[i]`` is the parameter's own step count, this one included (bias correction)."""
    for index, (w, g, m, v) in enumerate(zip(weights, grads, exp_avgs, exp_avg_sqs)):
        if weight_decay:
            if decoupled:
                w *= 1 - lr * weight_decay
            else:
                g = g + weight_decay * w
        t = steps[index]
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * (g * g)
        if max_exp_avg_sqs is not None:
            v = np.maximum(max_exp_avg_sqs[index], v, out=max_exp_avg_sqs[index])
        step_size = lr / (1 - beta1 ** t)
        denom = np.sqrt(v) / np.sqrt(1 - beta2 ** t) + eps
        w -= (step_size * m / denom).astype(w.dtype, copy=False)


KERNELS = {
    "sgd_step": Kernel(sgd_step, """
        weights/grads/buffers: equally long lists, one entry per parameter of a group (any
        floating dtypes, shapes per parameter; buffers[i] None before the first momentum step,
        else w's shape and dtype). Overwrites every weight and existing buffer in place;
        returns the buffers: with momentum a new array where the entry was None, without
        momentum the entries as given. PyTorch's rule; scalars in the weights' dtype."""),
    "adam_step": Kernel(adam_step, """
        weights/grads/exp_avgs/exp_avg_sqs (and max_exp_avg_sqs, or None without AMSGrad):
        equally long lists, one entry per parameter of a group, each buffer of its weight's
        shape and dtype; steps: each parameter's step count including this step. Overwrites
        the weights and buffers in place; returns None. PyTorch's rule (bias correction per
        parameter; AdamW decays the weight before the update)."""),
}
