"""Why GradScaler exists, measured: float16 gradients underflow, loss scaling rescues them.

A small MLP (10 -> 16 -> tanh -> 1, 193 parameters) fits a noisy regression target. Its loss is
multiplied by 2**-21, which moves every gradient into float16's underflow range without
changing the problem: SGD's learning rate is multiplied by 2**21 to compensate, so in float32
the run is the same as an unscaled one. The same training runs four times:

  * autocast, no scaler  - the float16 gradients flush to zero and the weights barely move;
  * autocast + scaler    - GradScaler lifts them back into range before float16 sees them;
  * bfloat16, no scaler  - ``autocast(dtype="bfloat16")``: float32's exponent range in 16 bits,
                           so nothing flushes and no scaler is needed;
  * float32              - the reference.

It prints how many gradient elements were exactly zero after the first backward pass and the
final mean squared error of each run: what this run measured, nothing copied.

Run:  python examples/mixed_precision.py [--quick] [--steps N]
"""

from __future__ import annotations

import argparse

import numpy as np

import everyo as eo
from everyo_amp import flushed_to_zero

LOSS_FACTOR = 2.0**-21  # pushes dL/dprediction (~1e-2) down to ~5e-9: below float16's ~6e-8
BASE_LR = 0.05


def make_data(samples: int = 256, features: int = 10, seed: int = 0):
    """A smooth nonlinear target with noise (its variance is about 6)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    a = rng.standard_normal(features) * 0.6
    b = rng.standard_normal(features) * 0.6
    y = np.sin(x @ a) + x @ b + 0.2 * rng.standard_normal(samples)
    return eo.tensor(x), eo.tensor(y.astype(np.float32)[:, None])


def make_model() -> eo.Sequential:
    """The same initial weights for every run."""
    return eo.Sequential(eo.Linear(10, 16, seed=1), eo.Tanh(), eo.Linear(16, 1, seed=2))


def train(mode: str, steps: int, x, y):
    """Train one model; ``mode`` is ``"autocast"``, ``"autocast+scaler"``, ``"bfloat16"`` or
    ``"float32"``.

    Returns:
        (ZeroCount after the first backward pass, final MSE, final scale or None).
    """
    model = make_model()
    optimizer = eo.SGD(list(model.parameters()), lr=BASE_LR / LOSS_FACTOR, momentum=0.9)
    scaler = eo.GradScaler() if mode == "autocast+scaler" else None
    first_zeros = None
    for _ in range(steps):
        optimizer.zero_grad()
        with eo.autocast(enabled=mode != "float32",
                         dtype="bfloat16" if mode == "bfloat16" else "float16"):
            predictions = model(x)
        loss = ((predictions - y) ** 2).mean() * LOSS_FACTOR  # float32: 16 bits - float32
        if scaler is not None:
            scaler.backward(loss)
        else:
            loss.backward()
        if first_zeros is None:
            first_zeros = flushed_to_zero(model.parameters())
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    with eo.no_grad():
        mse = ((model(x) - y) ** 2).mean().item()
    return first_zeros, mse, None if scaler is None else scaler.get_scale()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="150 steps instead of 400 (CI)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run")
    args = parser.parse_args(argv)
    steps = args.steps or (150 if args.quick else 400)

    x, y = make_data()
    with eo.no_grad():
        initial = ((make_model()(x) - y) ** 2).mean().item()
    results = {mode: train(mode, steps, x, y)
               for mode in ("autocast", "autocast+scaler", "bfloat16", "float32")}
    (bare_zeros, bare_mse, _), (scaled_zeros, scaled_mse, scale), (_, fp32_mse, _) = (
        results["autocast"], results["autocast+scaler"], results["float32"])
    bf16_zeros, bf16_mse, _ = results["bfloat16"]

    width = len(str(bare_zeros.total))
    print(f"Loss multiplied by 2**-21; MSE before training {initial:.4f}")
    print()
    print(f"Gradient elements flushed to zero ({bare_zeros.total} total)")
    print(f"  no GradScaler ........ {bare_zeros.flushed:>{width}} / {bare_zeros.total}")
    print(f"  with GradScaler ...... {scaled_zeros.flushed:>{width}} / {scaled_zeros.total}")
    print(f"  bfloat16, no scaler .. {bf16_zeros.flushed:>{width}} / {bf16_zeros.total}")
    print()
    print(f"Final MSE after {steps} steps")
    print(f"  autocast, no scaler .. {bare_mse:.4f}")
    print(f"  autocast + scaler .... {scaled_mse:.4f}      float32 reference: {fp32_mse:.4f}")
    print(f"  bfloat16, no scaler .. {bf16_mse:.4f}")
    print()
    print(f"GradScaler's scale at the end: {scale:g}")
    return {"zeros_without_scaler": bare_zeros, "zeros_with_scaler": scaled_zeros,
            "zeros_bfloat16": bf16_zeros, "mse_autocast": bare_mse, "mse_scaler": scaled_mse,
            "mse_bfloat16": bf16_mse, "mse_float32": fp32_mse}


if __name__ == "__main__":
    main()
