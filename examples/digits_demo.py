"""The main job: a CNN on scikit-learn's 8x8 handwritten digits, end to end, in one run.

What it shows, in order:

1. data-parallel training on ``available_workers()`` processes through the ``shm`` backend
   (``spawn`` + ``shard_indices`` + ``average_gradients``);
2. mixed precision inside every worker: ``eo.autocast`` runs the convolutions and the matmul in
   float16, and a ``GradScaler`` given the process group skips overflowing steps on every rank
   at once;
3. a progress bar per epoch (rank 0) with the loss and accuracy over all ranks;
4. held-out accuracy of rank 0's trained weights, which come back to this process as arrays;
5. export to ONNX and verification in ONNX Runtime (largest logit difference, predictions);
6. a summary table, a PNG of the training curves and the ``.onnx`` file in an output folder.

Run it with ``make demo``, or::

    OMP_NUM_THREADS=1 python examples/digits_demo.py [--epochs N] [--workers N]
        [--output DIR] [--no-amp] [--quick]

Needs the ``examples`` extra (scikit-learn, tqdm, matplotlib) and everyo[all].
"""

from __future__ import annotations

import os

# NOTE: one BLAS thread per worker process; must be set before NumPy loads its BLAS, or the
# workers' thread pools fight over the cores (see docs/distributed.md).
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import everyo as eo  # noqa: E402
from everyo.distributed import (  # noqa: E402
    available_workers,
    average_gradients,
    shard_indices,
    spawn,
)

ACCURACY_TARGET = 0.97
ONNX_FILE = "digits_cnn.onnx"
CURVES_FILE = "training_curves.png"


@dataclass(frozen=True)
class Config:
    epochs: int
    workers: int
    amp: bool
    batch_size: int  # global: split evenly over the workers
    lr: float
    seed: int


def build_model() -> eo.Module:
    """The CNN, initialised from fixed seeds: every rank starts from the same weights."""
    return eo.Sequential(
        eo.Conv2D(1, 16, 3, padding="same", seed=0), eo.BatchNorm2D(16), eo.ReLU(),
        eo.MaxPool2D(2),                                          # 8x8 -> 4x4
        eo.Conv2D(16, 32, 3, padding="same", seed=1), eo.BatchNorm2D(32), eo.ReLU(),
        eo.MaxPool2D(2),                                          # 4x4 -> 2x2
        eo.Flatten(),
        eo.Linear(2 * 2 * 32, 10, seed=2),
    )


