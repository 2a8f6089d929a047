"""Cost and accuracy of the normalisation statistics accumulated in float64.

For each input (float32, mean far from zero), prints the largest output error against a
float64 computation and the time of the statistics (mean, centered values, variance) with
float32 accumulation (NumPy's plain ``mean``) and with float64 accumulation (what the layers
use, :func:`everyo_layers.norm_stats.moments`), measured alternately in the same run; then the
layers' forward + backward time against PyTorch's (one thread).

    python benchmarks/bench_norm_stats.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from _timing import best_of, ratio_line, torch_or_none
from bench_training import time_interleaved, under_kernels


def float32_moments(x, axes):
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    return mean, centered, np.square(centered).mean(axis=axes, keepdims=True)


def normalized(moments, x, axes):
    _, centered, var = moments(x, axes)
    return centered / np.sqrt(var + 1e-5)


def main() -> None:
    from threadpoolctl import threadpool_limits

    import everyo as eo
    from everyo_layers.norm_stats import moments

    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    cases = [  # label, shape, mean of the input, normalised axes (None: GroupNorm's)
        ("BatchNorm2D (64,8,8,16)", (64, 8, 8, 16), 5.0, (0, 1, 2)),
        ("BatchNorm2D (32,32,32,64)", (32, 32, 32, 64), 5.0, (0, 1, 2)),
        ("LayerNorm (32,4096)", (32, 4096), 100.0, (1,)),
        ("GroupNorm(4) (32,16,16,32)", (32, 16, 16, 32), 5.0, None),
    ]
    with threadpool_limits(limits=1):
        print(f"{'case':<28} {'f32 stats err':>14} {'f64 stats err':>14} "
              f"{'f32 stats':>11} {'f64 stats':>11}")
        for label, shape, mean, axes in cases:
            x = (rng.standard_normal(shape) + mean).astype(np.float32)
            if axes is None:  # group norm: (N, positions, groups, channels per group)
                x = x.reshape(shape[0], -1, 4, shape[-1] // 4)
                axes = (1, 3)
            exact = normalized(float32_moments, x.astype(np.float64), axes)
            err32 = np.abs(normalized(float32_moments, x, axes) - exact).max()
            err64 = np.abs(normalized(moments, x, axes) - exact).max()
            t32 = best_of(lambda x=x, axes=axes: float32_moments(x, axes), repeats=9) * 1e3
            t64 = best_of(lambda x=x, axes=axes: moments(x, axes), repeats=9) * 1e3
            print(f"{label:<28} {err32:14.2e} {err64:14.2e} {t32:8.3f} ms {t64:8.3f} ms")
        if torch is None:
            return
        print("\nforward + backward, EveryO (each kernel provider) vs PyTorch (1 thread), best "
              "of 9 alternating rounds:")
        x = (rng.standard_normal((32, 32, 32, 64)) + 5).astype(np.float32)
        layers = [
            ("BatchNorm2D(64)", eo.BatchNorm2D(64), torch.nn.BatchNorm2d(64), x,
             x.transpose(0, 3, 1, 2).copy()),
            ("GroupNorm(8, 64)", eo.GroupNorm(8, 64), torch.nn.GroupNorm(8, 64), x,
             x.transpose(0, 3, 1, 2).copy()),
            ("LayerNorm(4096)", eo.LayerNorm(4096), torch.nn.LayerNorm(4096),
             (rng.standard_normal((64, 4096)) + 100).astype(np.float32), None),
            ("RMSNorm(4096)", eo.RMSNorm(4096), torch.nn.RMSNorm(4096),
             (rng.standard_normal((64, 4096)) + 100).astype(np.float32), None),
        ]
        providers = ["numpy"] + sorted(eo.registry("kernels").providers())
        for label, ours, ref, data, ref_data in layers:
            ref_data = data if ref_data is None else ref_data
            # NOTE: each side makes its input leaf once and accumulates into its .grad every
            # step (the same work on both sides; a copy per step was EveryO's alone).
            tx = torch.tensor(ref_data, requires_grad=True)
            ex = eo.tensor(data, requires_grad=True)

            def run_ours(layer=ours, x=ex):
                out = layer(x)
                (out * out).mean().backward()

            def run_ref(layer=ref, t=tx):
                out = layer(t)
                (out * out).mean().backward()

            steps = {p: under_kernels(run_ours, p) for p in providers}
            steps["PyTorch"] = run_ref
            best = time_interleaved(steps, warmup=2, repeats=9, block=3)
            for provider in providers:
                print(ratio_line(f"{label} [{provider}]", best[provider], best["PyTorch"], "ms"))


if __name__ == "__main__":
    main()