def load_data(seed: int):
    """Digits as NHWC float32 images, standardised with the training split's statistics."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.float32)[..., None]  # (1797, 8, 8, 1), values 0..16
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype(np.int64), test_size=0.2, stratify=digits.target,
        random_state=seed)
    mean, std = x_train.mean(), x_train.std()
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


# -- what every worker process runs --------------------------------------------------------------
def batch_norm_buffers(model) -> list[np.ndarray]:
    return [buffer for name, buffer in model.named_buffers()
            if name.endswith(("running_mean", "running_var"))]


def count_correct(model, images, labels) -> int:
    """Correct predictions in eval mode and float32, as the exported model will compute."""
    model.eval()
    with eo.no_grad():
        predictions = model(eo.tensor(images)).data.argmax(axis=1)
    model.train()
    return int((predictions == labels).sum())


def train_worker(group, config: Config, x_train, y_train, x_test, y_test):
    """Train one data-parallel replica; rank 0 returns its weights and the history."""
    from tqdm import tqdm

    rank, world = group.rank, group.world_size
    model = build_model()
    optimizer = eo.Adam(model.parameters(), lr=config.lr)
    schedule = eo.CosineAnnealingLR(optimizer, T_max=config.epochs)
    # NOTE: with the group, the overflow check is summed over ranks, so a step is skipped on
    # every rank or on none, and the replicas never drift apart.
    scaler = eo.GradScaler(enabled=config.amp, group=group)
    per_rank = config.batch_size // world
    my_test = shard_indices(len(x_test), rank, world)
    history = {"loss": [], "train_accuracy": [], "test_accuracy": [], "seconds": []}
    skipped = 0

    for epoch in range(config.epochs):
        started = time.perf_counter()
        # Same permutation on every rank (same seed); each rank takes its own equal shard.
        order = np.random.default_rng(config.seed + epoch).permutation(len(x_train))
        mine = order[shard_indices(len(order), rank, world, drop_last=True)]
        steps = len(mine) // per_rank
        totals = np.zeros(3)  # loss * rows, correct, rows (this rank)
        bar = tqdm(total=steps, desc=f"epoch {epoch + 1:>2}/{config.epochs}", unit="step",
                   file=sys.stderr, disable=not group.is_main, leave=True)
        for step in range(steps):
            rows = mine[step * per_rank:(step + 1) * per_rank]
            optimizer.zero_grad()
            with eo.autocast(enabled=config.amp):
                logits = model(eo.tensor(x_train[rows]))
            loss = eo.cross_entropy(logits, y_train[rows])
            scaler.backward(loss)
            average_gradients(model.parameters(), group)
            skipped += not scaler.step(optimizer)
            scaler.update()
            totals += (loss.item() * len(rows),
                       (logits.data.argmax(axis=1) == y_train[rows]).sum(), len(rows))
            # running figures of rank 0's shard; replaced by all ranks' at the end of the epoch
            bar.set_postfix_str(f"loss {totals[0] / totals[2]:.4f}  "
                                f"acc {totals[1] / totals[2]:.2%}", refresh=False)
            bar.update()
        schedule.step()
        # Running statistics are per-rank estimates; averaging them keeps the replicas equal.
        for buffer in batch_norm_buffers(model):
            buffer[...] = group.all_reduce_mean(buffer)
        loss_sum, correct, seen = group.all_reduce_sum(totals)
        test_correct = group.all_reduce_sum(
            np.float64(count_correct(model, x_test[my_test], y_test[my_test])))
        history["loss"].append(float(loss_sum / seen))
        history["train_accuracy"].append(float(correct / seen))
        history["test_accuracy"].append(float(test_correct) / len(x_test))
        history["seconds"].append(time.perf_counter() - started)
        bar.set_postfix_str(f"loss {history['loss'][-1]:.4f}  acc "
                            f"{history['train_accuracy'][-1]:.2%}  held out "
                            f"{history['test_accuracy'][-1]:.2%}")
        bar.close()

    weights = np.concatenate([p.data.ravel() for p in model.parameters()])
    spread = np.ptp(group.all_gather(weights), axis=0).max()  # 0 when every rank agrees
    if not group.is_main:
        return None
    return {"state": dict(model.state_dict()), "history": history, "skipped": skipped,
            "scale": scaler.get_scale(), "rank_spread": float(spread)}


# -- what the parent does with rank 0's result -----------------------------------------------------
def evaluate_and_export(state, x_test, y_test, output: Path) -> dict:
    """Held-out accuracy in float32, then the ONNX export checked in ONNX Runtime."""
    model = build_model()
    model.load_state_dict(state)
    model.eval()
    with eo.no_grad():
        logits = model(eo.tensor(x_test)).data
    path = output / ONNX_FILE
    eo.export_onnx(model, path, input_shape=(1, 8, 8, 1), output_name="logits")
    onnx_logits = eo.run_onnx(path, x_test)
    return {
        "test_accuracy": float((logits.argmax(axis=1) == y_test).mean()),
        "onnx_max_diff": float(np.abs(onnx_logits - logits).max()),
        "onnx_mismatches": int((onnx_logits.argmax(axis=1) != logits.argmax(axis=1)).sum()),
        "parameters": sum(p.data.size for p in model.parameters()),
    }


def plot_curves(history: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    epochs = np.arange(1, len(history["loss"]) + 1)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    left.plot(epochs, history["loss"], marker="o")
    left.set(title="training loss (cross-entropy)", xlabel="epoch", ylabel="loss", yscale="log")
    right.plot(epochs, 100 * np.asarray(history["train_accuracy"]), marker="o",
               label="train (during the epoch)")
    right.plot(epochs, 100 * np.asarray(history["test_accuracy"]), marker="s", label="held out")
    right.axhline(100 * ACCURACY_TARGET, color="gray", linestyle="--", label="target")
    right.set(title="accuracy", xlabel="epoch", ylabel="%")
    right.legend(loc="lower right")
    for axis in (left, right):
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def print_summary(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    print("\nSummary\n" + rule)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(rule)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=None,
                        help="training epochs (default 12, or 4 with --quick)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default: available_workers())")
    parser.add_argument("--output", type=Path, default=Path("demo_output"),
                        help="folder for the PNG and the .onnx file (default ./demo_output)")
    parser.add_argument("--no-amp", dest="amp", action="store_false",
                        help="train in float32 (no autocast, no GradScaler)")
    parser.add_argument("--quick", action="store_true", help="a short run (4 epochs)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.01, help="Adam's initial learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and shuffling")
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = 4 if args.quick else 12
    if args.workers is None:
        args.workers = available_workers()
    if args.epochs < 1 or args.workers < 1 or args.batch_size < args.workers:
        parser.error("--epochs and --workers must be >= 1 and --batch-size >= --workers")
    return args


def missing_extras() -> list[str]:
    """The optional packages of the ``examples`` extra that are not installed."""
    import importlib.util

    return [name for module, name in (("sklearn", "scikit-learn"), ("tqdm", "tqdm"),
                                      ("matplotlib", "matplotlib"))
            if importlib.util.find_spec(module) is None]


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = missing_extras()
    if missing:
        print(f"the demo needs {', '.join(missing)}: pip install 'everyo[all,examples]' "
              f"(or run `make demo`, which installs them)", file=sys.stderr)
        return 2
    output = args.output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    config = Config(args.epochs, args.workers, args.amp, args.batch_size, args.lr, args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    precision = "autocast float16 + GradScaler" if config.amp else "float32"
    print(f"EveryO digits demo: {len(x_train)} training / {len(x_test)} held-out images (8x8), "
          f"{config.workers} worker process{'es' if config.workers > 1 else ''} (shm), "
          f"{precision}, {config.epochs} epochs", flush=True)

    started = time.perf_counter()
    results = spawn(train_worker, config.workers,
                    args=(config, x_train, y_train, x_test, y_test))
    training_seconds = time.perf_counter() - started
    trained = results[0]
    history = trained["history"]

    checks = evaluate_and_export(trained["state"], x_test, y_test, output)
    title = f"EveryO digits CNN: {config.workers} workers, {precision}"
    plot_curves(history, title, output / CURVES_FILE)

    accuracy, mismatches = checks["test_accuracy"], checks["onnx_mismatches"]
    steps = len(history["loss"]) * (len(x_train) // config.workers
                                    // (config.batch_size // config.workers))
    print_summary([
        ("data", f"{len(x_train)} train / {len(x_test)} held-out digits, 8x8x1, standardised"),
        ("model", f"Conv-BN-ReLU-Pool x2 + Linear, {checks['parameters']:,} parameters"),
        ("workers", f"{config.workers} processes, shm backend, global batch {config.batch_size}"),
        ("precision", precision + (f", final loss scale {trained['scale']:g}, "
                                   f"{trained['skipped']} of {steps} steps skipped"
                                   if config.amp else "")),
        ("training time", f"{training_seconds:.1f} s, of which {sum(history['seconds']):.1f} s "
                          f"in {config.epochs} epochs (the rest starts the workers)"),
        ("ranks agree", f"{trained['rank_spread'] == 0.0} (largest weight difference "
                        f"{trained['rank_spread']:.1e})"),
        ("final train loss", f"{history['loss'][-1]:.4f}"),
        ("train accuracy", f"{history['train_accuracy'][-1]:.2%}"),
        ("test accuracy", f"{accuracy:.2%} (target > {ACCURACY_TARGET:.0%}: "
                          f"{'reached' if accuracy > ACCURACY_TARGET else 'MISSED'})"),
        ("ONNX max abs diff", f"{checks['onnx_max_diff']:.2e} (onnxruntime vs everyo logits)"),
        ("ONNX predictions", "all predictions match" if mismatches == 0 else
                             f"{mismatches} of {len(x_test)} predictions DIFFER"),
        ("ONNX model", str(output / ONNX_FILE)),
        ("training curves", str(output / CURVES_FILE)),
    ])
    print(f"Output folder: {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
